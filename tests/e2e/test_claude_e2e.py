"""End to end against the real Claude Code CLI in tmux, talking only to a mock API on 127.0.0.1.

The release is the pinned 2.1.328 unless COURIER_E2E_CLAUDE_VERSION says otherwise (conftest.py); it is in every
test's id (`test_wake[2.1.328]`) and in every artifacts/e2e-results.jsonl row. Each scenario is a test that can
fail. Artifacts (the mock's request log, pane captures, courier's log) are written to artifacts/e2e/<test>/ for
every run, so a failure explains itself. Tests marked `core` are the version matrix's scenarios: CI runs them on
`latest` and on the oldest supported release too (.ci/run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from e2e import harness
from e2e.mockapi import MockAPI, bash_reply, text_reply

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "e2e"
RESULTS = REPO / "artifacts" / "e2e-results.jsonl"


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"e2e prerequisites missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def claude_bin(claude_version):
    """The entry point of the run's release (claude_version, from conftest.py), installed once per release."""
    if shutil.which("tmux") is None:
        _unavailable("tmux is not installed")
    binary, why = harness.ensure_cli(claude_version)
    if binary is None:
        _unavailable(why)
    return binary


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s: {what}")


class World:
    """One isolated machine-in-a-folder: mail root, Claude config dir, runtime dir, state dir, mock API, courier."""

    def __init__(self, claude_bin: Path, name: str, policy=None):
        self.root = Path(tempfile.mkdtemp(prefix="cre-", dir="/tmp"))
        self.name = name
        runtime = self.root / "rt"
        runtime.mkdir(mode=0o700)
        (self.root / "claude").mkdir()
        self.bin = claude_bin
        self.shared = {
            "CLAUDE_CONFIG_DIR": str(self.root / "claude"),
            "XDG_RUNTIME_DIR": str(runtime),
            "HELM_MAIL_DIR": str(self.root / "mail"),
            "COURIER_STATE_DIR": str(self.root / "state"),
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        }
        self.env = dict(os.environ, **self.shared, HOME=str(self.root / "home"))
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "HELM_MAIL_HANDLE"):
            self.env.pop(k, None)
        self.api = MockAPI(self.root / "api.jsonl", policy)
        self.api.__enter__()
        self.sessions: list[harness.Session] = []
        self.daemon: subprocess.Popen | None = None
        self.daemon_log = self.root / "courier.log"
        self.courier("hooks", "install")

    @property
    def registry(self) -> Path:
        return self.root / "claude" / "sessions"

    @property
    def mail(self) -> Path:
        return self.root / "mail"

    def courier(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "courier", *args], env=self.env, capture_output=True, text=True,
                              check=check, timeout=60)

    def session(self, name: str, *args: str) -> harness.Session:
        return self.start_sessions((name, *args))[0]

    def start_sessions(self, *specs, cls=harness.Session, env: dict | None = None) -> list[harness.Session]:
        """Seed every session's trust entry first: a running claude rewrites .claude.json from memory."""
        made = [cls(self.bin, self.root, spec[0], self.api.port, self.shared, list(spec[1:])) for spec in specs]
        for s in made:
            s.env.update(env or {})
            s.seed()
        for s in made:
            self.sessions.append(s)
            s.start(self.registry)
            wait_until(lambda s=s: self.box_of(s), 15, f"{s.name} to claim a box")
            wait_until(lambda s=s: "❯" in s.capture(), 20, f"{s.name} to show its prompt")
        return made

    def without_waiter(self) -> None:
        """Drop courier's rewake waiter (`… hook wait`) from the hooks `courier hooks install` wrote, leaving the
        socket doorbell and the prompt as the only ways in (as for hooks installed before the waiter existed)."""
        path = self.root / "claude" / "settings.json"
        data = json.loads(path.read_text())
        for event, entries in list(data.get("hooks", {}).items()):
            kept = [e for e in entries
                    if not any(h.get("command", "").endswith(" hook wait") for h in e.get("hooks", []))]
            if kept:
                data["hooks"][event] = kept
            else:
                del data["hooks"][event]
        path.write_text(json.dumps(data, indent=2))

    def box_of(self, s: harness.Session) -> str | None:
        sid = s.record()["sessionId"]
        if not self.mail.exists():
            return None
        for h in os.listdir(self.mail):
            try:
                if json.loads((self.mail / h / "owner.json").read_text()).get("sessionId") == sid:
                    return h
            except (OSError, ValueError):
                continue
        return None

    def start_daemon(self, *args: str) -> None:
        with open(self.daemon_log, "a") as log:  # the daemon keeps its own copy of the descriptor
            self.daemon = subprocess.Popen([sys.executable, "-m", "courier", "run", *args], env=self.env,
                                           stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.events("daemon_ready"), 15, "daemon_ready")

    def events(self, event=None, **match) -> list[dict]:
        out = []
        if not self.daemon_log.exists():
            return out
        for line in self.daemon_log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (event is None or rec.get("event") == event) and all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out

    def turns_with(self, needle: str) -> list[dict]:
        return [t for t in self.api.turns() if needle in json.dumps(t["body"])]

    def close(self) -> None:
        dest = ARTIFACTS / self.name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        for s in self.sessions:
            (dest / f"pane-{s.name}.txt").write_text(s.capture())
            if s.debug.exists():
                shutil.copy(s.debug, dest / f"debug-{s.name}.log")
        if self.daemon is not None:
            if self.daemon.poll() is None:
                self.daemon.send_signal(signal.SIGTERM)
                try:
                    self.daemon.wait(5)
                except subprocess.TimeoutExpired:
                    self.daemon.kill()
                    self.daemon.wait()
        for s in self.sessions:
            s.close()
        self.api.__exit__(None, None, None)
        for f in ("api.jsonl", "courier.log"):
            if (self.root / f).exists():
                shutil.copy(self.root / f, dest / f)
        hooks_log = self.root / "state" / "hooks.log"
        if hooks_log.exists():
            shutil.copy(hooks_log, dest / "hooks.log")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def world(claude_bin, request):
    worlds = []

    def make(policy=None):
        w = World(claude_bin, request.node.name, policy)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.close()


def record(result: dict) -> None:
    """Append one row to artifacts/e2e-results.jsonl, stamped with the release and the test that measured it."""
    row = {**result, "claude_version": harness.CLI_VERSION,
           "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(row) + "\n")


@pytest.mark.core
def test_wake(world):
    """A drop wakes an idle real session: the doorbell starts a turn, the same request carries the notice, the mail is in read/."""
    w = world()
    s = w.session("alpha")
    handle = w.box_of(s)
    w.start_daemon()
    before = len(w.api.turns())
    t0 = time.time()
    path = Path(w.courier("send", handle, "--from", "tester", "--subject", "hello there", "--body",
                          "BODY-NEVER-IN-DOORBELL-4c1d").stdout.strip())
    turn = wait_until(lambda: w.api.turns()[before:] and w.api.turns()[before], 20, "a new turn at the mock")
    latency = turn["at"] - t0
    body = json.dumps(turn["body"])
    assert "[courier doorbell]" in body
    assert "arrived in your mailbox" in body and str(w.mail / handle / "read" / path.name) in body
    assert "BODY-NEVER-IN-DOORBELL" not in body  # neither the doorbell nor the notice carries the body
    wait_until(lambda: (w.mail / handle / "read" / path.name).exists(), 10, "mail moved into read/")
    assert not path.exists()
    sent = w.events("poke_sent", handle=handle)
    assert sent and sent[0]["latency_ms"] > 0 and sent[0]["session_id"] == s.record()["sessionId"]
    record({"scenario": "wake", "drop_to_mock_request_s": round(latency, 3), "poke_latency_ms": sent[0]["latency_ms"]})


def test_idle_stays_idle(world):
    """With nothing sent, no turn starts for 10 s, even while owner.json is rewritten and the registry updates."""
    w = world()
    s = w.session("idle")
    handle = w.box_of(s)
    w.start_daemon()
    before = len(w.api.turns())
    owner = w.mail / handle / "owner.json"
    for _ in range(5):
        owner.write_text(owner.read_text())
        s.record_path.write_text(s.record_path.read_text())
        time.sleep(2)
    assert len(w.api.turns()) == before
    assert not w.events("poke_sent")


def test_pinned_stale_owner_is_not_rung(world):
    """The owner's sessionId no longer matches the session: courier refuses to poke, no turn, mail intact, reason logged."""
    w = world()
    s = w.session("pinned")
    handle = w.box_of(s)
    owner_path = w.mail / handle / "owner.json"
    owner = json.loads(owner_path.read_text())
    owner["sessionId"] = "00000000-dead-beef-0000-000000000000"
    owner_path.write_text(json.dumps(owner))
    w.start_daemon()
    before = len(w.api.turns())
    path = Path(w.courier("send", handle, "--subject", "x", "--body", "y").stdout.strip())
    ev = wait_until(lambda: w.events("session_unreachable", handle=handle), 10, "session_unreachable")
    assert ev[0]["reason"] == "session_replaced"
    time.sleep(3)
    assert len(w.api.turns()) == before
    assert path.exists()


@pytest.mark.core
def test_spawn_posture(world):
    """Bypass sessions: with courier's spawn settings the doorbell wakes them; without, it is held, logged and shown, and delivered at the next prompt.

    The socket posture alone: courier's waiter would wake the held session after the `held` receipt
    (test_waiter_e2e.py::test_held_doorbell_moves_to_the_waiter), so this world runs without it."""
    w = world()
    w.without_waiter()
    spawn = w.courier("spawn-settings").stdout.strip()
    good, bad = w.start_sessions(
        ("bypassok", "--dangerously-skip-permissions", "--settings", spawn),
        ("bypassheld", "--dangerously-skip-permissions"),
    )
    w.start_daemon()
    h_good, h_bad = w.box_of(good), w.box_of(bad)
    w.courier("send", h_good, "--subject", "for good", "--body", "x")
    wait_until(lambda: w.turns_with(h_good + ")"), 20, "the spawn-settings session to wake")
    assert w.events("poke_sent", handle=h_good) and not w.events("poke_receipt", handle=h_good), "accepted: no receipt"
    path = Path(w.courier("send", h_bad, "--subject", "for held", "--body", "x").stdout.strip())
    try:
        receipt = wait_until(lambda: w.events("poke_receipt", handle=h_bad, status="held"), 10, "held receipt")
    except AssertionError as exc:  # say what the daemon decided, and any receipt it could not match
        trail = [(e.get("event"), e.get("reason") or e.get("status"))
                 for e in w.events(handle=h_bad) + w.events("peer_reply_ignored")]
        raise AssertionError(f"{exc}; the daemon's events for {h_bad}: {trail}; pane: {bad.capture()[-600:]!r}") from None
    sent = w.events("poke_sent", handle=h_bad)
    assert sent
    assert not w.events("peer_reply_ignored"), "every receipt matched a poke we sent"
    assert w.events("session_holds_doorbells", handle=h_bad)
    # status reads the daemon's snapshot, written at most once a second
    wait_until(lambda: re.search(rf"{h_bad}.*held", w.courier("status").stdout), 5, "status to show held")
    time.sleep(2)
    assert not w.turns_with(h_bad + ")"), "held session must not start a turn"
    assert path.exists(), "mail stays queued"
    # The person answers the held dialog (Enter = its default, Deny): Claude sends a `denied` receipt.
    assert "Held message" in bad.capture()
    bad.tmux("send-keys", "-t", bad.name, "Enter")
    wait_until(lambda: w.events("poke_receipt", handle=h_bad, status="denied"), 10, "denied receipt")
    time.sleep(0.5)
    bad.type("anything new?")
    wait_until(lambda: w.turns_with(path.name), 20, "delivery at the next prompt")
    wait_until(lambda: (w.mail / h_bad / "read" / path.name).exists(), 10, "consumed")
    record({"scenario": "spawn_posture", "held_receipt_after_poke_s": round(
        _ts(receipt[0]["ts"]) - _ts(sent[0]["ts"]), 3)})


def test_crash_is_a_logged_fallback(world):
    """SIGKILLed session (record and socket stay behind): the next drop is a logged fallback, no hang, daemon alive."""
    w = world()
    s = w.session("crash")
    handle = w.box_of(s)
    sock = s.record()["messagingSocketPath"]
    w.start_daemon()
    s.kill(signal.SIGKILL)
    wait_until(lambda: not os.path.exists(f"/proc/{s.pid}"), 5, "session gone")
    assert os.path.exists(sock) and s.record_path.exists()
    path = Path(w.courier("send", handle, "--subject", "x", "--body", "y").stdout.strip())
    ev = wait_until(lambda: w.events("session_unreachable", handle=handle), 10, "fallback")
    assert ev[0]["reason"] == "pid_dead"
    assert w.daemon.poll() is None and path.exists()


def test_ping_pong_is_capped(world):
    """Two real sessions that answer every notice by `courier send` to each other: the wake cap stops the loop."""
    pair: dict[str, str] = {}

    def policy(body):
        text = json.dumps(body)
        # Answer a notice (not a tool result) by mailing the other side.
        last = body.get("messages", [])[-1] if body.get("messages") else {}
        content = last.get("content")
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return text_reply("sent")
        m = re.search(r"arrived in your mailbox \(([a-z0-9-]+)\)", text)
        if m and m.group(1) in pair:
            return bash_reply(f"courier send {pair[m.group(1)]} --from {m.group(1)} --subject ping --body pong")
        return text_reply("ok")

    w = world(policy)
    spawn = w.courier("spawn-settings").stdout.strip()
    a, b = w.start_sessions(
        ("ping", "--dangerously-skip-permissions", "--settings", spawn),
        ("pong", "--dangerously-skip-permissions", "--settings", spawn),
    )
    ha, hb = w.box_of(a), w.box_of(b)
    pair.update({ha: hb, hb: ha})
    w.start_daemon("--min-poke-interval", "0.5s")
    w.courier("send", ha, "--from", hb, "--subject", "start", "--body", "serve")
    time.sleep(45)
    pokes = {h: len(w.events("poke_sent", handle=h)) for h in (ha, hb)}
    capped = w.events("wake_capped")
    turns = len(w.api.turns())
    record({"scenario": "ping_pong", "window_s": 45, "pokes": pokes, "wake_capped_events": len(capped), "api_requests": turns})
    assert capped, "the cap must stop the loop"
    assert all(n <= 3 for n in pokes.values()), pokes
    assert sum(pokes.values()) >= 4, f"the loop should have run before the cap: {pokes}"
    queued = sum(len([n for n in os.listdir(w.mail / h) if n.endswith(".json") and n != "owner.json"]) for h in (ha, hb))
    assert queued >= 1, "capped mail stays queued"


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_busy_session_absorbs_the_doorbell(world):
    """A doorbell that reaches a session in the middle of a turn is absorbed between tool calls: its prompt hook runs
    and the notice reaches the model in the same turn; no special case in courier."""

    def policy(body):
        last = body.get("messages", [])[-1] if body.get("messages") else {}
        content = last.get("content")
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return text_reply("done")
        if "please work" in json.dumps(body):
            return bash_reply("sleep 6")
        return text_reply("ok")

    w = world(policy)
    spawn = w.courier("spawn-settings").stdout.strip()
    s = w.session("busy", "--dangerously-skip-permissions", "--settings", spawn)
    handle = w.box_of(s)
    w.start_daemon()
    s.type("please work")
    wait_until(lambda: s.record().get("status") == "busy", 15, "the session to be busy")
    wait_until(lambda: w.turns_with("please work"), 10, "the working turn to reach the API")
    path = Path(w.courier("send", handle, "--subject", "while busy", "--body", "x").stdout.strip())
    sent = wait_until(lambda: w.events("poke_sent", handle=handle), 10, "poke while busy")
    assert s.record().get("status") == "busy"
    wait_until(lambda: (w.mail / handle / "read" / path.name).exists(), 30, "delivered within the running turn")
    # The hook ran when the line was absorbed; the model sees its notice in the next request of the turn.
    with_notice = wait_until(lambda: w.turns_with(path.name), 20, "the notice to reach the model")
    assert any("tool_result" in json.dumps(t["body"]) for t in with_notice), "in the same turn, after the tool call"
    record({"scenario": "busy", "poke_latency_ms": sent[0]["latency_ms"]})
