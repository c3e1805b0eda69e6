"""The notify protocol against a real datagram socket: READY after the initial scan, watchdog pets, STOPPING."""

from __future__ import annotations

import os
import signal
import socket
import time

import trio

from courier import sdnotify


def _dgram(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.05)
    return s


def _drain(s, until, want=None):
    got = []
    while time.monotonic() < until:
        try:
            got.append((time.monotonic(), s.recv(4096).decode()))
        except socket.timeout:
            continue
        if want and any(want in m for _, m in got):
            break
    return got


def test_noop_without_notify_socket():
    n = sdnotify.Notifier(env={})
    assert not n.enabled and n.ready() is False and n.watchdog_interval is None


def test_abstract_and_path_addresses(tmp_path):
    s = _dgram(str(tmp_path / "n.sock"))
    n = sdnotify.Notifier(env={"NOTIFY_SOCKET": str(tmp_path / "n.sock")})
    assert n.ready("hi")
    assert s.recv(100) == b"READY=1\nSTATUS=hi"
    a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"courier-test-{os.getpid()}"
    a.bind("\0" + name)
    assert sdnotify.Notifier(env={"NOTIFY_SOCKET": "@" + name}).stopping()
    assert a.recv(100) == b"STOPPING=1"


def test_failure_is_reported_once_never_raised(tmp_path):
    errors = []
    n = sdnotify.Notifier(env={"NOTIFY_SOCKET": str(tmp_path / "absent")}, on_error=lambda w, e: errors.append((w, e)))
    assert n.ready() is False and n.ready() is False
    assert len(errors) == 1


def test_watchdog_interval_honours_pid():
    assert sdnotify.Notifier(env={"NOTIFY_SOCKET": "x", "WATCHDOG_USEC": "1000000"}).watchdog_interval == 0.5
    other = sdnotify.Notifier(env={"NOTIFY_SOCKET": "x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None


def test_daemon_ready_watchdog_stopping(env, daemon, fake_session):
    """READY=1 arrives only after the initial scan; WATCHDOG=1 at half the interval; STOPPING=1 on SIGTERM."""
    path = str(env.root / "notify.sock")
    s = _dgram(path)
    env.claim("early-0001", 4000001, "nobody")  # evaluated (and found unreachable) by the initial scan
    env.drop("early-0001")
    d = daemon(wait_ready=False, env_extra={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    got = _drain(s, time.monotonic() + 10, want="READY=1")
    assert any(m.startswith("READY=1") for _, m in got), got
    # At READY the initial scan had already decided about the queued box.
    assert d.events("session_unreachable", handle="early-0001")
    pets = [t for t, m in _drain(s, time.monotonic() + 2.0) if m == "WATCHDOG=1"]
    assert 7 <= len(pets) <= 13, len(pets)  # every 0.2 s over 2 s
    d.proc.send_signal(signal.SIGTERM)
    got = _drain(s, time.monotonic() + 3, want="STOPPING=1")
    assert any(m == "STOPPING=1" for _, m in got)
    assert d.proc.wait(3) == 0


async def test_stuck_dispatcher_stops_the_pets(tmp_path, monkeypatch):
    """A dispatcher stuck in one box lets the watchdog fire: pets stop."""
    from courier import config, daemon as dmod, log

    path = str(tmp_path / "n.sock")
    s = _dgram(path)
    mail = tmp_path / "m"
    mail.mkdir(mode=0o700)
    (mail / "stuck-1").mkdir()
    cfg = config.Config(mail_root=mail, claude_config_dir=tmp_path / "c", state_dir=tmp_path / "s").validated()
    log.configure("json", "error")
    notifier = sdnotify.Notifier(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    d = dmod.Daemon(cfg, log.get(), notifier=notifier)
    stuck = trio.Event()

    real_evaluate = d.evaluate

    async def evaluate(handle):
        if stuck.is_set():
            await trio.sleep_forever()
        await real_evaluate(handle)

    d.evaluate = evaluate
    async with trio.open_nursery() as n:
        await n.start(d.run)
        await trio.sleep(0.6)
        before = _count(s)
        stuck.set()
        d.mark_dirty("stuck-1")
        await trio.sleep(0.5)  # the last pets may still go out while progress is recent
        _count(s)
        await trio.sleep(0.8)
        after = _count(s)
        n.cancel_scope.cancel()
    assert before >= 3
    assert after == 0


def _count(s):
    n = 0
    while True:
        try:
            if s.recv(100) == b"WATCHDOG=1":
                n += 1
        except (socket.timeout, BlockingIOError):
            return n
