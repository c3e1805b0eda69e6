"""Run the real Claude Code CLI as an interactive session in a private tmux server, fully offline.

Every claude process gets its own HOME, CLAUDE_CONFIG_DIR, XDG_RUNTIME_DIR (0700)
and temp dir, and a private tmux server (`tmux -L <name>`); it talks only to the
mock API on 127.0.0.1. Processes are stopped by their recorded pid, never by name.

Which release: COURIER_E2E_CLAUDE_VERSION (default the pinned PINNED_VERSION; `latest`,
or another npm dist-tag, is resolved with `npm view` once per process). Each release is
installed once into .cache/claude-code/<version>/ and its entry point is read from the
package's `bin` field (`bin/claude.exe` on recent releases, `cli.js` on old ones). One
pytest process drives one release: ensure_cli() makes it CLI_VERSION, which seed() writes.

Trust: the version string comes from the environment or npm and is checked against a
    version pattern before it names a directory; the package's `bin` must stay inside it.
Logs: none; failures come back as a reason string (ensure_cli) or an exception.
Limits: npm view 60 s, npm install 600 s, `--version` 60 s; installs of one version are
    serialised by a lock file and land by rename, so a half install is never used.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "@anthropic-ai/claude-code"
PINNED_VERSION = "2.1.328"
# The oldest release whose ordinary sessions have a socket (research/claude-code-versions.md); CI runs it too.
OLDEST_SUPPORTED = "2.1.248"
VERSION_ENV = "COURIER_E2E_CLAUDE_VERSION"
CLI_VERSION = PINNED_VERSION  # the release this process drives; ensure_cli() sets it
CACHE = REPO / ".cache" / "claude-code"
# Kept for older callers: where the pinned release's entry point usually is. The real path comes from package.json.
BINARY = CACHE / PINNED_VERSION / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
FAKE_KEY = "sk-ant-api03-courier-e2e-fake-key-0123456789abcdefghij"

_EXACT = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?")
_TAG = re.compile(r"[a-z][a-z0-9-]{0,40}")
_resolved: dict[str, str] = {}  # requested -> exact, for this process (one npm view per tag per test session)


def requested_version(environ: Mapping[str, str] = os.environ) -> str:
    """What the run asks for: COURIER_E2E_CLAUDE_VERSION, or the pinned release."""
    return environ.get(VERSION_ENV, "").strip() or PINNED_VERSION


def npm_view_version(tag: str) -> str:
    """The exact version npm's dist-tag `tag` points at now (raises RuntimeError when npm cannot say)."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed")
    try:
        proc = subprocess.run(["npm", "view", f"{PACKAGE}@{tag}", "version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"npm view {PACKAGE}@{tag} timed out") from e
    if proc.returncode != 0:
        raise RuntimeError(f"npm view {PACKAGE}@{tag} failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def resolve_version(requested: str, npm_view: Callable[[str], str] = npm_view_version) -> str:
    """An exact version for `requested`: itself if exact, else what npm's dist-tag of that name points at.

    Raises ValueError for a string that is neither, or an npm answer that is not one exact version."""
    requested = requested.strip()
    if _EXACT.fullmatch(requested):
        return requested
    if not _TAG.fullmatch(requested):
        raise ValueError(f"{VERSION_ENV}={requested!r} is neither a version (2.1.328) nor a dist-tag (latest)")
    answer = npm_view(requested).strip()
    if not _EXACT.fullmatch(answer):
        raise ValueError(f"npm answered {answer[:200]!r} for {PACKAGE}@{requested}, not one version")
    return answer


def active_version(environ: Mapping[str, str] = os.environ,
                   npm_view: Callable[[str], str] = npm_view_version) -> str:
    """resolve_version(requested_version()), asked of npm at most once per process for each tag."""
    requested = requested_version(environ)
    if requested not in _resolved:
        _resolved[requested] = resolve_version(requested, npm_view)
    return _resolved[requested]


def install_dir(version: str, cache: Path = CACHE) -> Path:
    """The npm prefix that holds exactly this release: <cache>/<version>."""
    if not _EXACT.fullmatch(version):
        raise ValueError(f"not an exact version: {version!r}")
    return cache / version


def package_dir(prefix: Path) -> Path:
    return prefix / "node_modules" / "@anthropic-ai" / "claude-code"


def binary_from_package(pkg: Path) -> Path:
    """The CLI entry point named by the package's `bin` field (a string, or a map with `claude`)."""
    meta = json.loads((pkg / "package.json").read_text())
    field = meta.get("bin")
    if isinstance(field, dict):
        rel = field.get("claude") or (next(iter(field.values())) if len(field) == 1 else None)
    else:
        rel = field
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"{pkg}/package.json has no usable bin field: {field!r}")
    entry = (pkg / rel).resolve()
    if not entry.is_relative_to(pkg.resolve()):
        raise ValueError(f"{pkg}/package.json bin {rel!r} points outside the package")
    return entry


def version_matches(output: str, version: str) -> bool:
    """`claude --version` prints `<version> (Claude Code)`: the first word must be exactly the version."""
    words = output.split()
    return bool(words) and words[0] == version


def ensure_cli(version: str | None = None, cache: Path = CACHE) -> tuple[Path | None, str]:
    """(path to claude, '') or (None, reason it cannot be had), for `version` (default: the run's, see
    requested_version). Installs it once into <cache>/<version>/ and makes it CLI_VERSION for seed()."""
    global CLI_VERSION
    if version is None:
        try:
            version = active_version()
        except (RuntimeError, ValueError) as e:
            return None, str(e)
    try:
        prefix = install_dir(version, cache)
    except ValueError as e:
        return None, str(e)
    entry, why = _installed(prefix, version)
    if entry is None:
        if shutil.which("npm") is None:
            return None, "npm is not installed"
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / f".lock-{version}", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest may be installing the same release
            entry, why = _installed(prefix, version)
            if entry is None:
                entry, why = _install(prefix, version)
    if entry is None:
        return None, why
    CLI_VERSION = version
    return entry, ""


def _installed(prefix: Path, version: str) -> tuple[Path | None, str]:
    pkg = package_dir(prefix)
    if not (pkg / "package.json").exists():
        return None, f"{version} is not installed in {prefix}"
    try:
        entry = binary_from_package(pkg)
    except (OSError, ValueError) as e:
        return None, str(e)
    if not entry.exists():
        return None, f"{entry} is missing"
    said = _version_output(entry)
    if not version_matches(said, version):
        return None, f"{entry} --version said {said.strip()[:200]!r}, not {version}"
    return entry, ""


def _install(prefix: Path, version: str) -> tuple[Path | None, str]:
    """npm install into a scratch prefix beside the final one, check it, then rename it into place."""
    partial = prefix.with_name(f".partial-{version}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        proc = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(partial),
             f"{PACKAGE}@{version}"],
            capture_output=True, text=True, timeout=600, check=False,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        return None, f"npm install {PACKAGE}@{version} timed out"
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        return None, f"npm install {PACKAGE}@{version} failed: {proc.stderr.strip()[-300:]}"
    entry, why = _installed(partial, version)
    if entry is None:
        shutil.rmtree(partial, ignore_errors=True)
        return None, f"npm installed {PACKAGE}@{version} but {why}"
    shutil.rmtree(prefix, ignore_errors=True)  # only ever a broken install of this same version
    partial.rename(prefix)
    return _installed(prefix, version)


def _version_output(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout


def _version_ok(path: Path, version: str | None = None) -> bool:
    return version_matches(_version_output(path), version or CLI_VERSION)


class Session:
    """One interactive claude in its own tmux server."""

    def __init__(self, binary: Path, root: Path, name: str, api_port: int, shared: dict, args: list[str],
                 version: str | None = None):
        self.binary = binary
        self.version = version  # None: the run's CLI_VERSION, read when seeding
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
            lastOnboardingVersion=self.version or CLI_VERSION,
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
        # env(1) execs claude, so the pane's pid is claude's: close() can stop it even if it never registers.
        self.pid = pane_pid
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
                screen = self.capture()
                if self.record().get("status") in ("idle", None) and ("❯" in screen or ">" in screen):
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
