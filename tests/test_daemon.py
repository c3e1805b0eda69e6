"""courier run as a real process, fake sessions as real processes on real Unix sockets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import snapshot, wait_for


@pytest.fixture(params=["inotify", "watchfiles"])
def backend(request) -> str:
    """Every behaviour test here runs on both watcher backends."""
    return request.param


def test_drop_rings_once_pinned_and_bodyless(env, fake_session, daemon, barrier):
    """A drop reaches the owning session as exactly one valid line, pinned, without any body byte."""
    fs = fake_session("sess-a1")
    env.claim("alice-1234", fs.pid, "sess-a1")
    d = daemon()
    env.drop("alice-1234", body="TOPSECRET-BODY-7f3a", subject="SUBJ-9c1e", sender="FROM-55aa")
    lines = wait_for(fs.lines, what="a doorbell line")
    barrier(d)
    assert len(fs.lines()) == 1
    line = lines[0]
    assert line["type"] == "user"
    assert line["session_id"] == "sess-a1"
    assert line["priority"] == "next"
    assert line["msgV"] == 1
    assert isinstance(line["msg_id"], str) and len(line["msg_id"]) == 36
    content = line["message"]["content"]
    assert content.startswith("[courier doorbell]")
    raw = json.dumps(line)
    for secret in ("TOPSECRET", "SUBJ-9c1e", "FROM-55aa"):
        assert secret not in raw
    sent = d.wait_event("poke_sent", handle="alice-1234")
    assert sent[0]["pid"] == fs.pid and sent[0]["session_id"] == "sess-a1"
    assert sent[0]["latency_ms"] >= 0


def test_outstanding_then_rearm_after_drain(env, fake_session, daemon):
    """A second drop while the doorbell is outstanding rings nothing; after the box drains, a new drop rings with a different text."""
    fs = fake_session("sess-b")
    box = env.claim("bob-0001", fs.pid, "sess-b")
    d = daemon("--min-poke-interval", "0.1s")
    first = env.drop("bob-0001")
    wait_for(lambda: len(fs.lines()) == 1, what="first ring")
    env.drop("bob-0001")
    time.sleep(0.5)  # past the 0.1 s pacing a wrong second ring would wait for
    assert len(fs.lines()) == 1, "must not ring again while outstanding"
    # The recipient's hook consumes everything.
    from courier import mailbox

    for name in mailbox.list_box(box).queued:
        assert mailbox.consume(box, name)
    d.wait_event("doorbell_rearmed", handle="bob-0001")
    env.drop("bob-0001")
    wait_for(lambda: len(fs.lines()) == 2, what="second ring")
    a, b = (l["message"]["content"] for l in fs.lines())
    assert a != b
    assert first.name in os.listdir(box / "read")


def test_partially_drained_batch_rings_for_new_mail(env, fake_session, daemon):
    """Mail that lands after the rung batch was consumed rings again, even if the box never looked empty."""
    fs = fake_session("sess-p")
    box = env.claim("pat-0001", fs.pid, "sess-p")
    daemon("--min-poke-interval", "0.1s")
    m1 = env.drop("pat-0001")
    wait_for(lambda: len(fs.lines()) == 1, what="first ring")
    env.drop("pat-0001")  # lands while outstanding
    from courier import mailbox

    assert mailbox.consume(box, m1.name)  # hook took only the rung batch
    wait_for(lambda: len(fs.lines()) == 2, what="ring for the new batch")


FAILURES = [
    # (name, how to set up, expected event, expected reason)
    ("socket_missing", "unlink_socket", "poke_failed", "socket_missing"),
    ("refused", "no_listen", "poke_failed", "refused"),
    ("regular_file", "regular_file", "poke_failed", "not_a_socket"),
    ("directory", "directory", "poke_failed", "not_a_socket"),
    ("pid_dead", "kill", "session_unreachable", "pid_dead"),
    ("proc_start_mismatch", "proc_start", "session_unreachable", "pid_reused"),
    ("session_replaced", "session_replaced", "session_unreachable", "session_replaced"),
    ("no_socket_path", "no_socket_path", "session_unreachable", "no_socket"),
    ("owner_malformed", "owner_malformed", "session_unreachable", "owner_malformed_json"),
    ("owner_dir", "owner_dir", "session_unreachable", "owner_not_regular"),
    ("no_record", "no_record", "session_unreachable", "no_record"),
    ("retired", "retired", "session_unreachable", "retired"),
    ("pi_runtime", "pi", "session_unreachable", "runtime_not_claude"),
    ("permissive_dir", "permissive_dir", "poke_failed", "socket_dir_permissive"),
    ("close_early", "close_early", "poke_failed", None),
    ("wrong_peer", "wrong_peer", "poke_failed", "peer_pid_mismatch"),
    ("torn_record", "torn_record", "session_unreachable", "record_torn"),
    ("huge_record", "huge_record", "session_unreachable", "record_too_large"),
    ("unknown_protocol", "protocol", "peer_protocol_unknown", "peer_protocol_unknown"),  # once per session
    ("hard_linked_socket", "hard_link", "poke_failed", "socket_hard_linked"),
]


@pytest.mark.parametrize("name,setup,event,reason", FAILURES, ids=[f[0] for f in FAILURES])
def test_failure_is_a_logged_fallback_and_mail_is_untouched(env, fake_session, daemon, name, setup, event, reason):
    """Each failure produces its log event with a reason, the daemon stays alive, the mail is byte-for-byte unchanged."""
    handle = "fail-0001"
    behaviour = {"no_listen": "no_listen", "close_early": "close_early"}.get(setup, "accept")
    socket_dir = env.socks
    if setup == "permissive_dir":
        socket_dir = env.root / "open"
        socket_dir.mkdir(mode=0o777)
        os.chmod(socket_dir, 0o777)
    fs = fake_session("sess-f", behaviour=behaviour, socket_dir=socket_dir)
    rec_path = env.registry / f"{fs.pid}.json"
    rec = json.loads(rec_path.read_text())
    sock = rec["messagingSocketPath"]
    owner_extra = {}
    owner_sid = "sess-f"
    if setup == "unlink_socket":
        os.unlink(sock)
    elif setup in ("regular_file", "directory"):
        os.unlink(sock)
        if setup == "regular_file":
            open(sock, "w").close()
        else:
            os.mkdir(sock)
    elif setup == "kill":
        fs.kill()  # SIGKILL: record and socket stay behind
    elif setup == "proc_start":
        rec["procStart"] = "1"
        rec_path.write_text(json.dumps(rec))
    elif setup == "session_replaced":
        rec["sessionId"] = "sess-after-clear"
        rec_path.write_text(json.dumps(rec))
    elif setup == "no_socket_path":
        del rec["messagingSocketPath"]
        rec_path.write_text(json.dumps(rec))
    elif setup == "no_record":
        rec_path.unlink()
    elif setup == "retired":
        owner_extra["retiredAt"] = 5
    elif setup == "wrong_peer":
        # A record that points at a live socket of another process: never written to.
        other = fake_session("sess-other")
        rec["messagingSocketPath"] = other.socket
        rec_path.write_text(json.dumps(rec))
    elif setup == "torn_record":
        rec_path.write_text(json.dumps(rec)[:40])
    elif setup == "protocol":
        rec["peerProtocol"] = 2  # a wire format courier was never tested with: not written to
        rec_path.write_text(json.dumps(rec))
    elif setup == "hard_link":
        # Another process's socket hard-linked into a private directory: SO_PEERCRED alone would pass it.
        (env.root / "o").mkdir(mode=0o700)
        other = fake_session("sess-link", socket_dir=env.root / "o")
        os.unlink(sock)
        os.link(other.socket, sock)
    elif setup == "huge_record":
        rec["padding"] = "x" * (10 * 1024 * 1024)  # a 10 MB record
        rec_path.write_text(json.dumps(rec))
    box = env.claim(handle, fs.pid, owner_sid, runtime="pi" if setup == "pi" else "claude", **owner_extra)
    if setup == "owner_malformed":
        (box / "owner.json").write_text('{"handle": "fail-0001", "pid": ')
    elif setup == "owner_dir":
        (box / "owner.json").unlink()
        (box / "owner.json").mkdir()
    d = daemon()
    env.drop(handle)
    before = snapshot(box)
    match = {"handle": handle}
    if reason:
        match["reason"] = reason
    found = d.wait_event(event, **match)
    assert found[0].get("reason"), found
    time.sleep(0.2)
    assert d.proc.poll() is None, "daemon must stay up"
    assert snapshot(box) == before
    assert fs.lines() == [] or setup == "close_early"
    if setup in ("wrong_peer", "hard_link"):
        assert other.lines() == []
    assert not d.events("poke_sent")


def test_never_reading_socket_counts_as_sent_after_deadline(env, fake_session, daemon):
    """A session that accepts and never reads: the line sits in the buffer; logged as sent with eof_timeout, bounded by the deadline."""
    fs = fake_session("sess-n", behaviour="never_read")
    env.claim("slow-0001", fs.pid, "sess-n")
    d = daemon("--poke-timeout", "0.5s")
    env.drop("slow-0001")
    sent = d.wait_event("poke_sent", handle="slow-0001")
    assert sent[0]["note"] == "eof_timeout"
    assert 400 <= sent[0]["latency_ms"] < 2000


def test_session_appearing_later_is_rung(env, fake_session, daemon):
    """Mail waiting for a session that has no record yet is rung as soon as the session's record appears."""
    env.registry.mkdir(mode=0o700, exist_ok=True)
    d = daemon()
    # Owner points at a session id; the session starts after the mail is queued.
    env.claim("late-0001", 999999, "sess-late")
    env.drop("late-0001")
    d.wait_event("session_unreachable", handle="late-0001")
    fs = fake_session("sess-late")
    wait_for(lambda: len(fs.lines()) == 1, what="ring after the session appeared")
    assert fs.lines()[0]["session_id"] == "sess-late"


def test_restarted_session_found_by_session_id(env, fake_session, daemon):
    """An owner whose pid is stale is still rung when the registry lists its session under a new pid."""
    fs = fake_session("sess-moved")
    env.claim("mv-0001", 4000000, "sess-moved")  # a pid that cannot exist
    daemon()
    env.drop("mv-0001")
    wait_for(lambda: len(fs.lines()) == 1, what="ring via the session index")


def test_initial_scan_rings_mail_queued_before_start(env, fake_session, daemon):
    """Mail already queued when the daemon starts is rung by the initial scan, before ready."""
    fs = fake_session("sess-i")
    env.claim("init-0001", fs.pid, "sess-i")
    env.drop("init-0001")
    d = daemon()
    wait_for(lambda: len(fs.lines()) == 1, what="ring from the initial scan")
    sent = d.wait_event("poke_sent", handle="init-0001")
    assert sent[0]["ring"] == 1 and sent[0]["queued"] == 1


def test_temp_files_owner_and_read_are_not_mail(env, fake_session, daemon, barrier):
    """A .tmp file, an owner.json rewrite and files in read/ ring nothing."""
    fs = fake_session("sess-t")
    box = env.claim("tmp-0001", fs.pid, "sess-t")
    d = daemon()
    (box / ".tmp-abc").write_text("{}")
    (box / "read" / "1-abcdef.json").write_text("{}")
    env.claim("tmp-0001", fs.pid, "sess-t")
    barrier(d)
    assert fs.lines() == []


def test_second_instance_exits_with_clear_error(env, daemon):
    """Two courier run on one state dir: one wins, the other exits 3 naming the holder."""
    d = daemon()
    proc = subprocess.run(
        [sys.executable, "-m", "courier", "run"], env=_env(env), capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == 3
    assert f"pid {d.proc.pid}" in proc.stderr
    assert d.proc.poll() is None


def test_sigterm_stops_cleanly_and_fast(env, daemon):
    """SIGTERM: exit 0 within 2 s, logging daemon_stopping and daemon_stopped."""
    d = daemon()
    t = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t < 2.0
    assert d.events("daemon_stopping") and d.events("daemon_stopped")


def test_group_writable_mail_root_is_refused(env):
    """A mail root others may write into is a start-up error with its own exit status."""
    os.chmod(env.mail, 0o775)
    proc = subprocess.run(
        [sys.executable, "-m", "courier", "run"], env=_env(env), capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == 4
    assert "chmod 700" in proc.stderr


def test_missing_mail_root_is_created_private(env, daemon):
    """With no mail root, courier creates it with mode 0700."""
    os.rmdir(env.mail)
    daemon()
    assert (os.stat(env.mail).st_mode & 0o777) == 0o700


def test_bad_parameters_are_startup_errors(env):
    for args in (["--wake-cap", "0"], ["--wake-half-life", "-5"], ["--poke-timeout", "60s"], ["--wake-half-life", "soon"]):
        proc = subprocess.run(
            [sys.executable, "-m", "courier", "run", *args], env=_env(env), capture_output=True, text=True, timeout=20
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.strip()


def test_mail_root_recreated_while_running(env, fake_session, daemon):
    """The mail root deleted and recreated while running: the watch is rebuilt and new mail still rings."""
    import shutil

    fs = fake_session("sess-r")
    d = daemon("--rescan-interval", "1s")
    shutil.rmtree(env.mail)
    time.sleep(0.3)
    env.mail.mkdir(mode=0o700, exist_ok=True)
    env.claim("re-0001", fs.pid, "sess-r")
    env.drop("re-0001")
    wait_for(lambda: len(fs.lines()) == 1, timeout=8, what="ring after the root came back")
    assert d.proc.poll() is None


def test_fifo_and_symlink_messages_do_not_block_or_count(env, fake_session, daemon):
    """A FIFO named x.json and a symlink to /etc/passwd are not mail: logged, untouched, daemon unblocked."""
    fs = fake_session("sess-h")
    box = env.claim("hostile-0001", fs.pid, "sess-h")
    os.mkfifo(box / "fifo.json")
    os.symlink("/etc/passwd", box / "pw.json")
    d = daemon()
    refused = d.wait_event("mail_refused", handle="hostile-0001")
    assert sorted(refused[0]["entries"]) == ["fifo.json (not_regular)", "pw.json (symlink)"]
    assert fs.lines() == []
    env.drop("hostile-0001")
    wait_for(lambda: len(fs.lines()) == 1, what="ring for the real message")
    assert "1 new message " in fs.lines()[0]["message"]["content"]
    assert os.path.islink(box / "pw.json")


def _env(env):
    return env.vars()


def test_registry_dir_created_after_start(env, fake_session, daemon):
    """No sessions/ dir at start: the rescan notices it appear, watches it, and rings the waiting box."""
    d = daemon("--rescan-interval", "1s")
    env.claim("nr-0001", 4000003, "sess-nr")
    env.drop("nr-0001")
    d.wait_event("session_unreachable", handle="nr-0001")
    fs = fake_session("sess-nr")  # creates sessions/
    wait_for(lambda: len(fs.lines()) == 1, timeout=5, what="ring once the registry appeared")


def test_two_daemons_started_at_once_exactly_one_wins(env):
    """Two `courier run` launched at the same moment on one state dir: exactly one keeps running, the other exits 3."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "courier", "run"], env=_env(env), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        wait_for(lambda: any(p.poll() is not None for p in procs), timeout=20, what="one of them to give up")
        time.sleep(1.0)
        alive = [p for p in procs if p.poll() is None]
        dead = [p for p in procs if p.poll() is not None]
        assert len(alive) == 1 and len(dead) == 1
        assert dead[0].returncode == 3
        assert f"pid {alive[0].pid}" in dead[0].stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(5)


def test_daemon_ready_names_its_watcher(env, daemon, backend):
    """The backend asked for is the one that runs, and daemon_ready says which."""
    d = daemon()
    assert d.wait_event("daemon_ready")[0]["watcher"] == backend


async def test_a_failing_watcher_is_restarted_and_nothing_is_missed(tmp_path):
    """An unexpected error inside a running watcher backend costs latency, never the daemon: it is logged
    (watch_failed), every box is looked at again, and the backend is armed again after a back-off."""
    import trio
    from structlog.testing import capture_logs

    from courier import watcher

    calls = {"runs": 0, "rescans": []}

    class Flaky:
        name = "flaky"

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            calls["runs"] += 1
            task_status.started({"watcher": self.name})
            if calls["runs"] == 1:
                await trio.sleep(0.1)
                raise OSError(22, "an errno nobody expected")
            await trio.sleep_forever()

        def recheck(self):
            raise RuntimeError("recheck broke too")

        def complete(self):
            return True

        def snapshot(self):
            return {}

    class Sink:
        def rescan(self, reason):
            calls["rescans"].append(reason)

    import structlog

    with capture_logs() as logs:
        sup = watcher._Supervised(Flaky(), Sink(), structlog.get_logger())
        async with trio.open_nursery() as n:
            info = await n.start(sup.run)
            sup.recheck()
            await trio.sleep(1.5)
            n.cancel_scope.cancel()
    assert info == {"watcher": "flaky"}
    assert calls["runs"] == 2 and calls["rescans"] == ["watch_failed", "watch_restarted"]
    events = [e["event"] for e in logs]
    assert events.count("watch_failed") == 2 and "watch_restarted" in events


async def test_inotify_that_cannot_start_falls_back_before_readiness(tmp_path):
    """inotify unavailable (say, max_user_instances reached): watchfiles is armed instead, before started(), so
    readiness still means watching."""
    import structlog
    import trio
    from structlog.testing import capture_logs

    from courier import watcher
    from courier.watch_inotify import WatcherUnavailable

    class Unavailable:
        name = "inotify"

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            raise WatcherUnavailable("inotify_init1: EMFILE (fs.inotify.max_user_instances)")

    class Portable:
        name = "watchfiles"

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            task_status.started({"watcher": self.name})
            await trio.sleep_forever()

    with capture_logs() as logs:
        sup = watcher._Supervised(Unavailable(), None, structlog.get_logger(), fallback=Portable)
        async with trio.open_nursery() as n:
            info = await n.start(sup.run)
            n.cancel_scope.cancel()
    assert info == {"watcher": "watchfiles"} and sup.name == "watchfiles"
    assert [e["event"] for e in logs] == ["watcher_fallback"] and "max_user_instances" in logs[0]["reason"]
