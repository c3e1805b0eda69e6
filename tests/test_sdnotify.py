"""The notify protocol against a real datagram socket: READY after the initial scan, watchdog pets, STOPPING."""

from __future__ import annotations

import os
import signal
import socket
import time

import trio

from courier import sdnotify


from conftest import dgram_listener as _dgram


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


async def test_wedged_loop_stops_the_pets(tmp_path, monkeypatch):
    """A loop wedged inside one box (a blocking call) cannot pet the watchdog, so systemd restarts us;
    a pinger on a thread would keep petting a dead loop."""
    import threading
    import time

    from courier import config, daemon as dmod, log, mailbox

    path = str(tmp_path / "n.sock")
    s = _dgram(path)
    pets: list[float] = []
    done = threading.Event()

    def listen():  # the supervisor's side, timestamping each pet as it arrives
        while not done.is_set():
            try:
                if s.recv(100) == b"WATCHDOG=1":
                    pets.append(time.monotonic())
            except (socket.timeout, BlockingIOError):
                continue

    threading.Thread(target=listen, daemon=True).start()
    mail = tmp_path / "m"
    mail.mkdir(mode=0o700)
    (mail / "stuck-1").mkdir()
    cfg = config.Config(mail_root=mail, claude_config_dir=tmp_path / "c", state_dir=tmp_path / "s").validated()
    log.configure("json", "error")
    notifier = sdnotify.Notifier(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    d = dmod.Daemon(cfg, log.get(), notifier=notifier)
    real = mailbox.list_box
    wedge = {"on": False, "start": 0.0, "end": 0.0}

    def list_box(box):
        if wedge["on"]:
            wedge["on"] = False
            wedge["start"] = time.monotonic()
            time.sleep(1.2)  # blocks the whole trio loop, as a wedged call would
            wedge["end"] = time.monotonic()
        return real(box)

    monkeypatch.setattr(mailbox, "list_box", list_box)
    async with trio.open_nursery() as n:
        await n.start(d.run)
        await trio.sleep(0.6)
        wedge["on"] = True
        d.dispatcher.box_dirty(mail, "stuck-1")
        await trio.sleep(2.0)
        n.cancel_scope.cancel()
    done.set()
    assert wedge["end"] > wedge["start"] > 0, "the wedge happened"
    inside = [t for t in pets if wedge["start"] + 0.05 < t < wedge["end"] - 0.01]
    healthy_before = [t for t in pets if t < wedge["start"]]
    healthy_after = [t for t in pets if t > wedge["end"] + 0.3]
    assert len(healthy_before) >= 3  # every 0.1 s while healthy
    assert inside == [], f"{len(inside)} pets while the loop was wedged"  # a thread would send ~12
    assert len(healthy_after) >= 3, "pets resume when the loop does"


def _count(s):
    n = 0
    while True:
        try:
            if s.recv(100) == b"WATCHDOG=1":
                n += 1
        except (socket.timeout, BlockingIOError):
            return n
