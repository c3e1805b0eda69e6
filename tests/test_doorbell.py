"""The doorbell line and the poke against real Unix sockets."""

from __future__ import annotations

import json
import os
import socket
import threading

import trio
from hypothesis import given, settings, strategies as st

from courier import doorbell, poke


@given(ring=st.integers(0, 10**9), queued=st.integers(0, 10**6), handle=st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True))
@settings(max_examples=300)
def test_line_is_one_json_line_pinned_and_template_only(ring, queued, handle):
    line = doorbell.compose(ring=ring, queued=queued, box=f"/m/{handle}", session_id="S", msg_id="M", from_addr="uds:/r/x.sock")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    obj = json.loads(line)
    assert obj["session_id"] == "S" and obj["priority"] == "next" and obj["msgV"] == 1 and obj["type"] == "user"
    content = obj["message"]["content"]
    assert isinstance(content, str) and content
    # Everything in the text is the template, the numbers and the box path.
    def skeleton(text, r, q, box):
        return text.replace(f"ring {r}:", "").replace(f" {q} new", "").replace(f"{box}/", "").replace("messages", "message")

    assert skeleton(content, ring, queued, f"/m/{handle}") == skeleton(doorbell.text(0, 0, "/B"), 0, 0, "/B")


def test_consecutive_rings_differ():
    assert doorbell.text(1, 1, "/m/a") != doorbell.text(2, 1, "/m/a")


def test_uds_address_percent_encodes():
    assert doorbell.uds_address("/run/user/0/cc-socks/courier-1.sock") == "uds:/run/user/0/cc-socks/courier-1.sock"
    assert doorbell.uds_address("/tmp/a b/é.sock") == "uds:/tmp/a%20b/%C3%A9.sock"


def _listener(tmp_path, name="42.sock"):
    d = tmp_path / "cc"
    d.mkdir(mode=0o700, exist_ok=True)
    path = str(d / name)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    return s, path


async def test_poke_accepting_peer(tmp_path):
    s, path = _listener(tmp_path)
    got = []

    def serve():
        c, _ = s.accept()
        data = b""
        while chunk := c.recv(4096):
            data += chunk
        got.append(data)
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    r = await poke.poke(path, b'{"x":1}\n', expected_pid=os.getpid(), timeout=2)
    await trio.to_thread.run_sync(t.join)
    s.close()
    assert r.sent and r.reason is None
    assert got == [b'{"x":1}\n']


async def test_poke_refuses_other_pid(tmp_path):
    """The peer's credentials must be the pid the registry vouched for; otherwise nothing is written."""
    s, path = _listener(tmp_path)
    r = await poke.poke(path, b"x\n", expected_pid=os.getpid() + 1, timeout=2)
    s.close()
    assert not r.sent and r.reason == "peer_pid_mismatch"


async def test_poke_refused_and_missing(tmp_path):
    d = tmp_path / "cc"
    d.mkdir(mode=0o700)
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(d / "7.sock"))  # bound, not listening: ECONNREFUSED like a SIGKILLed session
    r = await poke.poke(str(d / "7.sock"), b"x\n", expected_pid=None, timeout=2)
    assert (r.sent, r.reason) == (False, "refused")
    r = await poke.poke(str(d / "8.sock"), b"x\n", expected_pid=None, timeout=2)
    assert (r.sent, r.reason) == (False, "socket_missing")
    bound.close()


async def test_poke_never_closing_peer_is_bounded(tmp_path, autojump_clock):
    """A peer that reads but never closes: the one deadline ends the poke; the write counts as sent."""
    s, path = _listener(tmp_path)
    conns = []

    def serve():
        c, _ = s.accept()
        conns.append(c)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    r = await poke.poke(path, b"x\n", expected_pid=None, timeout=5)
    assert r.sent and r.reason == "eof_timeout"
    t.join()
    for c in conns:
        c.close()
    s.close()
