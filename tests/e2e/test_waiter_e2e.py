"""End to end: the rewake waiter wakes real Claude Code 2.1.328 sessions that have no usable messaging socket.

Sessions run with `CLAUDE_CODE_HARBOR_KITE=0` (no socket, as on Bedrock/Vertex or old
releases) and courier's hooks plus the waiter at SessionStart and Stop, as issue #15
specifies. The harness, the mock API and the World of test_claude_e2e are used read-only.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import courier
from e2e import harness
from e2e.test_claude_e2e import World, claude_bin, record, wait_until  # noqa: F401 - claude_bin: the fixture

pytestmark = pytest.mark.e2e

WAIT_TIMEOUT = 2147483  # research/claude-code-rewake.md §1: the largest useful whole number of seconds
BODY = "BODY-NEVER-IN-THE-REWAKE-5e2a"


class SocketlessSession(harness.Session):
    """harness.Session that accepts a registry record without `messagingSocketPath`."""

    def start(self, registry: Path, timeout: float = 30.0) -> int:
        before = set(os.listdir(registry)) if registry.exists() else set()
        envs = [f"{k}={v}" for k, v in self.env.items()]
        cmd = ["env", "-i", *envs, str(self.binary), "--debug-file", str(self.debug), *self.args]
        self.tmux("new-session", "-d", "-x", "180", "-y", "50", "-c", str(self.cwd), "-s", self.name, *cmd)
        self.tmux_server_pid = int(self.tmux("display-message", "-p", "#{pid}").stdout.strip())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in (set(os.listdir(registry)) - before) if registry.exists() else ():
                if not name.endswith(".json") or not name[:-5].isdigit():
                    continue
                try:
                    rec = json.loads((registry / name).read_text())
                except (OSError, ValueError):
                    continue
                if rec.get("cwd") == str(self.cwd):
                    self.pid = rec["pid"]
                    self.record_path = registry / name
                    return self.pid
            time.sleep(0.05)
        raise AssertionError(f"claude {self.name} did not register within {timeout}s:\n{self.capture()}")


class WaiterWorld(World):
    """test_claude_e2e's World, with the waiter hooks installed and this tree's courier on every hook's path."""

    def __init__(self, binary: Path, name: str, policy=None):
        super().__init__(binary, name, policy)
        src = str(Path(courier.__file__).resolve().parents[1])  # the tree under test, also for the hooks
        self.shared["PYTHONPATH"] = src
        self.env["PYTHONPATH"] = src
        self.install_waiter()

    @property
    def waiters(self) -> Path:
        return self.root / "state" / "waiters"

    def install_waiter(self) -> None:
        """Add `<courier> hook wait` at SessionStart and Stop, unless `hooks install` already did."""
        path = self.root / "claude" / "settings.json"
        data = json.loads(path.read_text())
        hooks = data.setdefault("hooks", {})
        claim = [h["command"] for e in hooks.get("SessionStart", []) for h in e.get("hooks", [])
                 if h.get("command", "").endswith(" hook claim")]
        assert claim, f"courier hooks install wrote no claim hook: {data}"
        base = claim[0][: -len(" hook claim")]
        entry = {"type": "command", "command": f"{base} hook wait", "async": True, "asyncRewake": True,
                 "timeout": WAIT_TIMEOUT}
        for event in ("SessionStart", "Stop"):
            present = [h for e in hooks.get(event, []) for h in e.get("hooks", [])
                       if h.get("command", "").endswith(" hook wait")]
            if not present:
                hooks.setdefault(event, []).append({"hooks": [entry]})
        path.write_text(json.dumps(data, indent=2))

    def socketless(self, name: str, *args: str) -> SocketlessSession:
        return self.socketless_sessions((name, *args))[0]

    def socketless_sessions(self, *specs) -> list[SocketlessSession]:
        """Sessions with messaging off, so only the waiter can wake them (trust seeded for all before any starts)."""
        return self.start_sessions(*specs, cls=SocketlessSession, env={"CLAUDE_CODE_HARBOR_KITE": "0"})

    def registration(self, pid: int) -> dict | None:
        try:
            return json.loads((self.waiters / f"{pid}.json").read_text())
        except (OSError, ValueError):
            return None

    def waiter_processes(self, claude_pid: int) -> list[int]:
        """Live `courier hook wait` python processes started for this Claude (by $CLAUDE_PID in their environment)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if b"hook" in argv and b"wait" in argv and f"CLAUDE_PID={claude_pid}".encode() in environ:
                found.append(int(entry))
        return found


@pytest.fixture
def waiter_world(claude_bin, request):  # noqa: F811 - the imported fixture, requested by name
    worlds = []

    def make(policy=None):
        w = WaiterWorld(claude_bin, request.node.name, policy)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.close()


@pytest.mark.core
def test_socketless_session_woken_through_its_waiter(waiter_world):
    """HARBOR_KITE=0: no socket, so the daemon rings the waiter; the turn carries the notice and no body, the
    mail ends in read/, exactly one waiter lives afterwards, the session then stays idle, and none is left at exit."""
    w = waiter_world()
    s = w.socketless("nokite")
    assert "messagingSocketPath" not in s.record()
    handle = w.box_of(s)
    first = wait_until(lambda: w.registration(s.pid), 20, "the SessionStart waiter to register")
    assert first["sessionId"] == s.record()["sessionId"]
    w.start_daemon()
    before = len(w.api.turns())
    t0 = time.time()
    path = Path(w.courier("send", handle, "--from", "tester", "--subject", "wake by waiter", "--body", BODY)
                .stdout.strip())
    turn = wait_until(lambda: w.turns_with(path.name), 30, "a turn carrying the notice")[0]
    latency = turn["at"] - t0
    body = json.dumps(turn["body"])
    read_path = str(w.mail / handle / "read" / path.name)
    assert "arrived in your mailbox" in body and read_path in body
    assert "hook blocking error from command" in body  # it came as the rewake notification
    assert BODY not in body
    assert len(w.api.turns()) == before + 1  # one turn, not one per waiter
    wait_until(lambda: Path(read_path).exists(), 10, "mail moved into read/")
    assert not path.exists()
    sent = w.events("poke_sent", handle=handle)
    assert len(sent) == 1 and sent[0]["transport"] == "waiter", sent
    assert not w.events("poke_failed", handle=handle)

    # The rewake turn's UserPromptSubmit finds nothing left: the notice is shown once.
    assert body.count(path.name) == 1, body.count(path.name)
    # The rewake turn's Stop arms a fresh waiter; any duplicates leave at once.
    second = wait_until(lambda: (r := w.registration(s.pid)) and r["waiterPid"] != first["waiterPid"] and r, 20,
                        "a fresh waiter after the rewake turn")
    time.sleep(2)
    assert w.waiter_processes(s.pid) == [second["waiterPid"]]
    # No loop: the woken session sits idle afterwards.
    settled = len(w.api.turns())
    time.sleep(5)
    assert len(w.api.turns()) == settled == before + 1
    record({"scenario": "waiter_wake", "drop_to_mock_request_s": round(latency, 3),
            "ring_to_reply_ms": sent[0]["latency_ms"]})

    # Exit (SIGTERM, as /exit and a closed terminal do): no waiter is left behind.
    s.kill(signal.SIGTERM)
    wait_until(lambda: not w.waiter_processes(s.pid), 10, "no waiter left after the session exits")
    assert not (w.waiters / f"{s.pid}.json").exists()


def test_waiter_leaves_when_its_session_is_sigkilled(waiter_world):
    """SIGKILL sends the waiter nothing; its stdio hangs up and it exits, cleaning its registration."""
    w = waiter_world()
    s = w.socketless("killed")
    reg = wait_until(lambda: w.registration(s.pid), 20, "the waiter to register")
    s.type("hello")  # a turn: its Stop arms a second waiter, which must leave at once
    wait_until(lambda: w.turns_with("hello"), 20, "the typed turn")
    time.sleep(2)
    assert w.waiter_processes(s.pid) == [reg["waiterPid"]]
    t0 = time.monotonic()
    s.kill(signal.SIGKILL)
    wait_until(lambda: not w.waiter_processes(s.pid), 5, "the orphaned waiter to exit")
    gone = time.monotonic() - t0
    assert not (w.waiters / f"{s.pid}.json").exists()
    record({"scenario": "waiter_sigkill", "waiter_gone_after_s": round(gone, 3)})


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _hook_events(w: WaiterWorld, event: str) -> list[dict]:
    path = w.root / "state" / "hooks.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == event:
            out.append(rec)
    return out


def test_mail_during_the_rewake_turn_waits_for_the_next_waiter(waiter_world):
    """Between a waiter's exit and the next Stop the session has no waiter: mail dropped then is held, and rung
    through the new waiter as soon as it registers (not at the next rescan or prompt)."""
    from e2e.mockapi import text_reply

    slow = {"done": False}

    def policy(body):
        if "first-of-two" in json.dumps(body) and not slow["done"]:
            slow["done"] = True
            time.sleep(4)  # the rewake turn is still running when the second message lands
        return text_reply("ok")

    w = waiter_world(policy)
    s = w.socketless("during")
    handle = w.box_of(s)
    first = wait_until(lambda: w.registration(s.pid), 20, "the SessionStart waiter to register")
    w.start_daemon()
    one = Path(w.courier("send", handle, "--subject", "first-of-two", "--body", "x").stdout.strip())
    wait_until(lambda: w.turns_with(one.name), 30, "the first rewake turn to reach the API")
    assert w.registration(s.pid) is None  # its waiter has gone; the turn's Stop has not come yet
    two = Path(w.courier("send", handle, "--subject", "second-of-two", "--body", "y").stdout.strip())
    held = wait_until(lambda: w.events("session_unreachable", handle=handle), 10, "the second message held")
    assert held[-1]["reason"] == "no_socket"
    turn = wait_until(lambda: w.turns_with(two.name), 30, "the second message's rewake turn")[0]
    second = w.registration(s.pid)
    assert second is None or second["waiterPid"] != first["waiterPid"]
    sent = w.events("poke_sent", handle=handle)
    assert [e["transport"] for e in sent] == ["waiter", "waiter"]
    assert "hook blocking error from command" in json.dumps(turn["body"])
    wait_until(lambda: (w.mail / handle / "read" / two.name).exists(), 10, "the second message in read/")
    record({"scenario": "waiter_mail_during_rewake", "held_to_request_s": round(turn["at"] - _ts(held[-1]["ts"]), 3)})


def test_waiter_wake_latency(waiter_world):
    """Five wakes of one idle socketless session: where the time from the drop to the API request goes."""
    from courier import mailbox

    w = waiter_world()
    s = w.socketless("latency")
    handle = w.box_of(s)
    w.start_daemon("--wake-cap", "1000")  # five wakes of one session: this measures latency, not the cap
    rows = []
    previous = None
    for i in range(5):
        reg = wait_until(lambda old=previous: (r := w.registration(s.pid)) and r["waiterPid"] != old and r, 20,
                         "a fresh waiter")
        previous = reg["waiterPid"]
        time.sleep(2.5)  # idle, and past the daemon's per-session pacing (2 s)
        t_drop = time.time()
        path = Path(mailbox.drop_message(w.mail, handle, sender="bench", subject=f"latency {i}", body="z"))
        ring_no = i + 1
        turn = wait_until(lambda name=path.name: w.turns_with(name), 30, f"wake {i}")[0]
        sent = wait_until(lambda n=ring_no: [e for e in w.events("poke_sent", handle=handle) if e["ring"] == n], 5,
                          "poke_sent")[0]
        rung = wait_until(lambda n=ring_no: [e for e in _hook_events(w, "waiter_rung") if e["ring"] == n], 5,
                          "waiter_rung")[0]
        ring_start = _ts(sent["ts"]) - sent["latency_ms"] / 1000
        rows.append({
            "drop_to_ring_ms": round((ring_start - t_drop) * 1000, 1),
            "ring_to_reply_ms": sent["latency_ms"],
            "ring_to_waiter_done_ms": round((rung["at"] - ring_start) * 1000, 1),
            "waiter_done_to_request_ms": round((turn["at"] - rung["at"]) * 1000, 1),
            "drop_to_request_ms": round((turn["at"] - t_drop) * 1000, 1),
        })
    record({"scenario": "waiter_latency", "runs": rows})
    print("\n" + "\n".join(json.dumps(r) for r in rows))
    courier_part = sorted(r["drop_to_ring_ms"] + r["ring_to_waiter_done_ms"] for r in rows)[2]
    assert courier_part < 50, rows


def test_held_doorbell_moves_to_the_waiter(waiter_world):
    """A bypass session without courier's spawn settings holds the socket doorbell; after the `held` receipt the
    same batch is rung through its waiter, which wakes it (the held dialog stays for the person to answer)."""
    w = waiter_world()
    s = w.start_sessions(("bypassheld", "--dangerously-skip-permissions"))[0]
    assert s.record().get("messagingSocketPath")
    handle = w.box_of(s)
    wait_until(lambda: w.registration(s.pid), 20, "the SessionStart waiter to register")
    w.start_daemon()
    path = Path(w.courier("send", handle, "--subject", "held then waiter", "--body", BODY).stdout.strip())
    wait_until(lambda: w.events("poke_receipt", handle=handle, status="held"), 10, "the held receipt")
    turn = wait_until(lambda: w.turns_with(path.name), 20, "the waiter's rewake turn")[0]
    body = json.dumps(turn["body"])
    assert "hook blocking error from command" in body and BODY not in body
    assert [e["transport"] for e in w.events("poke_sent", handle=handle)] == ["socket", "waiter"]
    wait_until(lambda: (w.mail / handle / "read" / path.name).exists(), 10, "consumed")
    assert "Held message" in s.capture()


def test_ping_pong_through_waiters_is_capped(waiter_world):
    """Two socketless sessions that answer every notice by mailing each other, woken only through their waiters:
    the wake cap (per session, across transports; a rewake turn is not an operator turn) stops the loop."""
    import re

    from e2e.mockapi import bash_reply, text_reply

    pair: dict[str, str] = {}

    def policy(body):
        last = body.get("messages", [])[-1] if body.get("messages") else {}
        content = last.get("content")
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return text_reply("sent")
        m = re.search(r"arrived in your mailbox \(([a-z0-9-]+)\)", json.dumps(body))
        if m and m.group(1) in pair:
            return bash_reply(f"courier send {pair[m.group(1)]} --from {m.group(1)} --subject ping --body pong")
        return text_reply("ok")

    w = waiter_world(policy)
    a, b = w.socketless_sessions(("wping", "--dangerously-skip-permissions"), ("wpong", "--dangerously-skip-permissions"))
    ha, hb = w.box_of(a), w.box_of(b)
    pair.update({ha: hb, hb: ha})
    for s in (a, b):
        wait_until(lambda s=s: w.registration(s.pid), 20, f"{s.name}'s waiter")
    w.start_daemon("--min-poke-interval", "0.5s")
    w.courier("send", ha, "--from", hb, "--subject", "start", "--body", "serve")
    time.sleep(40)
    pokes = {h: len(w.events("poke_sent", handle=h)) for h in (ha, hb)}
    transports = {e["transport"] for e in w.events("poke_sent")}
    capped = w.events("wake_capped")
    record({"scenario": "waiter_ping_pong", "window_s": 40, "pokes": pokes, "wake_capped_events": len(capped),
            "api_requests": len(w.api.turns())})
    assert transports == {"waiter"}, transports
    assert capped, "the cap must stop the loop"
    assert all(n <= 3 for n in pokes.values()), pokes
    assert sum(pokes.values()) >= 4, f"the loop should have run before the cap: {pokes}"
    queued = sum(len([n for n in os.listdir(w.mail / h) if n.endswith(".json") and n != "owner.json"]) for h in (ha, hb))
    assert queued >= 1, "capped mail stays queued"
