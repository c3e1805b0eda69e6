"""kill -9 in the middle of a burst, restart: nothing lost or altered, every queued box rung right after READY."""

from __future__ import annotations

import pytest

import random
import signal
import socket
import subprocess
import sys
import time

from conftest import HERE, dgram_listener, snapshot, wait_for


def _ready_listener(env):
    path = str(env.root / "notify.sock")
    return dgram_listener(path, timeout=0.02), path


def _wait_ready(s, timeout=15.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if s.recv(4096).startswith(b"READY=1"):
                return time.time()
        except socket.timeout:
            continue
    raise AssertionError("no READY=1")


def _queued_boxes(env, handles):
    from courier import mailbox

    return {h for h in handles if mailbox.list_box(env.mail / h).queued}


@pytest.mark.slow
def test_kill9_mid_burst_then_restart(env, fleet, daemon):
    """5,000 messages across 500 boxes; kill -9 mid-burst; after restart zero mail lost or altered, every box with
    queued mail rung within 1 s of READY=1, and no box rung twice for the same batch."""
    f = fleet(50)
    handles = [f"box-{i:04d}" for i in range(500)]
    for i, h in enumerate(handles):
        pid, sid = f.session_of(i)
        env.claim(h, pid, sid)
    notify, path = _ready_listener(env)
    d = daemon("--min-poke-interval", "0", "--wake-cap", "1000", env_extra={"NOTIFY_SOCKET": path})
    _wait_ready(notify)
    burst = subprocess.Popen([sys.executable, str(HERE / "burst.py"), str(env.mail), "5000", *handles],
                             env=env.vars(), stdout=subprocess.PIPE, text=True)
    time.sleep(0.4)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    assert burst.wait(120) == 0
    before = {h: snapshot(env.mail / h) for h in handles}
    total = sum(len([k for k in b if k.endswith(".json") and k != "owner.json" and "/" not in k]) for b in before.values())
    assert total == 5000
    queued = _queued_boxes(env, handles)
    restart_at = time.time()
    d2 = daemon("--min-poke-interval", "0", "--wake-cap", "1000", wait_ready=False, env_extra={"NOTIFY_SOCKET": path})
    ready_at = _wait_ready(notify)
    wait_for(lambda: {r["box"] for r in f.rings() if r["at"] >= restart_at} >= queued, timeout=10,
             what="every queued box rung after restart")
    after = [r for r in f.rings() if r["at"] >= restart_at]
    last_needed = max(min(r["at"] for r in after if r["box"] == h) for h in queued)
    assert last_needed - ready_at <= 1.0, f"last box rung {last_needed - ready_at:.3f}s after READY"
    counts = {}
    for r in after:
        counts[r["box"]] = counts.get(r["box"], 0) + 1
    time.sleep(0.5)
    assert max(counts.values()) == 1, "one ring per box for the same batch"
    assert {h: snapshot(env.mail / h) for h in handles} == before, "mail byte-for-byte unchanged"
    print(f"restart: {len(queued)} boxes rung within {last_needed - ready_at:.3f}s of READY")


@pytest.mark.slow
def test_twenty_random_kills_during_bursts(env, fleet, daemon):
    """kill -9 at random points during bursts, 20 times: after each restart nothing is lost and every queued box is rung."""
    rng = random.Random(1234)
    f = fleet(10)
    handles = [f"k-{i:03d}" for i in range(100)]
    for i, h in enumerate(handles):
        pid, sid = f.session_of(i)
        env.claim(h, pid, sid)
    written = 0
    for cycle in range(20):
        d = daemon("--min-poke-interval", "0", "--wake-cap", "1000")
        burst = subprocess.Popen([sys.executable, str(HERE / "burst.py"), str(env.mail), "300", *handles],
                                 env=env.vars(), stdout=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.0, 0.6))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        assert burst.wait(60) == 0
        written += 300
        before = {h: snapshot(env.mail / h) for h in handles}
        queued = _queued_boxes(env, handles)
        t = time.time()
        d2 = daemon("--min-poke-interval", "0", "--wake-cap", "1000")
        wait_for(lambda: {r["box"] for r in f.rings() if r["at"] >= t} >= queued, timeout=10,
                 what=f"cycle {cycle}: every queued box rung")
        assert {h: snapshot(env.mail / h) for h in handles} == before
        d2.proc.send_signal(signal.SIGKILL)
        d2.proc.wait()
    from courier import mailbox

    assert sum(len(mailbox.list_box(env.mail / h).queued) for h in handles) == written
