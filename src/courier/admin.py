"""Operator and integration commands: hooks install, spawn settings, exec, service, doctor, log.

Trust: edits only the settings file it is pointed at (with a backup), courier's
own state dir, and the user's service manager directory; preserves every key it
did not add. Nothing here reads mail content.
Logs: prints for people; exit status says whether something is broken.
Limits: `service install` needs systemctl (Linux) or launchctl (macOS); without
them it writes the unit and prints the exact commands to run.
"""

from __future__ import annotations

import hashlib
import json
import os
import plistlib
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from . import config as cfgmod
from . import lockfile, mailbox, registry

HOOK_EVENTS = {"SessionStart": "claim", "UserPromptSubmit": "deliver"}
LAUNCHD_LABEL = "dev.courier.daemon"
SYSTEMD_UNIT = "courier.service"


# ---------------------------------------------------------------- helpers


def courier_command() -> list[str]:
    """How a hook or a unit should invoke this installed courier: absolute paths only."""
    script = Path(sys.executable).parent / "courier"
    if script.exists():
        return [str(script)]
    found = shutil.which("courier")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "courier"]


def hook_entries(cmd: list[str] | None = None) -> dict:
    cmd = cmd or courier_command()
    base = " ".join(shlex.quote(c) for c in cmd)
    return {
        event: [{"hooks": [{"type": "command", "command": f"{base} hook {verb}", "timeout": 10}]}]
        for event, verb in HOOK_EVENTS.items()
    }


def _is_ours(entry: object, verb: str) -> bool:
    if not isinstance(entry, dict):
        return False
    for h in entry.get("hooks", []) if isinstance(entry.get("hooks"), list) else []:
        if isinstance(h, dict) and isinstance(h.get("command"), str) and h["command"].endswith(f" hook {verb}"):
            if "courier" in h["command"]:
                return True
    return False


def merge_hooks(settings: dict, cmd: list[str] | None = None) -> dict:
    """settings + courier's two hook entries, replacing any older courier entries; idempotent."""
    out = json.loads(json.dumps(settings))
    hooks = out.get("hooks")
    if not isinstance(hooks, dict):
        hooks = {}
    for event, entries in hook_entries(cmd).items():
        verb = HOOK_EVENTS[event]
        current = hooks.get(event)
        current = [e for e in current if not _is_ours(e, verb)] if isinstance(current, list) else []
        hooks[event] = current + entries
    out["hooks"] = hooks
    return out


def remove_hooks(settings: dict) -> dict:
    out = json.loads(json.dumps(settings))
    hooks = out.get("hooks")
    if not isinstance(hooks, dict):
        return out
    for event, verb in HOOK_EVENTS.items():
        current = hooks.get(event)
        if isinstance(current, list):
            kept = [e for e in current if not _is_ours(e, verb)]
            if kept:
                hooks[event] = kept
            else:
                hooks.pop(event, None)
    if not hooks:
        out.pop("hooks", None)
    return out


def read_settings(path: Path) -> dict:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    if not raw.strip():
        return {}
    data = json.loads(raw)  # a malformed file is an error for the caller to report, never overwritten
    if not isinstance(data, dict):
        raise ValueError("settings file is not a JSON object")
    return data


def write_settings(path: Path, data: dict, backup: bool = True) -> Path | None:
    saved = None
    os.makedirs(path.parent, exist_ok=True)
    if backup and path.exists():
        saved = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(path, saved)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    try:
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
    except FileNotFoundError:
        os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return saved


def settings_path(args) -> Path:
    if args.scope == "project":
        return Path(args.project_dir).resolve() / ".claude" / "settings.json"
    return cfgmod.claude_config_dir(os.environ, args.claude_config_dir) / "settings.json"


# ---------------------------------------------------------------- hooks install


def cmd_hooks(args) -> int:
    path = settings_path(args)
    try:
        current = read_settings(path)
    except (ValueError, OSError) as exc:
        print(f"courier: cannot read {path}: {exc}. Fix or move it; nothing was changed.", file=sys.stderr)
        return 1
    if args.action == "show":
        print(json.dumps(hook_entries(), indent=2))
        return 0
    new = merge_hooks(current) if args.action == "install" else remove_hooks(current)
    if args.dry_run:
        print(f"# would write {path}")
        print(json.dumps(new, indent=2))
        return 0
    if new == current:
        print(f"courier: {path} already {'has' if args.action == 'install' else 'lacks'} courier's hooks; unchanged")
        return 0
    saved = write_settings(path, new)
    verb = "installed into" if args.action == "install" else "removed from"
    print(f"courier: hooks {verb} {path}" + (f" (backup: {saved})" if saved else ""))
    return 0


# ---------------------------------------------------------------- spawn settings


def spawn_settings(state_dir: Path, merge: Path | None = None, with_hooks: bool = False) -> Path:
    """Write (if needed) one settings file for spawned sessions and return its path."""
    data: dict = {}
    if merge is not None:
        data = read_settings(merge)
    if with_hooks:
        data = merge_hooks(data)
    data["crossSessionInbound"] = "accept"
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    if merge is None and not with_hooks:
        name = "spawn-settings.json"
    else:
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        name = f"spawn-settings-{digest}.json"
    path = state_dir / name
    try:
        if read_settings(path) == data:
            return path
    except (ValueError, OSError):
        pass
    mailbox.write_json_atomic(path, data)
    return path


def cmd_spawn_settings(args) -> int:
    state = cfgmod.state_dir(os.environ, args.state_dir)
    if args.merge and not Path(args.merge).is_file():
        print(f"courier: {args.merge} does not exist", file=sys.stderr)
        return 1
    try:
        path = spawn_settings(state, Path(args.merge) if args.merge else None, args.with_hooks)
    except (ValueError, OSError) as exc:
        print(f"courier: cannot merge {args.merge}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_exec(args) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("courier: usage: courier exec [--handle H] -- claude ARGS...", file=sys.stderr)
        return 2
    theirs = None
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--settings" and i + 1 < len(argv):
            theirs = argv[i + 1]  # only the last one counts in Claude Code; so it is here
            i += 2
            continue
        if a.startswith("--settings="):
            theirs = a.split("=", 1)[1]
            i += 1
            continue
        rest.append(a)
        i += 1
    if theirs is not None and theirs.lstrip().startswith("{"):
        print("courier: exec cannot merge inline JSON --settings; pass a file", file=sys.stderr)
        return 2
    if theirs is not None and not Path(theirs).is_file():
        print(f"courier: --settings file {theirs} does not exist", file=sys.stderr)
        return 2
    state = cfgmod.state_dir(os.environ, args.state_dir)
    try:
        path = spawn_settings(state, Path(theirs) if theirs else None, args.with_hooks)
    except (ValueError, OSError) as exc:
        print(f"courier: cannot merge {theirs}: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.handle:
        if not mailbox.valid_handle(mailbox.slug(args.handle)) or mailbox.slug(args.handle) in mailbox.RESERVED_HANDLES:
            print(f"courier: {args.handle!r} cannot be a handle", file=sys.stderr)
            return 2
        env["HELM_MAIL_HANDLE"] = args.handle
    # Appended (before any `--`), so it is the last --settings, the only one Claude Code honours.
    cut = rest.index("--") if "--" in rest else len(rest)
    final = rest[:cut] + ["--settings", str(path)] + rest[cut:]
    try:
        os.execvpe(final[0], final, env)
    except OSError as exc:
        print(f"courier: cannot run {final[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


# ---------------------------------------------------------------- service


def systemd_unit(cmd: list[str]) -> str:
    template = (Path(__file__).parent / "data" / "courier.service").read_text()
    return template.replace("@COURIER@", " ".join(shlex.quote(c) for c in cmd))


def launchd_plist(cmd: list[str], home: Path) -> bytes:
    template = (Path(__file__).parent / "data" / f"{LAUNCHD_LABEL}.plist").read_bytes()
    data = plistlib.loads(template)
    data["ProgramArguments"] = cmd + ["run"]
    logs = home / "Library" / "Logs" / "courier"
    data["StandardErrorPath"] = str(logs / "courier.log")
    data["StandardOutPath"] = str(logs / "courier.out")
    return plistlib.dumps(data)


def cmd_service(args) -> int:
    cmd = courier_command()
    home = Path.home()
    if sys.platform == "darwin":
        target = home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        content = launchd_plist(cmd, home)
        uid = os.getuid()
        up = [["launchctl", "bootstrap", f"gui/{uid}", str(target)]]
        down = [["launchctl", "bootout", f"gui/{uid}/{LAUNCHD_LABEL}"]]
        show = [["launchctl", "print", f"gui/{uid}/{LAUNCHD_LABEL}"]]
        tool = "launchctl"
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
        target = Path(xdg) / "systemd" / "user" / SYSTEMD_UNIT
        content = systemd_unit(cmd).encode()
        up = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]]
        down = [["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]]
        show = [["systemctl", "--user", "status", SYSTEMD_UNIT]]
        tool = "systemctl"
    if args.action == "print":
        sys.stdout.write(content.decode())
        return 0
    steps = {"install": up, "uninstall": down, "status": show}[args.action]
    if args.action == "install":
        if args.dry_run:
            print(f"# would write {target}")
        elif not (target.exists() and target.read_bytes() == content):
            os.makedirs(target.parent, exist_ok=True)
            target.write_bytes(content)
            print(f"courier: wrote {target}")
        else:
            print(f"courier: {target} is up to date")
    available = shutil.which(tool) is not None and (tool != "systemctl" or _user_manager_up())
    if args.dry_run or not available:
        if not args.dry_run:
            print(f"courier: {tool} is not available here (no user service manager); run these yourself:")
        for step in steps:
            print("  " + " ".join(shlex.quote(s) for s in step))
        if args.action == "uninstall" and not args.dry_run:
            print(f"  rm {shlex.quote(str(target))}")
        return 0 if args.dry_run else 1
    rc = 0
    for step in steps:
        proc = subprocess.run(step)
        rc = rc or proc.returncode
        if proc.returncode and args.action != "status":
            print(f"courier: `{' '.join(step)}` failed ({proc.returncode})", file=sys.stderr)
            return proc.returncode
    if args.action == "uninstall":
        try:
            target.unlink()
            print(f"courier: removed {target}")
        except FileNotFoundError:
            pass
    return rc


def _user_manager_up() -> bool:
    try:
        proc = subprocess.run(
            ["systemctl", "--user", "is-system-running"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.stdout.strip() not in ("", "offline") and "Failed to connect" not in proc.stderr


# ---------------------------------------------------------------- doctor


def cmd_doctor(args) -> int:
    cfg = cfgmod.from_env(mail_dir=args.mail_dir, config_dir=args.claude_config_dir, state=args.state_dir)
    problems = 0

    def ok(msg: str) -> None:
        print(f"  ok    {msg}")

    def bad(msg: str, fix: str) -> None:
        nonlocal problems
        problems += 1
        print(f"  FAIL  {msg}\n        fix: {fix}")

    def warn(msg: str, fix: str) -> None:
        print(f"  warn  {msg}\n        fix: {fix}")

    print(f"mail root      {cfg.mail_root}")
    print(f"Claude config  {cfg.claude_config_dir}")
    print(f"state dir      {cfg.state_dir}")
    try:
        st = os.stat(cfg.mail_root)
        if st.st_mode & 0o022:
            bad(
                f"mail root is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})",
                f"chmod 700 {shlex.quote(str(cfg.mail_root))}",
            )
        elif st.st_uid != os.getuid():
            bad("mail root is owned by another user", f"chown $USER {shlex.quote(str(cfg.mail_root))}")
        else:
            ok(f"mail root permissions {stat.S_IMODE(st.st_mode):o}")
    except FileNotFoundError:
        warn("mail root does not exist yet", "`courier run` creates it (0700)")

    holder = lockfile.holder(cfg.state_dir)
    if holder:
        ok(f"daemon running (pid {holder})")
    else:
        bad("daemon not running for this state dir", "courier run (or: courier service install)")

    versions: dict[str, int] = {}
    sockets_ok = sockets_missing = 0
    try:
        pids = registry.list_record_pids(cfg.registry_dir)
    except OSError:
        pids = []
        warn(f"no session registry at {cfg.registry_dir}", "start a Claude Code session (2.1.224 or later)")
    for pid in pids:
        try:
            rec = registry.read_record(cfg.registry_dir, pid)
        except (OSError, registry.BadRecord):
            continue
        if registry.liveness_problem(rec, registry.live_start_of(rec), registry.own_pid_domain()):
            continue
        versions[rec.version or "?"] = versions.get(rec.version or "?", 0) + 1
        if rec.socket_path and not registry.vet_socket(rec.socket_path):
            sockets_ok += 1
        else:
            sockets_missing += 1
    if pids:
        seen = ", ".join(f"{v} x{n}" for v, n in sorted(versions.items())) or "none live"
        ok(f"live Claude Code sessions: {seen}")
        if sockets_missing:
            warn(
                f"{sockets_missing} live session(s) have no usable messaging socket",
                "they still get mail at their next prompt; check CLAUDE_CODE_HARBOR_KITE and the provider "
                "(some providers start sessions without a socket)",
            )
        elif sockets_ok:
            ok(f"{sockets_ok} session socket(s) present and vetted")

    kite = os.environ.get("CLAUDE_CODE_HARBOR_KITE")
    if kite is not None and kite.strip().lower() not in ("1", "true", "yes", "on"):
        bad(
            f"CLAUDE_CODE_HARBOR_KITE={kite!r} turns Claude Code's messaging socket off",
            "unset CLAUDE_CODE_HARBOR_KITE in the environment sessions start from",
        )
    else:
        ok("CLAUDE_CODE_HARBOR_KITE not disabling messaging")

    user_settings = cfg.claude_config_dir / "settings.json"
    try:
        settings = read_settings(user_settings)
    except (ValueError, OSError) as exc:
        settings = {}
        bad(f"{user_settings} is not valid JSON ({exc})", "fix the file; Claude Code ignores a broken one")
    hooks = settings.get("hooks") if isinstance(settings.get("hooks"), dict) else {}
    missing = [
        ev for ev, verb in HOOK_EVENTS.items() if not any(_is_ours(e, verb) for e in hooks.get(ev, []) or [])
    ]
    if missing:
        warn(
            f"courier's hooks are not in {user_settings} ({', '.join(missing)} missing)",
            "courier hooks install (or pass `courier spawn-settings --with-hooks` to sessions you spawn)",
        )
    else:
        ok("claim and deliver hooks installed in user settings")
    held = _held_boxes(cfg.state_dir)
    if held:
        bad(
            f"sessions holding courier's doorbell (held receipts): {', '.join(held[:10])}"
            + (f" and {len(held) - 10} more" if len(held) > 10 else ""),
            "start them with `claude --settings $(courier spawn-settings)` or set "
            '"crossSessionInbound": "accept" in their user settings',
        )
    inbound = settings.get("crossSessionInbound")
    if inbound == "accept":
        ok('user settings accept doorbells in bypass sessions (crossSessionInbound: "accept")')
    else:
        warn(
            "sessions started with --dangerously-skip-permissions will HOLD courier's doorbell "
            f"(crossSessionInbound is {inbound!r} in user settings)",
            "spawn them with `claude --settings $(courier spawn-settings)`; the daemon logs "
            "`session_holds_doorbells` and `courier status` shows `held` when this happens",
        )
    print("doctor: " + ("all good" if not problems else f"{problems} problem(s)"))
    return 1 if problems else 0


def _held_boxes(state_dir: Path) -> list[str]:
    """Boxes whose last receipt from Claude Code says the doorbell is held (from the daemon's snapshot)."""
    try:
        snap = mailbox.read_json_object(state_dir / "status.json", 32 << 20)
    except (OSError, mailbox.Unsafe):
        return []
    boxes = snap.get("boxes") if isinstance(snap.get("boxes"), dict) else {}
    return sorted(
        h for h, b in boxes.items()
        if mailbox.valid_handle(h) and isinstance(b, dict) and isinstance(b.get("lastReceipt"), dict)
        and b["lastReceipt"].get("status") == "held"
    )


# ---------------------------------------------------------------- log


def cmd_log(args) -> int:
    stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8", errors="replace")
    handles = set(args.handle or [])
    events = set(args.event or [])
    try:
        for raw in stream:
            raw = raw.strip()
            if not raw:
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # journal noise, not ours
            if not isinstance(rec, dict):
                continue
            if handles and rec.get("handle") not in handles:
                continue
            if events and rec.get("event") not in events:
                continue
            ts = str(rec.pop("ts", ""))[:23]
            level = str(rec.pop("level", ""))
            event = str(rec.pop("event", ""))
            handle = rec.pop("handle", None)
            rest = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) and ' ' in v else v}" for k, v in rec.items() if v is not None)
            head = f"{ts} {level:<7} {event:<22}"
            print(f"{head} {handle + ' ' if handle else ''}{rest}".rstrip())
    except BrokenPipeError:
        return 0
    finally:
        if stream is not sys.stdin:
            stream.close()
    return 0


def dispatch(args) -> int:
    return {
        "hooks": cmd_hooks,
        "spawn-settings": cmd_spawn_settings,
        "exec": cmd_exec,
        "service": cmd_service,
        "doctor": cmd_doctor,
        "log": cmd_log,
    }[args.command](args)
