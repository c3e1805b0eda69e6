"""The receipt bookkeeping on its own (no sockets, no daemon): what a receipt line turns into."""

from __future__ import annotations

import json

import structlog
from structlog.testing import capture_logs

from courier.receipts import Note, Receipts, Retry

BOX = ("/mail", "api-3f2a")
PID = 4242


def receipt(msg_id: str, status: str, **extra) -> bytes:
    line = {"type": "control", "action": "peer_message_status", "status": status, "orig_msg_id": msg_id}
    line.update(extra)
    return (json.dumps(line) + "\n").encode()


def book() -> Receipts:
    return Receipts(structlog.get_logger(), retry_after_s=2.0)


def ring(r: Receipts, msg_id: str, number: int, now: float = 100.0) -> None:
    r.track(msg_id, BOX, "api-3f2a", "sess-1", PID, number, now)


def retries(effects) -> list:
    return [e for e in effects if isinstance(e, Retry)]


def test_dropped_is_retried_once_per_batch():
    r = book()
    ring(r, "m1", 1)
    assert [e.at for e in retries(r.on_line(receipt("m1", "dropped"), PID, 100.0))] == [102.0]
    ring(r, "m2", 2)
    assert retries(r.on_line(receipt("m2", "dropped"), PID, 102.0)) == [], "the batch's one retry is spent"
    r.rearmed(BOX)  # the batch was read; the next one has its own retry
    ring(r, "m3", 3)
    assert len(retries(r.on_line(receipt("m3", "dropped"), PID, 110.0))) == 1


def test_a_late_receipt_of_a_read_batch_does_not_spend_the_next_batchs_retry():
    """Found by a full local run (1 in 8 reruns): the retry's `dropped` receipt came back after the mail was read.
    It re-added the box to `retried`, so the next batch's dropped doorbell was never retried."""
    r = book()
    ring(r, "m1", 1)
    r.on_line(receipt("m1", "dropped"), PID, 100.0)
    ring(r, "m2", 2)  # the retry
    r.rearmed(BOX)  # mail read before m2's receipt came back
    with capture_logs() as logs:
        late = r.on_line(receipt("m2", "dropped"), PID, 103.0)
    assert retries(late) == [] and any(isinstance(e, Note) for e in late)
    assert [x["event"] for x in logs] == ["poke_receipt"], "still logged: the operator sees it"
    ring(r, "m3", 3)
    assert len(retries(r.on_line(receipt("m3", "dropped"), PID, 104.0))) == 1


def test_held_blocks_the_session_and_retries_at_once():
    r = book()
    ring(r, "m1", 1)
    with capture_logs() as logs:
        effects = r.on_line(receipt("m1", "held", reason="held for approval"), PID, 100.0)
    assert [e.at for e in retries(effects)] == [100.0]
    assert r.blocked("sess-1", PID, 100.0) == "receipt_held"
    assert [x["event"] for x in logs] == ["poke_receipt", "session_holds_doorbells"]
    ring(r, "m2", 2)
    with capture_logs() as logs:
        r.on_line(receipt("m2", "held"), PID, 101.0)
    assert "session_holds_doorbells" not in [x["event"] for x in logs], "warned once per session"


def test_untracked_and_foreign_receipts_change_nothing():
    r = book()
    ring(r, "m1", 1)
    r.untrack("m1")  # the write failed: nothing reached the session
    with capture_logs() as logs:
        assert r.on_line(receipt("m1", "held"), PID, 100.0) == []
    assert logs[0]["reason"] == "unknown_receipt"
    ring(r, "m2", 2)
    with capture_logs() as logs:
        assert r.on_line(receipt("m2", "held"), PID + 1, 100.0) == []
    assert logs[0]["event"] == "receipt_rejected" and r.blocked("sess-1", PID, 100.0) is None


def test_a_batched_dropped_receipt_answers_every_poke_it_names():
    """Claude sends the first drop per sender at once and batches later ones (after 5 s) into one
    receipt with `dropped_msg_ids`. Each named poke of ours is answered, each box gets its retry."""
    r = book()
    other = ("/mail", "web-77aa")
    ring(r, "m1", 1)
    r.track("m2", other, "web-77aa", "sess-1", PID, 2, 100.0)
    line = receipt("m1", "dropped", drop_reason="rate-limited", dropped_msg_ids=["m1", "m2", "not-ours", 7])
    effects = r.on_line(line, PID, 105.0)
    assert sorted(e.box for e in retries(effects)) == sorted([BOX, other])
    assert r.pending == {}, "both answered"
    assert retries(r.on_line(receipt("x", "held", dropped_msg_ids=["m3"]), PID, 105.0)) == [], \
        "only a dropped receipt names others"
