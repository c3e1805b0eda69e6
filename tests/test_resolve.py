"""Pure resolution decisions: plain values in, Target or Unreachable(reason) out. No I/O, no sleeping."""

from courier.mailbox import parse_owner
from courier.registry import Record
from courier.resolve import Target, Unreachable, resolve

DOM = "linux:m:pid:[1]"


def owner(**kw):
    data = {"handle": "h-1", "runtime": "claude", "pid": 100, "sessionId": "S"}
    data.update(kw)
    return parse_owner(data)


def rec(pid=100, sid="S", start="555", sock="/r/cc-socks/100.sock", **kw):
    base = dict(
        pid=pid, session_id=sid, proc_start=start, pid_domain=DOM, socket_path=sock, status="idle",
        spare=False, parked=False, version="2.1.328", kind="interactive", started_at=1.0,
    )
    base.update(kw)
    return Record(**base)


def test_live_owner_resolves_to_its_socket():
    r = resolve("h-1", owner(), [rec()], {100: "555"}, DOM)
    assert r == Target("h-1", 100, "S", "/r/cc-socks/100.sock", version="2.1.328")


def test_reasons():
    cases = [
        ("owner_malformed_json", "owner_malformed_json", [], {}),
        (owner(retiredAt=5), "retired", [rec()], {100: "555"}),
        (owner(runtime="pi"), "runtime_not_claude", [rec()], {100: "555"}),
        (owner(sessionId=None), "owner_incomplete", [rec()], {100: "555"}),
        (owner(runtime=None), "owner_incomplete", [rec()], {100: "555"}),
        (owner(), "no_record", [], {}),
        (owner(), "pid_dead", [rec()], {100: None}),
        (owner(), "pid_reused", [rec()], {100: "556"}),
        (owner(), "session_replaced", [rec(sid="OTHER")], {100: "555"}),
        (owner(), "spare", [rec(spare=True)], {100: "555"}),
        (owner(), "parked", [rec(parked=True)], {100: "555"}),
        (owner(), "foreign_pid_domain", [rec(pid_domain="linux:other:x")], {100: "555"}),
    ]
    for own, reason, records, live in cases:
        r = resolve("h-1", own, records, live, DOM)
        assert isinstance(r, Unreachable), (reason, r)
        assert r.reason == reason


def test_dead_pid_with_another_session_is_not_replaced_but_no_record():
    """A different session at a dead pid says nothing about ours: no_record, not session_replaced."""
    r = resolve("h-1", owner(), [rec(sid="OTHER")], {100: None}, DOM)
    assert r.reason == "no_record"


def test_restarted_session_under_new_pid_is_found():
    r = resolve("h-1", owner(), [rec(pid=200, start="9", sock="/r/cc-socks/200.sock")], {200: "9"}, DOM)
    assert isinstance(r, Target) and r.pid == 200


def test_two_live_records_prefer_owner_pid_then_newest():
    a = rec(pid=100, started_at=1.0)
    b = rec(pid=200, sock="/r/cc-socks/200.sock", started_at=5.0, start="9")
    assert resolve("h-1", owner(), [b, a], {100: "555", 200: "9"}, DOM).pid == 100
    assert resolve("h-1", owner(pid=300), [a, b], {100: "555", 200: "9"}, DOM).pid == 200


def test_dead_owner_record_but_live_other_record_of_same_session():
    a = rec(pid=100)
    b = rec(pid=200, sock="/r/cc-socks/200.sock", start="9")
    r = resolve("h-1", owner(), [a, b], {100: None, 200: "9"}, DOM)
    assert isinstance(r, Target) and r.pid == 200


def test_live_session_without_socket_is_a_target_without_one():
    """No messaging socket: still the owner's live session (its waiter may wake it); the transport decides."""
    r = resolve("h-1", owner(), [rec(sock=None)], {100: "555"}, DOM)
    assert isinstance(r, Target) and r.socket_path is None


def test_record_without_proc_start_is_live_by_pid_with_weak_evidence():
    """helm reads records without procStart; courier judges them by the pid and says the evidence is weaker."""
    r = resolve("h-1", owner(), [rec(start=None)], {100: "555"}, DOM)
    assert isinstance(r, Target) and r.weak
    assert resolve("h-1", owner(), [rec(start=None)], {100: None}, DOM).reason == "pid_dead"
