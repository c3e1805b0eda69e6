"""Shared fixtures: private paths for every test, fake sessions as real processes, courier as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FAKE = HERE / "fakesession.py"


def dgram_listener(path, timeout: float = 0.05):
    """A datagram socket standing in for the service manager's NOTIFY_SOCKET (one listener for every test)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(timeout)
    return s


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSON-lines file another process is appending to.

    A long line can be read half-written; the last piece has no newline yet and is left for the next look."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


@dataclass
class Env:
    root: Path
    home: Path
    mail: Path
    claude: Path
    runtime: Path
    state: Path
    socks: Path

    @property
    def registry(self) -> Path:
        return self.claude / "sessions"

    def vars(self) -> dict:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "HELM_MAIL_HANDLE", "HELM_MAIL_OFF")
        }
        env.update(
            HOME=str(self.home),
            CLAUDE_CONFIG_DIR=str(self.claude),
            HELM_MAIL_DIR=str(self.mail),
            XDG_RUNTIME_DIR=str(self.runtime),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
            COURIER_STATE_DIR=str(self.state),
            TMPDIR=str(self.root / "tmp"),
            PYTHONUNBUFFERED="1",
        )
        env.pop("HELM_DEFAULTS_SUITE", None)
        return env

    def claim(self, handle: str, pid: int, session_id: str, runtime: str = "claude", **extra) -> Path:
        box = self.mail / handle
        (box / "read").mkdir(parents=True, exist_ok=True)
        owner = {"handle": handle, "runtime": runtime, "pid": pid, "sessionId": session_id, "cwd": "/w", "claimedAt": 1}
        owner.update(extra)
        (box / "owner.json").write_text(json.dumps(owner))
        return box

    def drop(self, handle: str, body: str = "BODY-SECRET", subject: str = "hello", sender: str = "bob") -> Path:
        from courier import mailbox

        return Path(mailbox.drop_message(self.mail, handle, sender=sender, subject=subject, body=body))


@pytest.fixture
def env(tmp_path) -> Env:
    # Short paths: a Unix socket path must fit in 103 bytes.
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
    e = Env(
        root=root,
        home=root / "h",
        mail=root / "m",
        claude=root / "c",
        runtime=root / "r",
        state=root / "s",
        socks=root / "r" / "cc-socks",
    )
    for d in (e.home, e.claude, root / "tmp"):
        d.mkdir(parents=True)
    e.runtime.mkdir(mode=0o700)
    e.socks.mkdir(mode=0o700)
    e.mail.mkdir(mode=0o700)
    yield e
    import shutil

    shutil.rmtree(root, ignore_errors=True)


@dataclass
class FakeSession:
    proc: subprocess.Popen
    session_id: str
    out: Path
    registry: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def socket(self) -> str:
        rec = json.loads((self.registry / f"{self.pid}.json").read_text())
        return rec["messagingSocketPath"]

    def lines(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [rec["line"] for rec in jsonl(self.out)]

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(5)


@pytest.fixture
def fake_session(env):
    started: list[FakeSession] = []

    def start(session_id: str = "sess-1", behaviour: str = "accept", receipt: str | None = None, **kw) -> FakeSession:
        out = env.root / f"lines-{session_id}-{len(started)}.jsonl"
        args = [
            sys.executable,
            str(FAKE),
            "--socket-dir",
            str(kw.get("socket_dir", env.socks)),
            "--registry",
            str(env.registry),
            "--session-id",
            session_id,
            "--out",
            str(out),
            "--behaviour",
            behaviour,
        ]
        if receipt:
            args += ["--receipt", receipt]
        if kw.get("receipt_early"):
            args.append("--receipt-early")
        if kw.get("reply"):
            args.append("--reply")
        if kw.get("pingpong"):
            args += ["--pingpong", *kw["pingpong"]]
        if kw.get("status"):
            args += ["--status", kw["status"]]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env.vars(), text=True)
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read()
        fs = FakeSession(proc, session_id, out, env.registry)
        started.append(fs)
        return fs

    yield start
    for fs in started:
        fs.kill()


class Daemon:
    def __init__(self, proc: subprocess.Popen, log_path: Path):
        self.proc = proc
        self.log_path = log_path

    def events(self, event: str | None = None, **match) -> list[dict]:
        out = []
        try:
            text = self.log_path.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if event and rec.get("event") != event:
                continue
            if all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out

    def wait_event(self, event: str, timeout: float = 5.0, count: int = 1, **match) -> list[dict]:
        def check():
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}):\n{self.log_path.read_text()}")
            found = self.events(event, **match)
            return found if len(found) >= count else None

        return wait_for(check, timeout, what=f"{count}x {event} {match}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 5.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("daemon did not stop in time")
        return self.proc.returncode


@pytest.fixture
def backend() -> str:
    """The watcher backend daemons run with; modules that test watching parametrize it over both."""
    return "auto"


@pytest.fixture
def daemon(env, backend):
    running: list[Daemon] = []

    def start(*extra: str, wait_ready: bool = True, env_extra: dict | None = None) -> Daemon:
        log_path = env.root / f"daemon-{len(running)}.log"
        vars_ = env.vars()
        vars_.update(env_extra or {})
        fh = open(log_path, "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "courier", "run", "--rescan-interval", "30s", "--watcher", backend, *extra],
            stdout=fh,
            stderr=fh,
            env=vars_,
        )
        d = Daemon(proc, log_path)
        running.append(d)
        if wait_ready:
            d.wait_event("daemon_ready", timeout=10)
        return d

    yield start
    for d in running:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def snapshot(box: Path) -> dict:
    """Every file under a box with its bytes: 'byte-for-byte unchanged' is compared on this."""
    out = {}
    for p in sorted(box.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(box))] = p.read_bytes()
    return out


class Fleet:
    def __init__(self, proc, pids, out: Path, prefix: str):
        self.proc, self.pids, self.out, self.prefix = proc, pids, out, prefix

    def session_of(self, i: int) -> tuple[int, str]:
        return self.pids[i % len(self.pids)], f"{self.prefix}-{i % len(self.pids)}"

    def rings(self) -> list[dict]:
        """Every line received by any session: {"at", "box", "line"}."""
        import re

        out = []
        for f in self.out.glob("*.jsonl"):
            for raw in f.read_text().splitlines():
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue  # a line being written right now
                m = re.search(r"mailbox (\S+)/ \.", rec["line"]["message"]["content"])
                out.append({"at": rec["at"], "box": Path(m.group(1)).name if m else None, "line": rec["line"]})
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)


@pytest.fixture
def fleet(env):
    started = []

    def start(n: int, prefix: str = "fleet") -> Fleet:
        out = env.root / f"fleet-{len(started)}"
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "fleet.py"), "--sessions", str(n), "--socket-dir", str(env.socks),
             "--registry", str(env.registry), "--out", str(out), "--prefix", prefix],
            stdout=subprocess.PIPE, env=env.vars(), text=True,
        )
        info = json.loads(proc.stdout.readline())
        f = Fleet(proc, info["pids"], out, prefix)
        started.append(f)
        return f

    yield start
    for f in started:
        f.stop()


@pytest.fixture
def barrier(env, fake_session):
    """Proof that a running daemon has looked at everything that happened before now, instead of a sleep:
    mail dropped into a fresh box of a fresh session must ring, and it was dropped after everything else.
    Returns the wait function: barrier(d)."""
    count = [0]

    def wait(d, timeout: float = 5.0) -> None:
        count[0] += 1
        sid = f"sess-barrier-{count[0]}"
        fs = fake_session(sid)
        handle = f"zz-barrier-{count[0]:04d}"
        env.claim(handle, fs.pid, sid)
        env.drop(handle)
        wait_for(fs.lines, timeout, what=f"the barrier box {handle} rung")
        assert d.proc.poll() is None

    return wait


@pytest.fixture(autouse=True)
def _reset_structlog():
    """In-process tests configure structlog; leave the next test a clean slate."""
    yield
    import structlog

    structlog.reset_defaults()
