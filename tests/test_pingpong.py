"""The wake cap through the real daemon: two fake sessions that answer every doorbell by mailing each other.

Time is scaled: a half-life of 2 s stands for the default 10 min (x300), so 12 s of
wall time is a simulated hour (six half-lives). The arithmetic is scale-free.
"""

from __future__ import annotations

import pytest

import json
import math
import time

from courier import mailbox, wakecap
from conftest import wait_for

HALF = 2.0
WINDOW = 12.0  # six half-lives


def _run_pair(env, fake_session, daemon, *daemon_args):
    a = fake_session("sess-ping", pingpong=(str(env.mail), "ping-0001", "pong-0001"))
    b = fake_session("sess-pong", pingpong=(str(env.mail), "pong-0001", "ping-0001"))
    env.claim("ping-0001", a.pid, "sess-ping")
    env.claim("pong-0001", b.pid, "sess-pong")
    d = daemon("--wake-half-life", f"{HALF}s", "--min-poke-interval", "0.05s", *daemon_args)
    env.drop("ping-0001", sender="pong-0001")
    time.sleep(WINDOW)
    a.kill()
    b.kill()
    return d, a, b


@pytest.mark.slow
def test_pingpong_is_bounded_by_cap_plus_decay(env, fake_session, daemon):
    """With the default cap of 3, pokes per recipient over six half-lives stay within the cap plus what decay allows,
    and the mail of the capped exchange stays queued."""
    d, a, b = _run_pair(env, fake_session, daemon)
    pokes = {h: len(d.events("poke_sent", handle=h)) for h in ("ping-0001", "pong-0001")}
    # After reaching the cap, each further poke needs the level to fall from 3 to 2.
    per_poke = HALF * math.log2(3 / 2)
    bound = 3 + math.ceil(WINDOW / per_poke) + 1
    assert all(2 <= n <= bound for n in pokes.values()), (pokes, bound)
    assert d.events("wake_capped")
    queued = sum(len(mailbox.list_box(env.mail / h).queued) for h in pokes)
    assert queued >= 1, "capped mail is held, not eaten"
    # Nothing lost: one first message, plus one answer per doorbell a session received (each
    # of the two sessions may have been killed between receiving its last line and answering it).
    received = len(a.lines()) + len(b.lines())
    total_files = sum(len(mailbox.list_box(env.mail / h).queued) + len(list((env.mail / h / "read").iterdir()))
                      for h in pokes)
    assert received - 1 <= total_files <= received + 1, (total_files, received)


@pytest.mark.slow
def test_without_the_cap_it_burns(env, fake_session, daemon):
    """The same loop with the brake released runs far past the bound: the cap is what stops it."""
    d, _a, _b = _run_pair(env, fake_session, daemon, "--wake-cap", "1000")
    pokes = sum(len(d.events("poke_sent", handle=h)) for h in ("ping-0001", "pong-0001"))
    assert pokes > 60, pokes


def _ring_and_deliver(env, fs, box, d, times: int) -> None:
    """Drop, wait for the ring, deliver the box as its hook would, wait for the re-arm; `times` times."""
    for i in range(times):
        env.drop(box.name)
        wait_for(lambda: len(fs.lines()) == i + 1, what=f"ring {i + 1}")
        for name in mailbox.list_box(box).queued:
            mailbox.consume(box, name)
        d.wait_event("doorbell_rearmed", count=i + 1, handle=box.name)


def test_operator_turn_lets_a_capped_box_ring_again(env, fake_session, daemon, barrier):
    """Capped: new mail waits. After an operator turn (what the prompt hook records) the next mail rings at once."""
    fs = fake_session("sess-op")
    box = env.claim("op-0001", fs.pid, "sess-op")
    d = daemon("--wake-half-life", "1h", "--min-poke-interval", "0.05s")
    _ring_and_deliver(env, fs, box, d, times=3)
    env.drop("op-0001")
    capped = d.wait_event("wake_capped", handle="op-0001")
    assert capped[0]["wake_level"] > 2 and capped[0]["allowed_at"]
    barrier(d)
    assert len(fs.lines()) == 3
    wakecap.record_operator_turn(env.state, "op-0001")
    for name in mailbox.list_box(box).queued:
        mailbox.consume(box, name)  # the operator's prompt delivered what waited
    env.drop("op-0001")
    wait_for(lambda: len(fs.lines()) == 4, what="ring after the operator turn")


def test_level_survives_restart_and_corrupt_state_is_conservative(env, fake_session, daemon):
    fs = fake_session("sess-rs")
    box = env.claim("rs-0001", fs.pid, "sess-rs")
    d = daemon("--wake-half-life", "1h", "--min-poke-interval", "0.05s")
    _ring_and_deliver(env, fs, box, d, times=3)
    assert d.stop() == 0
    state = json.loads((env.state / "wakecap.json").read_text())
    assert state["recipients"]["session:sess-rs"]["level"] > 2.9
    d2 = daemon("--wake-half-life", "1h")
    env.drop("rs-0001")
    d2.wait_event("wake_capped", handle="rs-0001")
    assert len(fs.lines()) == 3
    assert d2.stop() == 0
    # Corrupt the state: everyone starts at the cap.
    (env.state / "wakecap.json").write_text("{garbage")
    fs2 = fake_session("sess-new")
    env.claim("new-0001", fs2.pid, "sess-new")
    d3 = daemon("--wake-half-life", "1h")
    d3.wait_event("state_corrupt")
    env.drop("new-0001")
    d3.wait_event("wake_capped", handle="new-0001")
    assert fs2.lines() == []
