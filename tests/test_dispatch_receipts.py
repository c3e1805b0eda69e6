"""The dispatcher applying receipts, in one process: which wake a receipt is about, and when.

Real box directories and mail files; the session is a resolved Target and the ringer records
what it would have sent (the sockets and the receipts' wire form are tested in test_receipts.py
with a fake session process). Each test drives one ordering that a failing run found."""

from __future__ import annotations

import json

import pytest
import structlog
import trio

from courier import dispatch, mailbox
from courier.decide import Policy
from courier.dispatch import BoxId, Dispatcher
from courier.receipts import Receipts
from courier.resolve import Target
from courier.ring import Outcome
from courier.state import StateStore

HANDLE = "api-3f2a"
PID = 4242
SID = "3c1e9a52-7d41-4b8e-9f0a-5d2c6b7e8f01"


def receipt(msg_id: str, status: str) -> bytes:
    return (json.dumps({"type": "control", "action": "peer_message_status", "status": status,
                        "orig_msg_id": msg_id}) + "\n").encode()


class Ringer:
    """Records each ring as Ringer.ring would (tracks its msg_id before the write, counts the wake)."""

    def __init__(self, receipts: Receipts, store: StateStore):
        self.receipts, self.store = receipts, store
        self.stats = {"pokes": 0, "fallbacks": 0, "capped": 0}
        self.ids: list[str] = []
        self.during = None  # called mid-ring, as a receipt that outruns the poke would be
        self.fail = False

    async def ring(self, box_id, decision, log):
        number = len(self.ids) + 1
        msg_id = f"m{number}"
        self.ids.append(msg_id)
        self.receipts.track(msg_id, box_id, HANDLE, SID, PID, number, trio.current_time())
        if self.during:
            self.during(msg_id)
            await trio.sleep(0)
        if self.fail:
            raise RuntimeError("the ring broke after the write")
        self.store.woke(decision.recipient, HANDLE, decision.level, 0.0)
        return Outcome(True, None, number)


@pytest.fixture
async def world(tmp_path, monkeypatch, nursery):
    root = tmp_path / "mail"
    root.mkdir(mode=0o700)
    (tmp_path / "state").mkdir(mode=0o700)
    mailbox.ensure_box(str(root), HANDLE)
    target = Target(HANDLE, PID, SID, str(tmp_path / "s.sock"), "2.1.328", 1)
    monkeypatch.setattr(dispatch, "resolve_box", lambda *a, **k: (None, target))
    log = structlog.get_logger()
    receipts = Receipts(log, retry_after_s=2.0)
    store = StateStore(tmp_path / "state", log, cap=100, half_life=600.0)
    ringer = Ringer(receipts, store)
    policy = Policy(min_interval=0.0, outstanding_limit=600.0, cap=100, half_life=600.0, supported_protocols=None)
    d = Dispatcher([root], tmp_path / "registry", store, ringer, log, policy, receipts=receipts)
    d.poke_nursery = nursery  # pytest-trio cancels it after the test
    return d, BoxId(root, HANDLE), ringer, receipts


async def look(d, box_id):
    await d.look(box_id)
    await trio.sleep(0.01)  # the ring runs in the poke nursery


def answer(d, receipts, msg_id: str, status: str) -> None:
    """The session's receipt for `msg_id` reaches the daemon (as receipt_server hands it on)."""
    d.apply(receipts.on_line(receipt(msg_id, status), PID, trio.current_time()))


def drop(box_id):
    mailbox.drop_message(box_id.root, HANDLE, sender="x", subject="s", body="b")


def read_all(box_id):
    box = mailbox.box_dir(box_id.root, HANDLE)
    for name in mailbox.list_box(str(box)).queued:
        mailbox.consume(str(box), name)


async def test_a_batch_read_after_a_retry_rearmed_it_leaves_the_next_batch_its_retry(world):
    d, box_id, ringer, receipts = world
    drop(box_id)
    await look(d, box_id)
    answer(d, receipts, "m1", "dropped")  # re-armed, retry in 2 s
    assert d.boxes[box_id].outstanding_since is None
    read_all(box_id)  # the person's prompt read it before the retry rang
    await look(d, box_id)
    drop(box_id)
    await look(d, box_id)
    assert ringer.ids == ["m1", "m2"]
    effects = receipts.on_line(receipt("m2", "dropped"), PID, trio.current_time())
    assert any(type(e).__name__ == "Retry" for e in effects), "the new batch has its own retry"


async def test_a_receipt_about_an_earlier_ring_leaves_the_outstanding_wake_alone(world):
    d, box_id, ringer, receipts = world
    drop(box_id)
    await look(d, box_id)
    read_all(box_id)
    await look(d, box_id)  # re-armed: batch one was read
    drop(box_id)
    await look(d, box_id)  # ring two is outstanding
    since = d.boxes[box_id].outstanding_since
    level = d.store.table.levels[d.boxes[box_id].recipient].value
    answer(d, receipts, "m1", "held")
    box = d.boxes[box_id]
    assert box.outstanding_since == since and box.ring == 2, "ring two is still the outstanding wake"
    assert d.store.table.levels[box.recipient].value == level, "no refund for a wake that did happen"
    assert box.last_receipt["status"] == "held", "the session's answer is still shown"


async def test_a_receipt_that_lands_mid_ring_is_applied_after_it(world):
    d, box_id, ringer, receipts = world
    ringer.during = lambda msg_id: answer(d, receipts, msg_id, "held")
    drop(box_id)
    await look(d, box_id)
    box = d.boxes[box_id]
    assert box.outstanding_since is None, "the held doorbell re-armed the wake it rang"
    assert box.last_receipt["status"] == "held" and not d.early
    assert d.store.table.levels[box.recipient].value < 0.5, "and took the wake back"


async def test_a_receipt_that_lands_in_a_ring_that_then_breaks_is_still_shown(world):
    d, box_id, ringer, receipts = world
    ringer.during = lambda msg_id: answer(d, receipts, msg_id, "held")
    ringer.fail = True
    drop(box_id)
    await look(d, box_id)
    box = d.boxes[box_id]
    assert box.failures == 1 and not box.in_flight and not d.early
    assert box.last_receipt["status"] == "held"


async def test_a_look_that_fails_mid_ring_does_not_end_the_ring_early(world, monkeypatch):
    """A look of a box whose ring is running raises (crash-only isolation catches it). The ring is
    still running: a receipt that lands after that must still wait for the ring to be recorded."""
    d, box_id, ringer, receipts = world
    real = dispatch.decide.decide

    def broken(*a, **k):
        raise OSError("the listing broke")

    async def fail_a_look_then_hold(msg_id):
        monkeypatch.setattr(dispatch.decide, "decide", broken)
        await d.look(box_id)
        monkeypatch.setattr(dispatch.decide, "decide", real)
        answer(d, receipts, msg_id, "held")

    class Ringing(Ringer):
        async def ring(self, box_id, decision, log):
            number = len(self.ids) + 1
            self.ids.append(f"m{number}")
            self.receipts.track(f"m{number}", box_id, HANDLE, SID, PID, number, trio.current_time())
            await fail_a_look_then_hold(f"m{number}")
            self.store.woke(decision.recipient, HANDLE, decision.level, 0.0)
            return Outcome(True, None, number)

    d.ringer = Ringing(receipts, d.store)
    drop(box_id)
    await look(d, box_id)
    box = d.boxes[box_id]
    assert box.failures == 1, "the failing look was isolated"
    assert box.outstanding_since is None and box.last_receipt["status"] == "held", "the held receipt re-armed"
