"""Regression tests for issue #12's findings: each one stopped the daemon, followed a link, or let a peer flood it.

Every test here failed on the main branch the issue was measured on; each docstring says what it did then.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import wait_for


def courier(env, *args, input=None, extra=None):
    e = env.vars()
    e.update(extra or {})
    return subprocess.run([sys.executable, "-m", "courier", *args], env=e, capture_output=True, text=True,
                          input=input, timeout=60)


def hook(env, verb, payload, extra=None):
    e = env.vars()
    e.update(extra or {})
    return subprocess.run([sys.executable, "-m", "courier", "hook", verb], input=json.dumps(payload).encode(),
                          env=e, capture_output=True, timeout=60)


def listener_of(env, d):
    return str(env.socks / f"courier-{d.proc.pid}.sock")


# ---------------------------------------------------------------- the receipts listener


def test_a_flooding_peer_costs_a_bounded_log_and_no_latency(env, fake_session, daemon):
    """Was: one connection sending `1\\n` for 5 s wrote 286,721 peer_reply_ignored lines (34 MB) and slowed
    another box's ring to 0.39 s. Now: a log budget, one summary event, and the other box rings at once."""
    fs = fake_session("sess-fl")
    env.claim("fl-0001", fs.pid, "sess-fl")
    other = fake_session("sess-other")
    env.claim("other-0001", other.pid, "sess-other")
    d = daemon()
    env.drop("fl-0001")
    wait_for(fs.lines)
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(listener_of(env, d))
                    end = time.monotonic() + 1.0
                    while time.monotonic() < end and not stop.is_set():
                        s.sendall(b"1\n" * 512)
            except OSError:
                time.sleep(0.01)

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    env.drop("other-0001")
    wait_for(other.lines, what="the other box rung during the flood")
    ring_s = time.monotonic() - t0
    time.sleep(1.0)
    stop.set()
    t.join(5)
    ignored = d.events("peer_reply_ignored")
    assert len(ignored) <= 40, len(ignored)  # the log budget, not one line per line
    assert d.events("peer_flood_suppressed")
    assert ring_s < 0.5, ring_s
    assert os.path.getsize(d.log_path) < 200_000
    assert d.proc.poll() is None


def test_idle_connections_cannot_keep_a_real_receipt_out(env, fake_session, daemon):
    """Was: 16 idle connections, renewed every 5 s, filled the cap so a real `held` receipt was never logged.
    Now the oldest connection is evicted when the cap is reached."""
    first = fake_session("sess-first")
    env.claim("first-0001", first.pid, "sess-first")
    held = fake_session("sess-holds", receipt="held")
    env.claim("holds-0001", held.pid, "sess-holds")
    d = daemon()
    env.drop("first-0001")  # binds the listener in the socket directory
    wait_for(first.lines)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def hog():
        while not stop.is_set():
            for s in conns:
                s.close()
            conns.clear()
            for _ in range(20):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(listener_of(env, d))
                except OSError:
                    pass
                conns.append(s)
            time.sleep(0.3)

    t = threading.Thread(target=hog, daemon=True)
    t.start()
    time.sleep(0.5)
    env.drop("holds-0001")
    d.wait_event("poke_receipt", handle="holds-0001", status="held", timeout=10)
    stop.set()
    t.join(5)
    for s in conns:
        s.close()


def test_peer_strings_are_escaped_in_the_log_and_in_courier_log(env, fake_session, daemon):
    """Was: raw ESC/OSC bytes from a peer reached `courier log` and console output."""
    fs = fake_session("sess-esc")
    env.claim("esc-0001", fs.pid, "sess-esc")
    d = daemon()
    env.drop("esc-0001")
    wait_for(fs.lines)
    evil = "\x1b]0;pwned\x07\x1b[2J"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(listener_of(env, d))
        s.sendall(json.dumps({"type": evil, "status": evil}).encode() + b"\n")
    ev = d.wait_event("peer_reply_ignored")
    raw = d.log_path.read_text()
    assert "\x1b" not in raw and "\\u001b" not in raw, "escaped before logging, not only by the JSON encoder"
    assert "\\x1b" in ev[-1]["kind"]
    shown = courier(env, "log", str(d.log_path))
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    forged = env.root / "forged.log"
    forged.write_text(json.dumps({"ts": "x", "level": "info", "event": "e\x1b[31m", "handle": "h\x1b]0;x\x07",
                                  "reason": "\x1b[2J"}) + "\n")
    shown = courier(env, "log", str(forged))
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\x07" not in shown.stdout


# ---------------------------------------------------------------- the wake cap


def test_twenty_boxes_naming_one_session_share_one_wake_cap(env, fake_session, daemon):
    """Was: 20 boxes whose owner.json named one session got 7 doorbells in 12.5 s and no wake_capped.
    Now the level is per recipient session, across its boxes."""
    fs = fake_session("sess-many")
    for i in range(20):
        env.claim(f"many-{i:04d}", fs.pid, "sess-many")
    d = daemon("--min-poke-interval", "0.05s")
    for i in range(20):
        env.drop(f"many-{i:04d}")
    d.wait_event("wake_capped", timeout=10)
    time.sleep(1.0)
    assert len(fs.lines()) == 3, len(fs.lines())
    assert len(d.events("poke_sent")) == 3


# ---------------------------------------------------------------- links


def test_deliver_never_follows_a_symlinked_read_dir(env):
    """Was: with box/read -> /some/dir, a message named settings.json was linked into /some/dir and the notice
    pointed there. Now the box is reported damaged, its mail shown in place, nothing moved."""
    hook(env, "claim", {"session_id": "s-rl", "cwd": "/x", "source": "startup"}, {"HELM_MAIL_HANDLE": "rl"})
    box = env.mail / "rl"
    elsewhere = env.root / "elsewhere"
    elsewhere.mkdir()
    (box / "read").rmdir()
    os.symlink(elsewhere, box / "read")
    msg = box / "settings.json"
    msg.write_text(json.dumps({"from": "x", "subject": "plant", "body": "{}"}))
    p = hook(env, "deliver", {"session_id": "s-rl", "prompt": "hi"}, {"HELM_MAIL_HANDLE": "rl"})
    out = p.stdout.decode()
    assert p.returncode == 0 and "damaged" in out and "plant" in out and "Fix:" in out
    assert os.listdir(elsewhere) == [] and msg.exists()
    log = [json.loads(line) for line in (env.state / "hooks.log").read_text().splitlines()]
    assert any(r["event"] == "hook_box_damaged" and r["reason"] == "read_is_symlink" for r in log)


def test_a_read_dir_that_is_a_file_is_reported_not_looped_on(env, fake_session, daemon):
    """Was: a read/ that is a regular file made the notice repeat forever with nothing consumed and no reason.
    Now hook and daemon say box_damaged with the fix; the mail is shown, never consumed, never lost."""
    fs = fake_session("s-rf")
    box = env.claim("rf-0001", fs.pid, "s-rf")
    (box / "read").rmdir()
    (box / "read").write_text("not a directory")
    d = daemon()
    env.drop("rf-0001", subject="kept")
    ev = d.wait_event("box_damaged", handle="rf-0001")
    assert ev[0]["reason"] == "read_not_directory" and "read/" in ev[0]["fix"]
    p = hook(env, "deliver", {"session_id": "s-rf", "prompt": "x"})
    assert b"kept" in p.stdout and b"damaged" in p.stdout
    assert len([n for n in os.listdir(box) if n.endswith(".json") and n != "owner.json"]) == 1


def test_claim_with_a_pinned_handle_never_writes_through_a_symlinked_box(env):
    """Was: claim with HELM_MAIL_HANDLE wrote owner.json and read/ through a symlinked box."""
    target = env.root / "target"
    target.mkdir()
    os.symlink(target, env.mail / "pinned")
    p = hook(env, "claim", {"session_id": "s-pin", "cwd": "/x", "source": "startup"}, {"HELM_MAIL_HANDLE": "pinned"})
    assert p.returncode == 0
    assert os.listdir(target) == []
    assert os.path.islink(env.mail / "pinned")


def test_a_hard_linked_message_is_refused_unread(env):
    """Was: a hard link to another file dropped as a message was shown and the model asked to read it."""
    hook(env, "claim", {"session_id": "s-hl", "cwd": "/x", "source": "startup"}, {"HELM_MAIL_HANDLE": "hl"})
    private = env.root / "private.json"
    private.write_text(json.dumps({"from": "PRIVATE-FROM", "subject": "PRIVATE-SUBJECT"}))
    os.link(private, env.mail / "hl" / "1-aaaaaa.json")
    p = hook(env, "deliver", {"session_id": "s-hl", "prompt": "x"}, {"HELM_MAIL_HANDLE": "hl"})
    out = p.stdout.decode()
    assert "a hard link to another file; not read" in out
    assert "PRIVATE" not in out and "Read the file" not in out


def test_the_lock_never_follows_a_symlink(env):
    """Was: lockfile followed a symlink and truncated its target."""
    env.state.mkdir(parents=True)
    victim = env.root / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, env.state / "courier.lock")
    p = courier(env, "run")
    assert p.returncode == 4 and "state dir" in p.stderr
    assert victim.read_text() == "precious"


def test_a_socket_path_through_a_symlink_loop_is_a_fallback(env, fake_session, daemon):
    """Was: ELOOP (socket path swapped for a self-referencing symlink) was re-raised and killed the daemon."""
    fs = fake_session("sess-loop")
    rec_path = env.registry / f"{fs.pid}.json"
    rec = json.loads(rec_path.read_text())
    loop = env.root / "loopdir"
    os.symlink(loop, loop)  # a self-referencing symlink
    rec["messagingSocketPath"] = f"{loop}/{fs.pid}.sock"
    rec_path.write_text(json.dumps(rec))
    env.claim("loop-0001", fs.pid, "sess-loop")
    d = daemon()
    env.drop("loop-0001")
    ev = d.wait_event("poke_failed", handle="loop-0001")
    assert ev[0]["reason"] and ev[0]["fallback"] == "prompt"
    time.sleep(0.3)
    assert d.proc.poll() is None


def test_out_of_descriptors_is_a_fallback_not_a_crash(env, fake_session, daemon):
    """Was: EMFILE (many sessions in distinct directories, a low `ulimit -n`) killed the daemon: receipt listeners
    were created before vetting, one per directory, never closed, with socket() outside the try."""
    sessions = []
    for i in range(24):
        d_ = env.root / f"s{i}"
        d_.mkdir(mode=0o700)
        fs = fake_session(f"sess-fd{i}", socket_dir=d_)
        env.claim(f"fd-{i:04d}", fs.pid, f"sess-fd{i}")
        sessions.append(fs)

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))  # ~13 in use at rest

    import conftest

    log_path = env.root / "lowfd.log"
    with open(log_path, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "courier", "run", "--min-poke-interval", "0"],
                                env=env.vars(), stdout=fh, stderr=fh, preexec_fn=low_limit)
    d = conftest.Daemon(proc, log_path)
    try:
        d.wait_event("daemon_ready", timeout=15)
        for i in range(24):
            env.drop(f"fd-{i:04d}")
        try:
            wait_for(lambda: len(d.events("poke_sent")) + len(d.events("poke_failed")) >= 24, timeout=15,
                     what="every box rung or fallen back")
        except AssertionError:
            raise AssertionError(log_path.read_text()[-4000:]) from None
        time.sleep(0.5)
        assert proc.poll() is None, log_path.read_text()[-2000:]
        assert len(d.events("poke_sent")) >= 1
    finally:
        d.stop()


# ---------------------------------------------------------------- settings files


def test_hooks_install_writes_through_a_symlinked_settings_file(env):
    """Was: `hooks install` replaced a symlinked settings.json with a regular file."""
    real = env.root / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text(json.dumps({"model": "x"}))
    link = env.claude / "settings.json"
    os.symlink(real, link)
    p = courier(env, "hooks", "install")
    assert p.returncode == 0, p.stderr
    assert os.path.islink(link) and os.readlink(link) == str(real)
    data = json.loads(real.read_text())
    assert data["model"] == "x" and "SessionStart" in data["hooks"]


@pytest.mark.parametrize("content", ['{"n": 1e999}', '{"n": NaN}', '{"n": ' + "9" * 400 + "}"])
def test_settings_that_cannot_round_trip_are_refused_unchanged(env, content):
    """Was: `hooks install` rewrote 1e999 as Infinity, which is not JSON: Claude Code then rejected the whole file."""
    settings = env.claude / "settings.json"
    settings.write_text(content)
    p = courier(env, "hooks", "install")
    assert p.returncode == 1 and "nothing was changed" in p.stderr
    assert settings.read_text() == content


def test_looking_at_boxes_leaks_no_descriptors(env, fake_session, daemon):
    """Found while testing the above: every look leaked the directory descriptor handed to scandir. After a
    hundred rings and re-arms the daemon holds the descriptors it held before them."""
    from courier import mailbox

    fs = fake_session("sess-leak")
    box = env.claim("leak-0001", fs.pid, "sess-leak")
    d = daemon("--min-poke-interval", "0", "--wake-cap", "1000")
    env.drop("leak-0001")
    wait_for(fs.lines)

    def fds():
        return len(os.listdir(f"/proc/{d.proc.pid}/fd"))

    for name in mailbox.list_box(box).queued:
        mailbox.consume(box, name)
    d.wait_event("doorbell_rearmed", handle="leak-0001")
    before = fds()
    for i in range(100):
        env.drop("leak-0001")
        wait_for(lambda n=i + 2: len(fs.lines()) >= n, what=f"ring {i + 2}")
        for name in mailbox.list_box(box).queued:
            mailbox.consume(box, name)
        d.wait_event("doorbell_rearmed", handle="leak-0001", count=i + 2)
    time.sleep(0.2)
    assert fds() <= before + 2, (before, fds())


def test_a_peer_opening_a_connection_per_line_gets_one_summary_not_one_per_connection(env, fake_session, daemon):
    """Found by the soak benchmark: the flood summary was written once per connection, outside the peer's budget."""
    fs = fake_session("sess-conn")
    env.claim("conn-0001", fs.pid, "sess-conn")
    d = daemon()
    env.drop("conn-0001")
    wait_for(fs.lines)
    end = time.monotonic() + 3.0
    sent = 0
    while time.monotonic() < end:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(listener_of(env, d))
                s.sendall(b"1\n")
            sent += 1
        except OSError:
            time.sleep(0.005)
    time.sleep(0.5)
    assert sent > 200
    assert len(d.events("peer_flood_suppressed")) <= 1
    assert len(d.events("peer_reply_ignored")) <= 40
    assert os.path.getsize(d.log_path) < 50_000


@pytest.mark.parametrize("name", ["api-1\n", "0190abcd\n", "12.json\n", "12.sock\n", "courier-12.sock\n"])
def test_a_trailing_newline_never_passes_a_name_check(name):
    """`re.match(r"^...$")` accepts "x\n" (`$` matches before a final newline): a directory, record, socket
    or session id ending in a newline passed every name check until they matched whole."""
    from courier import mailbox, receipt_server, registry, wakecap

    assert not mailbox.valid_handle(name)
    assert not wakecap.valid_session_id(name)
    assert not wakecap.valid_key("session:" + name) and not wakecap.valid_key("box:" + name)
    assert wakecap.operator_turn_names(name, name) == []
    assert registry.pid_of_record_name(name) is None
    assert receipt_server.LISTENER_RE.fullmatch(name) is None
    assert registry.vet_socket_shape("/tmp/claude-0/" + name) is not None
    # and what is right still passes, so the refusals above are the newline's doing
    stripped = name.rstrip("\n")
    assert {"api-1": mailbox.valid_handle, "0190abcd": wakecap.valid_session_id,
            "12.json": registry.pid_of_record_name, "12.sock": lambda n: registry.vet_socket_shape("/tmp/claude-0/" + n) is None,
            "courier-12.sock": receipt_server.LISTENER_RE.fullmatch}[stripped](stripped)


def test_a_home_that_cannot_be_found_is_an_error_never_a_relative_mail_root(env, tmp_path):
    """Found in review: os.path.expanduser returns "~nobody/x" unchanged when there is no such user (or no home
    at all), and the hook, which runs in the session's project directory, would have made `./~nobody/x/<box>`
    there. The hook does nothing (exit 0, logs nothing it cannot place); the CLI says what to set (exit 2)."""
    from courier import paths

    with pytest.raises(RuntimeError):
        paths.mail_root({"HELM_MAIL_DIR": "~courier-no-such-user-xyz/mail"})
    assert paths.mail_root({"HELM_MAIL_DIR": "~/mail", "HOME": "/h"}).endswith("/mail")
    project = tmp_path / "project"
    project.mkdir()
    e = env.vars()
    e["HELM_MAIL_DIR"] = "~courier-no-such-user-xyz/mail"
    p = subprocess.run([sys.executable, "-m", "courier", "hook", "claim"], cwd=project, env=e, capture_output=True,
                       input=json.dumps({"session_id": "s-nohome-1", "cwd": str(project)}).encode(), timeout=60)
    assert p.returncode == 0 and os.listdir(project) == []
    p = subprocess.run([sys.executable, "-m", "courier", "status"], cwd=project, env=e, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "courier-no-such-user-xyz" in p.stderr and "Traceback" not in p.stderr
    assert os.listdir(project) == []


def test_a_loser_never_names_a_dead_daemon_as_the_holder(tmp_path):
    """Found in review: the lock file keeps the last daemon's pid; a loser reading it before the winner rewrites it
    reported that dead pid. It now waits for a live one, else says "unknown"."""
    from courier import lockfile

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / lockfile.LOCK_FILE).write_text(f"{dead.pid}\n")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX);"
        "print('locked', flush=True); time.sleep(30)"), str(tmp_path / lockfile.LOCK_FILE)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(lockfile.Locked) as caught:
            lockfile.acquire(tmp_path)
        assert str(dead.pid) not in str(caught.value) and "unknown" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
