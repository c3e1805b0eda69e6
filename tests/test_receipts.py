"""Claude Code's receipts, played by a fake session that answers each poke with a receipt kind."""

from __future__ import annotations

import os
import socket
import time


from conftest import wait_for


def test_listener_beside_target_and_from_address(env, fake_session, daemon):
    fs = fake_session("sess-r1")
    env.claim("rcpt-0001", fs.pid, "sess-r1")
    d = daemon()
    env.drop("rcpt-0001")
    line = wait_for(fs.lines)[0]
    listener = env.socks / f"courier-{d.proc.pid}.sock"
    assert line["from"] == f"uds:{listener}"
    st = os.lstat(listener)
    assert (st.st_mode & 0o777) == 0o600
    d.stop()
    assert not listener.exists(), "removed on exit"


def test_held_warns_once_and_blocks_rering(env, fake_session, daemon):
    """held -> poke_receipt + one session_holds_doorbells warning with the fix; no re-ring while held."""
    fs = fake_session("sess-held", receipt="held")
    box = env.claim("held-0001", fs.pid, "sess-held")
    d = daemon("--min-poke-interval", "0.1s", "--outstanding-limit", "0.5s")
    env.drop("held-0001")
    d.wait_event("poke_receipt", handle="held-0001", status="held")
    warn = d.wait_event("session_holds_doorbells", handle="held-0001")
    assert "crossSessionInbound" in warn[0]["fix"]
    env.drop("held-0001")
    time.sleep(1.5)  # past the outstanding limit: still no second ring while held
    assert len(fs.lines()) == 1
    assert len(d.events("session_holds_doorbells")) == 1
    assert d.events("session_unreachable", handle="held-0001", reason="receipt_held"), d.log_path.read_text()
    # status shows it
    import subprocess, sys

    def shown():
        out = subprocess.run([sys.executable, "-m", "courier", "status"], env=env.vars(), capture_output=True, text=True)
        return "held" in out.stdout and "crossSessionInbound" in out.stdout

    wait_for(shown, timeout=5, what="status to show the held receipt (snapshot is written at most once a second)")
    doc = subprocess.run([sys.executable, "-m", "courier", "doctor"], env=env.vars(), capture_output=True, text=True)
    assert doc.returncode == 1 and "held-0001" in doc.stdout and "spawn-settings" in doc.stdout


def test_denied_backs_off(env, fake_session, daemon):
    fs = fake_session("sess-den", receipt="denied")
    box = env.claim("den-0001", fs.pid, "sess-den")
    d = daemon("--min-poke-interval", "0.1s")
    env.drop("den-0001")
    d.wait_event("poke_receipt", handle="den-0001", status="denied")
    from courier import mailbox

    for n in mailbox.list_box(box).queued:
        mailbox.consume(box, n)
    d.wait_event("doorbell_rearmed", handle="den-0001")
    env.drop("den-0001")
    d.wait_event("session_unreachable", handle="den-0001", reason="receipt_denied")
    assert len(fs.lines()) == 1


def test_refused_wire_form_backs_off(env, fake_session, daemon):
    """`expired` with status_detail `refused` is a refusal: the session is not rung again for the back-off."""
    fs = fake_session("sess-ref", receipt="refused")
    box = env.claim("ref-0001", fs.pid, "sess-ref")
    d = daemon("--min-poke-interval", "0.1s")
    env.drop("ref-0001")
    d.wait_event("poke_receipt", handle="ref-0001", status="refused")
    from courier import mailbox

    for n in mailbox.list_box(box).queued:
        mailbox.consume(box, n)
    d.wait_event("doorbell_rearmed", handle="ref-0001")
    env.drop("ref-0001")
    d.wait_event("session_unreachable", handle="ref-0001", reason="receipt_refused")
    assert len(fs.lines()) == 1


def test_dropped_retries_once_with_new_text(env, fake_session, daemon):
    fs = fake_session("sess-drop", receipt="dropped")
    env.claim("drop-0001", fs.pid, "sess-drop")
    d = daemon("--min-poke-interval", "0.2s")
    env.drop("drop-0001")
    wait_for(lambda: len(fs.lines()) == 2, timeout=15, what="one retry (a fixed 2 s after the drop)")
    time.sleep(1.0)
    assert len(fs.lines()) == 2, "only one retry"
    a, b = (l["message"]["content"] for l in fs.lines())
    assert a != b


def test_replies_are_ignored(env, fake_session, daemon):
    fs = fake_session("sess-reply", reply=True)
    env.claim("reply-0001", fs.pid, "sess-reply")
    d = daemon()
    env.drop("reply-0001")
    ev = d.wait_event("peer_reply_ignored")
    assert ev[0]["peer_pid"] == fs.pid


def test_unknown_receipt_and_garbage_do_not_disturb(env, fake_session, daemon, barrier):
    fs = fake_session("sess-g")
    env.claim("g-0001", fs.pid, "sess-g")
    d = daemon()
    env.drop("g-0001")
    wait_for(fs.lines)
    listener = str(env.socks / f"courier-{d.proc.pid}.sock")
    for payload in (b"\xff\xfe\n", b'{"type":"control","action":"peer_message_status","status":"held","orig_msg_id":"nope"}\n',
                    b"x" * 200000):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(listener)
            try:
                s.sendall(payload)
            except OSError:
                pass
    barrier(d)
    assert d.proc.poll() is None
    assert not d.events("poke_receipt")
    assert not d.events("session_holds_doorbells")


def test_flood_of_idle_connections_cannot_stall(env, fake_session, daemon):
    """Many connections that never send: excess ones are closed, the daemon keeps ringing."""
    fs = fake_session("sess-fl")
    env.claim("fl-0001", fs.pid, "sess-fl")
    box2_fs = fake_session("sess-fl2")
    env.claim("fl-0002", box2_fs.pid, "sess-fl2")
    d = daemon()
    env.drop("fl-0001")
    wait_for(fs.lines)
    listener = str(env.socks / f"courier-{d.proc.pid}.sock")
    conns = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(listener)
        except (BlockingIOError, OSError):
            pass
        conns.append(s)
    env.drop("fl-0002")
    wait_for(box2_fs.lines, what="ring during the flood")
    for s in conns:
        s.close()


def test_stale_listener_of_dead_courier_removed_only_those(env, fake_session, daemon):
    import subprocess, sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = env.socks / f"courier-{dead.pid}.sock"
    s1 = socket.socket(socket.AF_UNIX)
    s1.bind(str(stale))
    s1.close()
    live = env.socks / f"courier-{os.getpid()}.sock"
    s2 = socket.socket(socket.AF_UNIX)
    s2.bind(str(live))
    other = env.socks / "notes.txt"
    other.write_text("keep")
    fs = fake_session("sess-st")
    env.claim("st-0001", fs.pid, "sess-st")
    d = daemon()
    env.drop("st-0001")
    wait_for(fs.lines)
    assert not stale.exists()
    assert live.exists() and other.exists()
    s2.close()


def test_a_dropped_doorbell_is_retried_once_per_batch_not_once_per_box(env, fake_session, daemon):
    """Found by the soak benchmark: after the restructure the one retry of a dropped doorbell was spent for the
    box's lifetime. Each new batch (after the last one was read) gets its own retry."""
    from courier import mailbox

    fs = fake_session("sess-drop2", receipt="dropped")
    box = env.claim("drop-0002", fs.pid, "sess-drop2")
    d = daemon("--min-poke-interval", "0.2s")
    for batch in range(1, 3):
        env.drop("drop-0002")
        # the retry comes a fixed 2 s after the drop (receipts.retry_after_s): leave room for a loaded machine
        try:
            wait_for(lambda n=batch: len(fs.lines()) == 2 * n, timeout=15,
                     what=f"batch {batch}: the ring and its one retry")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; lines {len(fs.lines())}; log:\n{d.log_path.read_text()}") from None
        for name in mailbox.list_box(box).queued:
            mailbox.consume(box, name)
        d.wait_event("doorbell_rearmed", handle="drop-0002", count=batch)


def test_receipt_that_outruns_the_poke_is_applied(env, fake_session, daemon):
    """Claude sends `held` as soon as it has read the line, before our poke has seen EOF.

    The fake holds the connection open for 0.5 s after sending the receipt, so the receipt is
    always handled while the ring is still in flight. It must be matched (not `unknown_receipt`),
    and its re-arm applied once the ring is recorded: the box is looked at again at once
    (session_unreachable), long before the 60 s outstanding limit would have."""
    fs = fake_session("sess-early", receipt="held", receipt_early=True)
    env.claim("early-0001", fs.pid, "sess-early")
    d = daemon("--outstanding-limit", "60s")
    env.drop("early-0001")
    d.wait_event("poke_receipt", handle="early-0001", status="held")
    d.wait_event("session_unreachable", handle="early-0001", reason="receipt_held", timeout=10)
    assert not d.events("peer_reply_ignored"), d.log_path.read_text()
    sent = d.events("poke_sent", handle="early-0001")
    assert len(sent) == 1 and len(fs.lines()) == 1
