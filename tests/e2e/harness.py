"""Run the real Claude Code CLI as an interactive session in a private tmux server, fully offline.

Every claude process gets its own HOME, CLAUDE_CONFIG_DIR, XDG_RUNTIME_DIR (0700)
and temp dir, and a private tmux server (`tmux -L <name>`); it talks only to the
mock API on 127.0.0.1. Processes are stopped by their recorded pid, never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI_VERSION = "2.1.328"
CACHE = REPO / ".cache" / "claude-code"
BINARY = CACHE / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
FAKE_KEY = "sk-ant-api03-courier-e2e-fake-key-0123456789abcdefghij"


def ensure_cli() -> tuple[Path | None, str]:
    """(path to claude, '') or (None, reason it cannot be had)."""
    if BINARY.exists() and _version_ok(BINARY):
        return BINARY, ""
    if shutil.which("npm") is None:
        return None, "npm is not installed"
    CACHE.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(CACHE),
         f"@anthropic-ai/claude-code@{CLI_VERSION}"],
        capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0 or not BINARY.exists():
        return None, f"npm install @anthropic-ai/claude-code@{CLI_VERSION} failed: {proc.stderr.strip()[-300:]}"
    if not _version_ok(BINARY):
        return None, "installed claude does not report the pinned version"
    return BINARY, ""


def _version_ok(path: Path) -> bool:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.startswith(CLI_VERSION)


class Session:
    """One interactive claude in its own tmux server."""

    def __init__(self, binary: Path, root: Path, name: str, api_port: int, shared: dict, args: list[str]):
        self.binary = binary
        self.name = name
        self.root = root / name
        self.home = self.root / "home"
        self.cwd = self.root / "work" / name
        self.tmp = self.root / "tmp"
        for d in (self.home, self.cwd, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.config = Path(shared["CLAUDE_CONFIG_DIR"])
        self.runtime = Path(shared["XDG_RUNTIME_DIR"])
        self.socket_name = f"cr-e2e-{os.getpid()}-{name}"
        self.debug = self.root / "debug.log"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.tmp),
            "CLAUDE_CODE_TMPDIR": str(self.tmp),
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{api_port}",
            "ANTHROPIC_API_KEY": FAKE_KEY,
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
            "IS_SANDBOX": "1",
        }
        self.env.update(shared)
        self.args = args
        self.pid: int | None = None
        self.tmux_server_pid: int | None = None

    def seed(self) -> None:
        self.config.mkdir(parents=True, exist_ok=True)
        cfg_file = self.config / ".claude.json"
        data = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        data.update(
            hasCompletedOnboarding=True,
            lastOnboardingVersion=CLI_VERSION,
            theme="dark",
            bypassPermissionsModeAccepted=True,
            hasSeenAutoDefaultNotice=True,
            customApiKeyResponses={"approved": [FAKE_KEY[-20:]], "rejected": []},
        )
        projects = data.setdefault("projects", {})
        projects[str(self.cwd)] = {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
        cfg_file.write_text(json.dumps(data))
        settings = self.config / "settings.json"
        current = json.loads(settings.read_text()) if settings.exists() else {}
        current["skipDangerousModePermissionPrompt"] = True
        settings.write_text(json.dumps(current, indent=2))

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket_name, *args], capture_output=True, text=True, check=check)

    def start(self, registry: Path, timeout: float = 30.0) -> int:
        before = set(os.listdir(registry)) if registry.exists() else set()
        envs = [f"{k}={v}" for k, v in self.env.items()]
        cmd = ["env", "-i", *envs, str(self.binary), "--debug-file", str(self.debug), *self.args]
        self.tmux("new-session", "-d", "-x", "180", "-y", "50", "-c", str(self.cwd), "-s", self.name, *cmd)
        self.tmux_server_pid = int(self.tmux("display-message", "-p", "#{pid}").stdout.strip())
        pane_pid = int(self.tmux("list-panes", "-F", "#{pane_pid}").stdout.strip())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in set(os.listdir(registry)) - before if registry.exists() else ():
                if not name.endswith(".json") or not name[:-5].isdigit():
                    continue
                try:
                    rec = json.loads((registry / name).read_text())
                except (OSError, ValueError):
                    continue
                if rec.get("cwd") == str(self.cwd) and rec.get("messagingSocketPath"):
                    self.pid = rec["pid"]
                    self.record_path = registry / name
                    return self.pid
            time.sleep(0.05)
        raise AssertionError(f"claude {self.name} did not register within {timeout}s (pane pid {pane_pid}):\n{self.capture()}")

    def record(self) -> dict:
        return json.loads(self.record_path.read_text())

    def wait_idle(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.record().get("status") in ("idle", None) and "❯" in self.capture() or ">" in self.capture():
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} never idle:\n{self.capture()}")

    def capture(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name, check=False).stdout

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)
        time.sleep(0.2)
        self.tmux("send-keys", "-t", self.name, "Enter")

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.pid:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        self.kill(signal.SIGTERM)
        if self.pid:
            for _ in range(50):
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                self.kill(signal.SIGKILL)
        self.tmux("kill-server", check=False)
        if self.tmux_server_pid:
            try:
                os.kill(self.tmux_server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
