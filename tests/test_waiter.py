"""The rewake waiter (`courier hook wait`) and the daemon's side of it (`waiters`), as separate processes.

A fake Claude (a real process with a registry record) starts waiters the way Claude Code
does: `/bin/sh -c '<courier> hook wait'` in its own session, the hook payload on stdin,
stdout and stderr as AF_UNIX socket pairs whose other ends it holds. So a SIGKILLed fake
Claude hangs them up exactly as the real one does (research/claude-code-rewake.md §4).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from conftest import jsonl, wait_for

from courier import waiters

COMMAND = f"{sys.executable} -m courier hook wait"
BODY = "BODY-MUST-NEVER-APPEAR-7f3a"

# A fake Claude Code: registers itself, spawns N waiters at once (and more on "spawn\n" from
# stdin), and reports each waiter's exit with what it wrote, one JSON object per line.
FAKE_CLAUDE = r'''
import json, os, socket, subprocess, sys, threading, time
reg, sid, count, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pid = os.getpid()
raw = open(f"/proc/{pid}/stat").read()
start = raw[raw.rindex(")") + 2:].split(" ")[19]
os.makedirs(reg, exist_ok=True)
def write_record(session):
    tmp = os.path.join(reg, f".{pid}.tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": pid, "sessionId": session, "procStart": start, "cwd": os.getcwd(), "status": "idle",
                   "kind": "interactive"}, f)
    os.rename(tmp, os.path.join(reg, f"{pid}.json"))
write_record(sid)
lock = threading.Lock()
def emit(obj):
    with lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
keep = []
def spawn(session):
    env = dict(os.environ, CLAUDE_PID=str(pid), CLAUDE_CODE_SESSION_ID=session)
    pin, cin = socket.socketpair()
    pout, cout = socket.socketpair()
    perr, cerr = socket.socketpair()
    p = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=cin, stdout=cout, stderr=cerr, env=env,
                         start_new_session=True)
    for s in (cin, cout, cerr):
        s.close()
    pin.sendall(json.dumps({"session_id": session, "hook_event_name": "Stop"}).encode() + b"\n")
    pin.close()
    keep.extend([pout, perr])
    emit({"spawned": p.pid})
    def drain(s, into):
        while True:
            try:
                data = s.recv(65536)
            except OSError:
                return
            if not data:
                return
            into.append(data)
    out, err = [], []
    threads = [threading.Thread(target=drain, args=(pout, out)), threading.Thread(target=drain, args=(perr, err))]
    for t in threads:
        t.start()
    def reap():
        code = p.wait()
        at = time.time()
        for t in threads:
            t.join(5)
        emit({"exit": code, "sh": p.pid, "at": at, "stdout": b"".join(out).decode("utf-8", "replace"),
              "stderr": b"".join(err).decode("utf-8", "replace")})
    threading.Thread(target=reap, daemon=True).start()
procs = [spawn(sid) for _ in range(count)]
emit({"ready": pid})
session = sid
for line in sys.stdin:
    word = line.split()
    if word and word[0] == "spawn":
        spawn(session)
    elif word and word[0] == "clear":
        session = word[1]
        write_record(session)
        emit({"cleared": session})
time.sleep(3600)
'''


class FakeClaude:
    def __init__(self, env, sid: str, count: int = 1, command: str = COMMAND):
        self.env, self.sid = env, sid
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE_CLAUDE, str(env.registry), sid, str(count), command],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env.vars(), cwd=env.root,
                                     text=True)
        self.events: list[dict] = []
        self.spawned: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(lambda: any("ready" in e for e in self.events), 10, what="fake claude ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            if "spawned" in event:
                self.spawned.append(event["spawned"])
            self.events.append(event)

    def exits(self) -> list[dict]:
        return [e for e in self.events if "exit" in e]

    def spawn(self) -> None:
        self.proc.stdin.write("spawn\n")
        self.proc.stdin.flush()

    def clear(self, new_sid: str) -> None:
        self.proc.stdin.write(f"clear {new_sid}\n")
        self.proc.stdin.flush()
        wait_for(lambda: any(e.get("cleared") == new_sid for e in self.events), 5, what="clear")
        self.sid = new_sid

    def registration(self) -> dict | None:
        try:
            return json.loads((self.env.state / "waiters" / f"{self.pid}.json").read_text())
        except (OSError, ValueError):
            return None

    def registered(self, timeout: float = 10.0, other_than: int | None = None) -> dict:
        return wait_for(lambda: (r := self.registration()) and r["waiterPid"] != other_than and r, timeout,
                        what="a waiter registration")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for sh in self.spawned:  # each waiter is its own process group (start_new_session)
            try:
                os.killpg(sh, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def claude(env):
    made: list[FakeClaude] = []

    def start(sid: str = "0190aaaa-0000-4000-8000-00000000c0de", count: int = 1) -> FakeClaude:
        fc = FakeClaude(env, sid, count)
        made.append(fc)
        return fc

    yield start
    for fc in made:
        fc.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def switches(pid: int) -> int:
    s = proc_status(pid)
    return int(s["voluntary_ctxt_switches"]) + int(s["nonvoluntary_ctxt_switches"])


def hook_events(env, event: str | None = None) -> list[dict]:
    recs = jsonl(env.state / "hooks.log")
    return [r for r in recs if event is None or r["event"] == event]


def claim(env, fc: FakeClaude, handle: str = "proj-c0de") -> Path:
    return env.claim(handle, fc.pid, fc.sid)


def ring(env, sid: str, box: Path, *, timeout: float = 3.0, pid: int | None = None, ring_no: int = 1):
    async def go():
        return await waiters.Waiters(env.state, env.registry).wake(sid, ring=ring_no, queued=1, box=str(box),
                                                                     timeout=timeout, pid=pid)

    return trio.run(go)


def everything_under(*dirs: Path) -> bytes:
    data = b""
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file() and not p.is_symlink():
                data += p.read_bytes()
    return data


# ---------------------------------------------------------------- registration


def test_one_waiter_per_claude_under_concurrent_stops(env, claude):
    """Five waiters started at once for one Claude: exactly one registers, the other four exit 0 promptly."""
    t0 = time.time()
    fc = claude(count=5)
    reg = fc.registered()
    assert reg["pid"] == fc.pid and reg["sessionId"] == fc.sid and alive(reg["waiterPid"])
    exits = wait_for(lambda: len(fc.exits()) >= 4 and fc.exits(), 5, what="four duplicates to exit")
    assert [e["exit"] for e in exits] == [0, 0, 0, 0]
    assert max(e["at"] for e in exits) - t0 < 3.0
    time.sleep(0.3)
    assert len(fc.exits()) == 4 and alive(reg["waiterPid"])
    assert len(hook_events(env, "waiter_registered")) == 1
    files = sorted(p.name for p in (env.state / "waiters").iterdir())
    assert files == [f"{fc.pid}.json", f"{fc.pid}.lock", f"{fc.pid}.sock"]
    assert (env.state / "waiters").stat().st_mode & 0o777 == 0o700
    assert (env.state / "waiters" / f"{fc.pid}.sock").stat().st_mode & 0o777 == 0o600
    # A later Stop (Claude arms one per turn) finds it and leaves at once, without a log line.
    fc.spawn()
    wait_for(lambda: len(fc.exits()) == 5, 5, what="the later duplicate to exit")
    assert fc.exits()[-1]["exit"] == 0 and len(hook_events(env, "waiter_registered")) == 1


def test_daemon_down_waiter_waits_quietly_and_mail_stays(env, claude):
    """No daemon: nothing rings; the waiter sleeps without a single wakeup and the mail stays for the prompt."""
    fc = claude()
    box = claim(env, fc)
    reg = fc.registered()
    msg = env.drop("proj-c0de", body=BODY)
    time.sleep(0.2)  # let start-up settle
    pid = reg["waiterPid"]
    before = switches(pid)
    time.sleep(2.0)
    idle_switches = switches(pid) - before
    rss_kb = int(proc_status(pid)["VmRSS"].split()[0])
    print(f"\nwaiter idle: {idle_switches} context switches in 2.0 s, VmRSS {rss_kb / 1024:.1f} MB")
    assert idle_switches == 0
    assert rss_kb <= 20 * 1024
    assert alive(pid) and msg.exists() and not fc.exits()
    assert not list((box / "read").iterdir())


# ---------------------------------------------------------------- a wake


def test_wake_shows_notice_consumes_and_exits_2(env, claude):
    fc = claude()
    box = claim(env, fc)
    reg = fc.registered()
    msg = env.drop("proj-c0de", body=BODY, subject="the subject")
    result = ring(env, fc.sid, box)
    assert result.sent and result.reason is None and result.latency_ms > 0
    done = wait_for(lambda: fc.exits(), 5, what="the waiter to exit")[0]
    assert done["exit"] == 2
    read_path = str(box / "read" / msg.name)
    assert read_path in done["stderr"] and "the subject" in done["stderr"]
    assert done["stdout"] == done["stderr"]
    assert BODY not in done["stderr"]
    assert not msg.exists() and (box / "read" / msg.name).exists()
    assert not (env.state / "waiters" / f"{fc.pid}.json").exists()
    assert not (env.state / "waiters" / f"{fc.pid}.sock").exists()
    assert BODY.encode() not in everything_under(env.state)
    rung = hook_events(env, "waiter_rung")
    assert rung and rung[0]["shown"] == 1 and rung[0]["ring"] == 1
    assert [e["via"] for e in hook_events(env, "hook_delivered")] == ["waiter"]
    assert not alive(reg["waiterPid"])


def test_wake_with_no_mail_says_empty_and_keeps_waiting(env, claude):
    """The prompt took the mail first: the waiter says so, shows nothing, and waits on."""
    fc = claude()
    box = claim(env, fc)
    reg = fc.registered()
    result = ring(env, fc.sid, box)
    assert not result.sent and result.reason == "waiter_empty"
    time.sleep(0.2)
    assert alive(reg["waiterPid"]) and not fc.exits()
    msg = env.drop("proj-c0de")
    assert ring(env, fc.sid, box, ring_no=2).sent
    assert wait_for(lambda: fc.exits(), 5)[0]["exit"] == 2 and not msg.exists()


def test_wrong_session_is_refused(env, claude):
    fc = claude()
    box = claim(env, fc)
    reg = fc.registered()
    env.drop("proj-c0de")
    result = ring(env, "someone-else-entirely", box, pid=fc.pid)
    assert not result.sent and result.reason == "waiter_wrong_session"
    assert alive(reg["waiterPid"]) and len(list(box.glob("*.json"))) == 2  # owner.json + the message


def test_after_clear_the_same_waiter_serves_the_new_session(env, claude):
    """/clear keeps the process (and its waiter) but re-mints the session id: found through the registry."""
    fc = claude(sid="0190bbbb-0000-4000-8000-0000000old1")
    fc.registered()
    fc.clear("0190bbbb-0000-4000-8000-0000000new2")
    box = env.claim("proj-new2", fc.pid, fc.sid)
    msg = env.drop("proj-new2")
    assert waiters.has_waiter(env.state, fc.sid, env.registry)
    assert not waiters.has_waiter(env.state, fc.sid)  # without the registry, only the id it registered with
    assert ring(env, fc.sid, box).sent
    done = wait_for(lambda: fc.exits(), 5)[0]
    assert done["exit"] == 2 and str(box / "read" / msg.name) in done["stderr"]


# ---------------------------------------------------------------- ends


def test_sigkilled_waiter_mid_ring_leaves_mail_queued(env, claude):
    """The waiter dies between the daemon's connect and its answer: a failure reason, mail untouched, stale files cleaned."""
    fc = claude()
    box = claim(env, fc)
    reg = fc.registered()
    msg = env.drop("proj-c0de", body=BODY)
    os.kill(reg["waiterPid"], signal.SIGSTOP)  # it cannot answer: the ring is in the socket, unread

    async def go():
        w = waiters.Waiters(env.state, env.registry)
        async with trio.open_nursery() as nursery:
            results = []

            async def wake():
                results.append(await w.wake(fc.sid, ring=7, queued=1, box=str(box), timeout=5.0))

            nursery.start_soon(wake)
            await trio.sleep(0.3)
            os.kill(reg["waiterPid"], signal.SIGKILL)
        return results[0], w

    result, w = trio.run(go)
    assert not result.sent and result.reason in ("waiter_closed", "reset"), result
    assert msg.exists() and not list((box / "read").iterdir())
    wait_for(lambda: not alive(reg["waiterPid"]), 5)
    assert (env.state / "waiters" / f"{fc.pid}.json").exists()  # left behind by SIGKILL
    assert not w.has(fc.sid)
    assert not (env.state / "waiters" / f"{fc.pid}.json").exists()
    assert not (env.state / "waiters" / f"{fc.pid}.sock").exists()
    assert w.stats["cleaned"] == 1
    assert ring(env, fc.sid, box).reason == "no_waiter"
    # The next Stop registers afresh over the leftovers.
    fc.spawn()
    fresh = fc.registered(other_than=reg["waiterPid"])
    assert ring(env, fc.sid, box).sent and not msg.exists()
    assert wait_for(lambda: [e for e in fc.exits() if e["sh"] != fc.spawned[0]], 5)[0]["exit"] == 2
    assert fresh["waiterPid"] != reg["waiterPid"]


def test_stale_registration_cleaned_and_replaced(env, claude):
    """A registration whose waiter is dead and whose lock nobody holds: has() says no and removes it."""
    fc = claude()
    directory = env.state / "waiters"
    directory.mkdir(parents=True, mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (directory / "4242.json").write_text(json.dumps({
        "pid": 4242, "sessionId": "ghost", "procStart": "1", "socket": str(directory / "4242.sock"),
        "waiterPid": dead.pid, "startedAt": 1}))
    (directory / "4242.lock").write_text("")
    (directory / "junk.json").write_text("{")
    w = waiters.Waiters(env.state, env.registry)
    assert not w.has("ghost")
    assert not (directory / "4242.json").exists() and not (directory / "4242.lock").exists()
    assert (directory / "junk.json").exists()  # not a registration's name: left alone
    # A live waiter's registration is never removed, even when asked about it repeatedly.
    reg = fc.registered()
    for _ in range(3):
        assert w.has(fc.sid) and w.has("anything", pid=fc.pid)
    assert alive(reg["waiterPid"]) and (directory / f"{fc.pid}.sock").exists()


def test_index_follows_the_directory(env, claude):
    """has() re-reads the directory only when it changed; a registration that appears later is seen."""
    w = waiters.Waiters(env.state, env.registry)
    assert not w.has("0190aaaa-0000-4000-8000-00000000c0de")
    fc = claude()
    fc.registered()
    assert w.has(fc.sid)
    time.sleep(0.15)
    assert w.has(fc.sid)
    scans = w.stats["scans"]
    for _ in range(20):
        assert w.has(fc.sid)
    assert w.stats["scans"] == scans  # unchanged directory: no re-read


def test_claude_sigkilled_waiter_exits_on_hangup(env, claude):
    """Claude SIGKILLed sends no signal; its end of our stdio closes and the waiter leaves within ~1 s."""
    fc = claude()
    reg = fc.registered()
    t0 = time.monotonic()
    fc.proc.kill()
    fc.proc.wait(5)
    wait_for(lambda: not alive(reg["waiterPid"]), 2, what="the orphaned waiter to exit")
    print(f"\nwaiter gone {time.monotonic() - t0:.3f} s after Claude's SIGKILL")
    assert not (env.state / "waiters" / f"{fc.pid}.json").exists()
    assert [e["reason"] for e in hook_events(env, "waiter_stood_down")] == ["session_gone"]


def _direct_waiter(env, claude_pid: int, sid: str, **extra) -> subprocess.Popen:
    """A waiter whose parent is the test process itself, with pipes for stdout and stderr."""
    e = env.vars()
    e.update(CLAUDE_PID=str(claude_pid), CLAUDE_CODE_SESSION_ID=sid, **extra)
    p = subprocess.Popen([sys.executable, "-m", "courier", "hook", "wait"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
    p.stdin.write(json.dumps({"session_id": sid}).encode())
    p.stdin.close()
    return p


def _register_self(env, sid: str) -> None:
    raw = Path(f"/proc/{os.getpid()}/stat").read_text()
    env.registry.mkdir(parents=True, exist_ok=True)
    (env.registry / f"{os.getpid()}.json").write_text(json.dumps({
        "pid": os.getpid(), "sessionId": sid, "procStart": raw[raw.rindex(")") + 2:].split(" ")[19]}))


def test_pipe_hangup_exit(env):
    """stdout/stderr as pipes whose read ends close: POLLERR on the write end, exit 0 within 1 s."""
    _register_self(env, "sess-pipes")
    p = _direct_waiter(env, os.getpid(), "sess-pipes")
    wait_for(lambda: (env.state / "waiters" / f"{os.getpid()}.json").exists(), 10)
    t0 = time.monotonic()
    p.stdout.close()
    p.stderr.close()
    assert p.wait(2) == 0
    assert time.monotonic() - t0 < 1.0
    assert not (env.state / "waiters" / f"{os.getpid()}.json").exists()


def test_sigterm_exit_0_and_mail_stays(env, claude):
    fc = claude()
    claim(env, fc)
    reg = fc.registered()
    msg = env.drop("proj-c0de")
    os.kill(reg["waiterPid"], signal.SIGTERM)
    done = wait_for(lambda: fc.exits(), 3)[0]
    assert done["exit"] == 0 and done["stderr"] == "" and msg.exists()
    assert not (env.state / "waiters" / f"{fc.pid}.json").exists()
    assert hook_events(env, "waiter_stood_down")[0]["reason"] == "signal"


def test_told_to_stand_down(env, claude):
    fc = claude()
    fc.registered()
    assert waiters.stand_down(env.state, fc.pid)
    assert wait_for(lambda: fc.exits(), 3)[0]["exit"] == 0
    assert not waiters.has_waiter(env.state, fc.sid)


def test_dead_claude_at_start_exits_0(env):
    dead = subprocess.Popen(["true"])
    dead.wait()
    p = _direct_waiter(env, dead.pid, "sess-dead")
    assert p.wait(10) == 0
    assert not (env.state / "waiters").exists() or not list((env.state / "waiters").iterdir())
    assert hook_events(env, "waiter_stood_down")[0]["reason"] == "claude_dead"


def test_not_our_claude_is_refused(env):
    """$CLAUDE_PID names a live process that did not start us: serve nobody."""
    other = subprocess.Popen(["sleep", "30"])
    try:
        p = _direct_waiter(env, other.pid, "sess-other")
        assert p.wait(10) == 0
    finally:
        other.kill()
        other.wait()
    assert hook_events(env, "waiter_refused")[0]["reason"] == "not_our_claude"


def test_mail_off_and_bad_payload_exit_0(env):
    _register_self(env, "sess-off")
    p = _direct_waiter(env, os.getpid(), "sess-off", HELM_MAIL_OFF="1")
    assert p.wait(10) == 0
    bad = env.vars()
    bad.update(CLAUDE_PID=str(os.getpid()))
    q = subprocess.run([sys.executable, "-m", "courier", "hook", "wait"], input=b"[1,2", env=bad,
                       capture_output=True, timeout=10, check=False)
    assert q.returncode == 0
    assert not (env.state / "waiters").exists()


def test_permissive_waiters_dir_is_refused(env):
    _register_self(env, "sess-perm")
    (env.state / "waiters").mkdir(parents=True)
    os.chmod(env.state / "waiters", 0o755)
    p = _direct_waiter(env, os.getpid(), "sess-perm")
    assert p.wait(10) == 0
    assert hook_events(env, "waiter_refused")[0]["reason"] == "socket_dir_permissive"


def test_stranger_lines_do_not_end_the_wait(env, claude):
    """Garbage, an oversized line, and a connection that says nothing: each answered or dropped; the waiter stays."""
    fc = claude()
    reg = fc.registered()
    path = str(env.state / "waiters" / f"{fc.pid}.sock")
    for payload in (b"not json\n", b"[]\n", b'{"ring": "x"}\n', b"x" * 5000 + b"\n", b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(path)
            if payload:
                s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            s.recv(64)
    assert alive(reg["waiterPid"]) and not fc.exits()


# ---------------------------------------------------------------- costs


def test_import_budget():
    """`hook wait` and `has_waiter` stay off trio and structlog (RSS of a waiter per idle session)."""
    code = ("import sys, courier.cli, courier.hooks, courier.waiter, courier.waiters; "
            "print([m for m in ('trio','structlog','watchfiles','psutil') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_wake_latency(env, claude):
    """Ring -> reply and ring -> waiter exit, over 10 wakes (each wake ends its waiter; the next Stop arms one)."""
    fc = claude()
    box = claim(env, fc)
    reply_ms, exit_ms, teardown_ms = [], [], []
    previous = None
    for i in range(10):
        reg = fc.registered(other_than=previous)
        previous = reg["waiterPid"]
        env.drop("proj-c0de")
        n = len(fc.exits())
        t0 = time.time()
        result = ring(env, fc.sid, box, ring_no=i + 1)
        assert result.sent, result
        done = wait_for(lambda n=n: len(fc.exits()) > n and fc.exits()[n], 5)
        assert done["exit"] == 2
        reply_ms.append(result.latency_ms)
        exit_ms.append((done["at"] - t0) * 1000)
        rung = next(e for e in hook_events(env, "waiter_rung") if e["ring"] == i + 1)
        teardown_ms.append((done["at"] - rung["at"]) * 1000)
        fc.spawn()
    reply_ms.sort()
    exit_ms.sort()
    teardown_ms.sort()
    print(f"\nring->reply ms: p50 {reply_ms[5]:.1f} max {reply_ms[-1]:.1f}; "
          f"ring->waiter exit ms (incl. trio.run start): p50 {exit_ms[5]:.1f} max {exit_ms[-1]:.1f}; "
          f"last log line->process exit ms: p50 {teardown_ms[5]:.1f} max {teardown_ms[-1]:.1f}")
    assert reply_ms[5] < 50


async def test_watch_reports_new_registrations(env, claude):
    """The daemon learns that a waiter registered (mail held meanwhile is looked at again), with no polling."""
    seen: list = []
    w = waiters.Waiters(env.state, env.registry)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(w.watch, seen.append) is True
        fc = await trio.to_thread.run_sync(claude)
        await trio.to_thread.run_sync(fc.registered)
        with trio.fail_after(5):
            while not any(s and fc.pid in s for s in seen):
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


def test_notice_that_cannot_be_written_leaves_the_mail_queued(env):
    """Claude gone between the ring and the notice (EPIPE on stderr): present() stops before the consume."""
    from courier import hooks, mailbox
    from courier.waiter import NoticeFailed, _Notice

    sid = "0190cccc-0000-4000-8000-00000000dead"
    box = env.claim("proj-dead", os.getpid(), sid)
    msg = env.drop("proj-dead", body=BODY)
    r, w = os.pipe()
    os.close(r)  # nobody reads: EPIPE (Python ignores SIGPIPE)
    try:
        notice = _Notice(w, w, lambda: False)
        with pytest.raises(NoticeFailed):
            hooks.present(env.vars(), sid, notice, hooks.HookLog(env.state), via="waiter")
    finally:
        os.close(w)
    assert mailbox.list_box(box).queued == (msg.name,)
    assert msg.exists()
