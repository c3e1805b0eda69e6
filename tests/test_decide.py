"""The per-box decision, table-driven: plain values in, Ring / Hold / Wait and one log event out. No I/O, no sleeping."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from courier import decide, wakecap
from courier.decide import BoxState, Hold, Policy, Ring, Wait
from courier.mailbox import Listing
from courier.resolve import Target, Unreachable

POLICY = Policy(min_interval=2.0, outstanding_limit=600.0, cap=3, half_life=600.0)
NOW, WALL = 1000.0, 1_700_000_000.0
SOCK = "/r/cc-socks/100.sock"


def target(**kw) -> Target:
    base = dict(handle="h-1", pid=100, session_id="S", socket_path=SOCK, version="2.1.328", protocol=1)
    base.update(kw)
    return Target(**base)


@dataclass
class World:
    """What the dispatcher would answer, as plain values."""

    target: Target | Unreachable = field(default_factory=target)
    last: float | None = None
    block: str | None = None
    waiter: bool = False
    lvl: wakecap.Level = wakecap.ZERO
    resolved: int = 0
    seen: set = field(default_factory=set)

    def resolve(self):
        self.resolved += 1
        return self.target

    def last_wake(self, session_id):
        return self.last

    def receipt_block(self, target, now):
        return self.block

    def has_waiter(self, target):
        return self.waiter

    def level(self, recipient, target, wall):
        return self.lvl

    def first_sight(self, session_id, what):
        if (session_id, what) in self.seen:
            return False
        self.seen.add((session_id, what))
        return True


def listing(*names, refused=()):
    return Listing(tuple(names), tuple(refused))


def run(box, lst, world, now=NOW, policy=POLICY):
    import structlog

    with capture_logs() as logs:
        result = decide.decide(box, lst, world, now=now, wall=WALL, policy=policy, log=structlog.get_logger())
    return result, logs


def events(logs):
    """The decision events (mail_seen, a debug note that the queue grew, is left out of the table)."""
    return [(e["event"], e.get("reason")) for e in logs if e["event"] != "mail_seen"]


CASES = [
    # (name, box, listing, world, expected decision type, expected transport/reason, expected events)
    ("no mail", BoxState(), listing(), World(), Wait, None, []),
    ("new mail rings the socket", BoxState(), listing("1.json"), World(), Ring, "socket", []),
    ("unreachable holds for the prompt", BoxState(), listing("1.json"),
     World(target=Unreachable("h-1", "pid_dead", 100, "S")), Hold, "pid_dead", [("session_unreachable", "pid_dead")]),
    ("no socket, no waiter", BoxState(), listing("1.json"), World(target=target(socket_path=None)), Hold, "no_socket",
     [("session_unreachable", "no_socket")]),
    ("no socket, a waiter", BoxState(), listing("1.json"), World(target=target(socket_path=None), waiter=True), Ring,
     "waiter", []),
    ("held receipt, no waiter", BoxState(), listing("1.json"), World(block="receipt_held"), Hold, "receipt_held",
     [("session_unreachable", "receipt_held")]),
    ("held receipt moves to the waiter", BoxState(), listing("1.json"), World(block="receipt_held", waiter=True), Ring,
     "waiter", []),
    ("unknown protocol is not written to", BoxState(), listing("1.json"), World(target=target(protocol=2)), Hold,
     "peer_protocol_unknown", [("peer_protocol_unknown", "peer_protocol_unknown")]),
    ("no protocol field is unknown too", BoxState(), listing("1.json"), World(target=target(protocol=None)), Hold,
     "peer_protocol_unknown", [("peer_protocol_unknown", "peer_protocol_unknown")]),
    ("unknown protocol, a waiter", BoxState(), listing("1.json"), World(target=target(protocol=7), waiter=True), Ring,
     "waiter", [("peer_protocol_unknown", "peer_protocol_unknown")]),
    ("pacing waits for the session's bucket", BoxState(), listing("1.json"), World(last=NOW - 0.5), Wait, NOW + 1.5, []),
    ("capped holds until decay", BoxState(), listing("1.json"), World(lvl=wakecap.Level(3.0, WALL)), Hold,
     "wake_capped", [("wake_capped", None)]),
    ("in flight waits", BoxState(in_flight=True, queued=1), listing("1.json"), World(), Wait, None, []),
    ("outstanding batch waits until the limit",
     BoxState(queued=1, batch=frozenset({"1.json"}), outstanding_since=NOW - 10), listing("1.json", "2.json"), World(),
     Wait, NOW - 10 + 600, [("doorbell_outstanding", None)]),
    ("consumed batch re-arms and rings the new mail",
     BoxState(queued=2, batch=frozenset({"1.json"}), outstanding_since=NOW - 10), listing("2.json"), World(), Ring,
     "socket", [("doorbell_rearmed", None)]),
    ("unanswered past the limit rings once more",
     BoxState(queued=1, batch=frozenset({"1.json"}), outstanding_since=NOW - 601), listing("1.json"), World(), Ring,
     "socket", []),
    ("after the one re-ring it waits for the consume",
     BoxState(queued=1, batch=frozenset({"1.json"}), outstanding_since=NOW - 601, rerung=True), listing("1.json"),
     World(), Wait, None, [("doorbell_outstanding", None)]),
    ("refused entries are logged, never rung", BoxState(), listing(refused=(("pw.json", "symlink"),)), World(), Wait,
     None, [("mail_refused", "not a message to read (a link, a hard link, a FIFO or a directory); not rung, never opened")]),
]


@pytest.mark.parametrize("name,box,lst,world,kind,detail,expected", CASES, ids=[c[0] for c in CASES])
def test_decision_table(name, box, lst, world, kind, detail, expected):
    result, logs = run(box, lst, world)
    assert type(result) is kind, result
    if kind is Ring:
        assert result.transport == detail and result.names == lst.queued and box.in_flight
        assert result.recipient == "session:S"
    elif kind is Hold:
        assert result.reason == detail and box.last_reason == detail
    elif kind is Wait:
        assert result.retry_at == detail
    assert events(logs) == expected


def test_an_unchanged_hold_is_logged_once():
    """The same reason for the same queue is one event, not one per look."""
    box, world = BoxState(), World(target=Unreachable("h-1", "pid_dead"))
    _, first = run(box, listing("1.json"), world)
    _, again = run(box, listing("1.json"), world)
    _, more = run(box, listing("1.json", "2.json"), world)
    assert events(first) == [("session_unreachable", "pid_dead")]
    assert again == []
    assert [e["event"] for e in more] == ["mail_seen", "session_unreachable"]


def test_wake_cap_retry_time_is_when_it_decays():
    box = BoxState()
    result, logs = run(box, listing("1.json"), World(lvl=wakecap.Level(3.0, WALL)))
    # From 3 to 2 takes log2(3/2) half-lives.
    expected = 600.0 * __import__("math").log2(3.0 / (2.0 + wakecap.TOLERANCE))
    assert result.retry_at == pytest.approx(NOW + expected, rel=1e-6)
    capped = [e for e in logs if e["event"] == "wake_capped"]
    assert capped[0]["wake_level"] == 3.0 and capped[0]["cap"] == 3 and capped[0]["allowed_at"]


def test_nothing_is_resolved_while_a_wake_is_outstanding():
    """Resolution is I/O: a box whose batch is outstanding never pays for it."""
    world = World()
    run(BoxState(queued=1, batch=frozenset({"1.json"}), outstanding_since=NOW - 1), listing("1.json"), world)
    assert world.resolved == 0


def test_after_ring_makes_the_batch_outstanding_or_leaves_the_reason():
    box = BoxState()
    ring, _ = run(box, listing("1.json", "2.json"), World())
    decide.after_ring(box, ring, True, None, NOW, ("rung", 5))
    assert box.outstanding_since == NOW and box.batch == {"1.json", "2.json"} and not box.in_flight
    assert box.transport == "socket" and box.last_reason is None
    other = BoxState()
    ring, _ = run(other, listing("1.json"), World())
    decide.after_ring(other, ring, False, "refused", NOW, ("failed", "refused", 1))
    assert other.outstanding_since is None and other.last_reason == "refused" and not other.in_flight


def test_rearm_is_the_one_place_outstanding_is_forgotten():
    box = BoxState(queued=1, batch=frozenset({"1.json"}), outstanding_since=NOW, rerung=True, last_note=("x",))
    decide.rearm(box)
    assert (box.outstanding_since, box.batch, box.rerung, box.last_note) == (None, frozenset(), False, None)


def test_any_protocol_when_the_guard_is_off():
    policy = Policy(min_interval=2.0, outstanding_limit=600.0, cap=3, half_life=600.0, supported_protocols=None)
    result, _ = run(BoxState(), listing("1.json"), World(target=target(protocol=9)), policy=policy)
    assert isinstance(result, Ring) and result.transport == "socket"


def test_an_unknown_protocol_is_said_once_per_session_however_many_boxes():
    """Three boxes of one session on an untested protocol: one warning with the fix; the other boxes' holds
    are debug lines. A second session on it gets its own warning."""
    world = World(target=target(protocol=9, version="2.9.0"))
    said = []
    for _ in range(3):
        result, logs = run(BoxState(), listing("1.json"), world)
        assert isinstance(result, Hold) and result.reason == "peer_protocol_unknown"
        said += [e for e in logs if e["log_level"] != "debug" and e["event"] != "mail_seen"]
    assert [(e["event"], e["log_level"]) for e in said] == [("peer_protocol_unknown", "warning")]
    assert said[0]["protocol"] == 9 and said[0]["version"] == "2.9.0" and said[0]["supported"] == [1]
    assert "not one courier was tested with" in said[0]["fix"] and said[0]["fallback"] == "prompt"
    _, logs = run(BoxState(), listing("1.json"), World(target=target(protocol=9, session_id="T"), seen=world.seen))
    assert [e["event"] for e in logs if e["log_level"] != "debug" and e["event"] != "mail_seen"] == ["peer_protocol_unknown"]
    # the same session resumed under a release with yet another protocol: that is news again
    _, logs = run(BoxState(), listing("1.json"), World(target=target(protocol=10, version="3.0.0"), seen=world.seen))
    assert [e["protocol"] for e in logs if e["event"] == "peer_protocol_unknown"] == [10]


def test_the_waiter_ring_says_why_the_socket_was_skipped():
    result, _ = run(BoxState(), listing("1.json"), World(block="receipt_held", waiter=True))
    assert isinstance(result, Ring) and result.transport == "waiter" and result.socket_skipped == "receipt_held"
    result, _ = run(BoxState(), listing("1.json"), World())
    assert result.transport == "socket" and result.socket_skipped is None
