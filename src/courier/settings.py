"""Claude Code settings files: install courier's hooks, build spawn settings, exec claude with them.

Trust: edits only the settings file it is pointed at (with a backup), preserving
every key it did not add; writes through a symlinked settings file to its target,
atomically, and refuses a file that would not round-trip. Nothing here reads mail.
Logs: prints for people; exit status says whether something is broken.
Limits: only the LAST `--settings` flag counts in Claude Code, so spawn settings
are always one merged file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import sys
import time
from pathlib import Path

from . import mailbox, paths, safeio

# (event, verb): claim and the waiter at SessionStart, deliver at each prompt, the waiter re-armed
# at every Stop (Claude Code arms one per Stop; the waiter keeps one per session).
HOOKS = (("SessionStart", "claim"), ("SessionStart", "wait"), ("UserPromptSubmit", "deliver"), ("Stop", "wait"))
HOOK_EVENTS = {"SessionStart": "claim", "UserPromptSubmit": "deliver"}  # the two a session cannot do without
# The largest timeout Claude Code keeps as given (about 24.8 days, 2^31 ms; research/claude-code-rewake.md):
# an async hook past its timeout is killed and only re-armed after the next turn.
WAIT_TIMEOUT_S = 2147483

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


def hook_command(verb: str, cmd: list[str] | None = None) -> dict:
    base = " ".join(shlex.quote(c) for c in (cmd or courier_command()))
    if verb == "wait":
        # exec: the waiter is then Claude's own child (one process, not a shell and a python).
        return {"type": "command", "command": f"exec {base} hook wait", "async": True, "asyncRewake": True,
                "timeout": WAIT_TIMEOUT_S}
    return {"type": "command", "command": f"{base} hook {verb}", "timeout": 10}


def hook_entries(cmd: list[str] | None = None) -> dict:
    entries: dict[str, list] = {}
    for event, verb in HOOKS:
        entries.setdefault(event, []).append({"hooks": [hook_command(verb, cmd)]})
    return entries


def _is_ours(entry: object, verb: str) -> bool:
    if not isinstance(entry, dict):
        return False
    for h in entry.get("hooks", []) if isinstance(entry.get("hooks"), list) else []:
        if isinstance(h, dict) and isinstance(h.get("command"), str) and h["command"].endswith(f" hook {verb}"):
            if "courier" in h["command"]:
                return True
    return False


def _is_any_ours(entry: object) -> bool:
    return any(_is_ours(entry, verb) for _event, verb in HOOKS)


def merge_hooks(settings: dict, cmd: list[str] | None = None) -> dict:
    """settings + courier's hook entries, replacing any older courier entries; idempotent."""
    out = json.loads(json.dumps(settings))
    hooks = out.get("hooks")
    if not isinstance(hooks, dict):
        hooks = {}
    for event, entries in hook_entries(cmd).items():
        current = hooks.get(event)
        current = [e for e in current if not _is_any_ours(e)] if isinstance(current, list) else []
        hooks[event] = current + entries
    out["hooks"] = hooks
    return out


def remove_hooks(settings: dict) -> dict:
    out = json.loads(json.dumps(settings))
    hooks = out.get("hooks")
    if not isinstance(hooks, dict):
        return out
    for event in {event for event, _verb in HOOKS}:
        current = hooks.get(event)
        if isinstance(current, list):
            kept = [e for e in current if not _is_any_ours(e)]
            if kept:
                hooks[event] = kept
            else:
                hooks.pop(event, None)
    if not hooks:
        out.pop("hooks", None)
    return out


def installed_verbs(settings: dict) -> set[tuple[str, str]]:
    """Which of courier's (event, verb) hooks a settings dict holds."""
    hooks = settings.get("hooks") if isinstance(settings.get("hooks"), dict) else {}
    return {(event, verb) for event, verb in HOOKS
            if any(_is_ours(e, verb) for e in (hooks.get(event) if isinstance(hooks.get(event), list) else []))}


MAX_SETTINGS_BYTES = 4 << 20
ACCEPT = "accept"
STRICTER = ("hold", "refuse")


class SettingsError(Exception):
    """A settings file courier will not touch: unreadable, not an object, or not round-trippable JSON."""


def read_settings(path: Path) -> dict:
    """The settings file as a dict ({} if absent or empty). Raises SettingsError: a malformed
    file is reported, never overwritten. Follows a symlinked settings file (that is the user's choice)."""
    try:
        raw = safeio.read_bounded(os.path.realpath(path), MAX_SETTINGS_BYTES)
    except FileNotFoundError:
        return {}
    except safeio.Unsafe as exc:
        raise SettingsError(f"{path} is not a plain file courier can read ({exc.reason})") from None
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror}") from None
    if not raw.strip():
        return {}
    try:
        data = safeio.loads(raw)
    except safeio.Unsafe as exc:
        # NaN, 1e999, huge integers: writing them back would produce a file Claude Code rejects whole.
        raise SettingsError(f"{path} is not JSON courier can rewrite faithfully ({exc.reason})") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path} is not a JSON object")
    return data


def write_settings(path: Path, data: dict, backup: bool = True) -> Path | None:
    """Write atomically. A symlinked settings file is written through: the new content replaces
    its target (temp file beside the target, then rename), and the link stays a link."""
    target = Path(os.path.realpath(path))
    payload = safeio.dumps(data)  # raises Unsafe for anything that would not round-trip
    os.makedirs(target.parent, exist_ok=True)
    saved = None
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
        exists = True
    except FileNotFoundError:
        mode, exists = 0o600, False
    if backup and exists:
        saved = target.with_name(f"{target.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}-{safeio.random_hex(2)}")
        safeio.write_bytes_atomic(saved, safeio.read_bounded(target, MAX_SETTINGS_BYTES), mode=mode)
    safeio.write_bytes_atomic(target, payload, mode=mode)
    return saved


def settings_path(args) -> Path:
    if args.scope == "project":
        return Path(args.project_dir).resolve() / ".claude" / "settings.json"
    return Path(paths.claude_config_dir(os.environ, args.claude_config_dir)) / "settings.json"


# ---------------------------------------------------------------- hooks install


def cmd_hooks(args) -> int:
    path = settings_path(args)
    try:
        current = read_settings(path)
    except SettingsError as exc:
        print(f"courier: {exc}. Fix or move it; nothing was changed.", file=sys.stderr)
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


def spawn_settings(state_dir: Path, merge: Path | None = None, with_hooks: bool = False) -> tuple[Path, str | None]:
    """Write (if needed) one settings file for spawned sessions; (its path, a warning or None).

    An explicit `crossSessionInbound` of "hold" or "refuse" in the merged file is the user's
    decision and is kept; the warning says what it costs courier."""
    data: dict = {}
    warning = None
    if merge is not None:
        data = read_settings(merge)
    if with_hooks:
        data = merge_hooks(data)
    theirs = data.get("crossSessionInbound")
    if theirs in STRICTER:
        warning = (
            f'{merge} sets "crossSessionInbound": "{theirs}"; kept. Sessions started with it will '
            + ("hold courier's doorbell behind a dialog" if theirs == "hold" else "refuse courier's doorbell")
            + " when they run with --dangerously-skip-permissions; their mail waits for the next prompt."
        )
    else:
        data["crossSessionInbound"] = ACCEPT
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    if merge is None and not with_hooks:
        name = "spawn-settings.json"
    else:
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
        name = f"spawn-settings-{digest}.json"
    path = state_dir / name
    try:
        if read_settings(path) == data:
            return path, warning
    except SettingsError:
        pass
    safeio.write_json_atomic(path, data)
    return path, warning


def cmd_spawn_settings(args) -> int:
    state = args.cfg.state_dir
    if args.merge and not Path(args.merge).is_file():
        print(f"courier: {args.merge} does not exist", file=sys.stderr)
        return 1
    try:
        path, warning = spawn_settings(state, Path(args.merge) if args.merge else None, args.with_hooks)
    except (SettingsError, safeio.Unsafe, OSError) as exc:
        print(f"courier: cannot merge {args.merge}: {exc}", file=sys.stderr)
        return 1
    if warning:
        print(f"courier: warning: {warning}", file=sys.stderr)
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
    try:
        path, warning = spawn_settings(args.cfg.state_dir, Path(theirs) if theirs else None, args.with_hooks)
    except (SettingsError, safeio.Unsafe, OSError) as exc:
        print(f"courier: cannot merge {theirs}: {exc}", file=sys.stderr)
        return 2
    if warning:
        print(f"courier: warning: {warning}", file=sys.stderr)
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

