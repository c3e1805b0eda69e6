"""`courier doctor`: check the setup the way the daemon will meet it, and say how to fix each problem.

Trust: reads the mail root's mode, the registry, settings files and courier's
status snapshot; writes nothing.
Logs: prints for people; exit 1 if something is broken.
Limits: checks the user settings file, not managed or project settings.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

from . import lockfile, mailbox, registry, safeio, state, waiters
from .settings import HOOKS, SettingsError, installed_verbs, read_settings

def cmd_doctor(args) -> int:
    cfg = args.cfg
    problems = 0

    def ok(msg: str) -> None:
        print(f"  ok    {msg}")

    def bad(msg: str, fix: str) -> None:
        nonlocal problems
        problems += 1
        print(f"  FAIL  {msg}\n        fix: {fix}")

    def warn(msg: str, fix: str) -> None:
        print(f"  warn  {msg}\n        fix: {fix}")

    print(f"mail root      {cfg.mail_root}" + "".join(f"\n               {r}" for r in cfg.mail_roots[1:]))
    print(f"Claude config  {cfg.claude_config_dir}")
    print(f"state dir      {cfg.state_dir}")
    for root in cfg.mail_roots:
        try:
            st = os.stat(root)
        except FileNotFoundError:
            warn(f"mail root {root} does not exist yet", "`courier run` creates it (0700)")
            continue
        problem = mailbox.root_problem(st)
        if problem is None:
            ok(f"mail root {root} permissions {stat.S_IMODE(st.st_mode):o}")
        elif "writable" in problem:
            bad(f"mail root {root} is {problem}", f"chmod 700 {shlex.quote(str(root))}")
        else:
            bad(f"mail root {root} is {problem}", f"chown $USER {shlex.quote(str(root))} (or use a root of your own)")

    if os.environ.get("HELM_MAIL_DIR", "").strip().startswith("~"):
        warn(
            f"HELM_MAIL_DIR starts with '~': courier and helm's app expand it to {cfg.mail_root}, but helm's own hook "
            "and pi resolve it relative to each session's directory",
            "set HELM_MAIL_DIR to an absolute path, so every tool finds the same mail root",
        )
    boxes = 0
    for root in cfg.mail_roots:
        try:
            handles, _ = mailbox.list_handles(root)
        except OSError:
            continue
        boxes += len(handles)
        for handle in handles:
            try:
                owner = mailbox.read_owner(root / handle)
                unread = len(mailbox.list_box(root / handle).queued) if owner.retired_at is not None else 0
            except (OSError, ValueError, safeio.Unsafe, mailbox.Damaged):
                continue
            if unread:
                warn(f"{root / handle} is retired with {unread} unread (its {owner.runtime or '?'} owner left)",
                     "nobody will read it there; `courier who` names the live sessions to resend to")
    _check_watch_limits(boxes + len(cfg.mail_roots) + 2, ok, warn)

    holder = lockfile.holder(cfg.state_dir)
    if holder:
        ok(f"daemon running (pid {holder})")
    else:
        bad("daemon not running for this state dir", "courier run (or: courier service install)")

    versions: dict[str, int] = {}
    unsupported: dict[str, list[str]] = {}
    stranded: list[str] = []
    sockets_ok = sockets_missing = 0
    try:
        pids = registry.list_record_names(cfg.registry_dir)
    except OSError:
        pids = []
        warn(f"no session registry at {cfg.registry_dir}", "start a Claude Code session (2.1.224 or later)")
    for name in pids:
        try:
            rec = registry.read_record(cfg.registry_dir, name)
        except (OSError, registry.BadRecord):
            continue
        if registry.check_liveness(rec):
            continue
        versions[rec.version or "?"] = versions.get(rec.version or "?", 0) + 1
        supported, note = registry.support(rec.version, rec.peer_protocol, rec.socket_path is not None)
        if not supported:
            unsupported.setdefault(note, []).append(f"pid {rec.pid} (Claude Code {rec.version or '?'})")
        usable = supported and not registry.vet_socket(rec.socket_path)
        if not usable and not waiters.has_waiter(cfg.state_dir, rec.session_id, registry_dir=cfg.registry_dir,
                                                 pid=rec.pid):
            stranded.append(f"pid {rec.pid}")
        elif rec.socket_path and not registry.vet_socket(rec.socket_path):
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
        for note, who in sorted(unsupported.items()):
            listed = ", ".join(who[:5]) + (f" and {len(who) - 5} more" if len(who) > 5 else "")
            warn(f"courier cannot ring {listed} by socket", note)

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
    except SettingsError as exc:
        settings = {}
        bad(f"{user_settings} is not valid JSON ({exc})", "fix the file; Claude Code ignores a broken one")
    have = installed_verbs(settings)
    missing = [f"{event} {verb}" for event, verb in HOOKS if (event, verb) not in have]
    if missing:
        warn(
            f"courier's hooks are not all in {user_settings} (missing: {', '.join(missing)})",
            "courier hooks install (or pass `courier spawn-settings --with-hooks` to sessions you spawn); "
            "without the waiter (hook wait) a session with no usable socket wakes only at its next prompt",
        )
    else:
        ok("claim, deliver and waiter hooks installed in user settings")
    if stranded:
        warn(
            f"{len(stranded)} live session(s) have neither a usable socket nor a courier waiter: "
            + ", ".join(stranded[:5]) + (f" and {len(stranded) - 5} more" if len(stranded) > 5 else ""),
            "their mail waits for their next prompt; install the waiter (courier hooks install) and start them "
            "again, or give them a socket (see above)",
        )
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


def _check_watch_limits(needed: int, ok, warn) -> None:
    """inotify needs one watch per box: say so before the kernel does."""
    if not sys.platform.startswith("linux"):
        return
    from .watch_inotify import limits

    limit = limits().get("max_user_watches")
    if limit is None:
        return
    if needed * 2 > limit:
        want = max(limit, needed) * 2
        warn(
            f"inotify allows {limit} watches per user and courier needs {needed} (one per box) beside other programs",
            f"sudo sysctl fs.inotify.max_user_watches={want} and keep it with "
            f"'fs.inotify.max_user_watches={want}' in /etc/sysctl.d/90-courier-inotify.conf "
            "(courier polls the boxes it cannot watch meanwhile)",
        )
    else:
        ok(f"inotify watches: {needed} needed of {limit} allowed")


def _held_boxes(state_dir: Path) -> list[str]:
    """Boxes whose last receipt from Claude Code says the doorbell is held (from the daemon's snapshot)."""
    snap = state.read_status(state_dir)
    boxes = snap.get("boxes") if isinstance(snap.get("boxes"), dict) else {}
    return sorted(
        os.path.basename(path) for path, b in boxes.items()
        if isinstance(b, dict) and isinstance(b.get("lastReceipt"), dict)
        and b["lastReceipt"].get("status") == "held" and mailbox.valid_handle(os.path.basename(path))
    )

