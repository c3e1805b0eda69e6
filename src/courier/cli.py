"""courier's command line: run the daemon, send mail, inspect, and wire Claude Code up.

Trust: handles given on the command line are validated before a path is built;
message bodies are written to disk and never echoed. Heavy imports (trio,
structlog, watchfiles) happen only inside the `run` branch, so `courier hook …`
stays inside its time budget.
Logs: `run` logs through structlog; the other commands print for people.
Limits: `service` drives systemctl/launchctl when present; otherwise it prints the commands.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import config as cfgmod

EXIT_USAGE = 2

DESCRIPTION = """\
courier wakes idle Claude Code sessions when mail lands in their file mailbox.

A sender drops a JSON file into <mail root>/<handle>/; courier sees it, finds the
session that owns the box (owner.json -> Claude Code's session registry), checks
it is alive and really that session, and writes one body-less doorbell line to its
messaging socket. Any failure leaves the mail where it is for the prompt hook.
"""

PATHS_HELP = """\
paths (flags win over environment):
  mail root      --mail-dir, else $HELM_MAIL_DIR, else ~/.helm/mail-<$HELM_DEFAULTS_SUITE>, else ~/.helm/mail
  Claude config  --claude-config-dir, else $CLAUDE_CONFIG_DIR, else ~/.claude (registry: <dir>/sessions)
  state dir      --state-dir, else $COURIER_STATE_DIR, else $XDG_STATE_HOME/courier, else ~/.local/state/courier
"""


def _add_paths(p) -> None:
    g = p.add_argument_group("paths")
    g.add_argument("--mail-dir", metavar="DIR", help="mail root (default: see 'paths' below)")
    g.add_argument("--claude-config-dir", metavar="DIR", help="Claude Code config dir holding sessions/")
    g.add_argument("--state-dir", metavar="DIR", help="courier's own state: lock, wake levels, logs of hooks")


def _duration(text: str) -> float:
    import argparse

    try:
        return cfgmod.parse_duration(text)
    except cfgmod.ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    return value


def build_parser():
    # argparse is imported here, not at module level: `courier hook …` must not pay for it.
    import argparse

    parser = argparse.ArgumentParser(
        prog="courier",
        description=DESCRIPTION,
        epilog=PATHS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run the daemon in the foreground (what systemd/launchd start)",
        description="Watch the mail root and ring the owning session's socket when mail lands. "
        "Logs one JSON object per line on stderr. SIGTERM/SIGINT stop it cleanly; SIGHUP rescans.",
        epilog=PATHS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_paths(run)
    k = run.add_argument_group("tuning")
    k.add_argument("--wake-cap", type=_positive_int, help="max wake level per recipient (default 3)")
    k.add_argument("--wake-half-life", type=_duration, metavar="DUR", help="wake level half-life (default 10m)")
    k.add_argument("--rescan-interval", type=_duration, metavar="DUR", help="safety rescan period (default 60s)")
    k.add_argument("--poke-timeout", type=_duration, metavar="DUR", help="deadline for one doorbell (default 2s)")
    k.add_argument(
        "--outstanding-limit",
        type=_duration,
        metavar="DUR",
        help="ring once more if a doorbell is unanswered this long with mail queued (default 10m)",
    )
    k.add_argument(
        "--min-poke-interval", type=_duration, metavar="DUR", help="at most one poke per session per (default 2s)"
    )
    k.add_argument("--debounce-ms", type=_positive_int, help="watcher debounce (default 20)")
    k.add_argument("--step-ms", type=_positive_int, help="watcher step: latency ~1.5x, idle wakeups 1000/step per second (default 10)")
    k.add_argument("--log-format", choices=["json", "console"], help="default json (console on a TTY)")
    k.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                   help="default info")
    k.add_argument("--config", metavar="FILE", help="TOML settings, re-read on SIGHUP (default "
                   "$COURIER_CONFIG, else $XDG_CONFIG_HOME/courier/config.toml; keys: wake_cap, wake_half_life, "
                   "rescan_interval, poke_timeout, outstanding_limit, min_poke_interval, debounce_ms, step_ms, "
                   "log_level, mail_dir, claude_config_dir, state_dir)")
    k.add_argument("--no-receipts", action="store_true", help="do not listen for Claude Code's delivery receipts")

    send = sub.add_parser(
        "send",
        help="drop a message into a box",
        description="Write a convention message into <mail root>/<HANDLE>/ (temp file + rename, mode 0600) "
        "and print its path. The body comes from --body, --body-file, or stdin.",
        epilog=PATHS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    send.add_argument("handle", metavar="HANDLE")
    send.add_argument("--from", dest="sender", default=None, help="your handle (default $HELM_MAIL_HANDLE or $USER)")
    send.add_argument("--subject", default="", help="one line")
    body = send.add_mutually_exclusive_group()
    body.add_argument("--body", help="the message text")
    body.add_argument("--body-file", metavar="FILE", help="read the message text from FILE ('-' = stdin)")
    send.add_argument("--create", action="store_true", help="allow a handle that has no box yet")
    _add_paths(send)

    status = sub.add_parser("status", help="one line per box: owner, reachability, queue, wake level")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("handles", nargs="*", metavar="HANDLE", help="only these boxes")
    _add_paths(status)
    status.add_argument("--wake-cap", type=_positive_int, default=3, help=argparse.SUPPRESS)
    status.add_argument("--wake-half-life", type=_duration, default=600.0, help=argparse.SUPPRESS)

    hook = sub.add_parser("hook", help="Claude Code hook entry points (reads the hook payload on stdin)")
    hook.add_argument("verb", choices=["claim", "deliver"], help="claim at SessionStart, deliver at UserPromptSubmit")

    hooks = sub.add_parser("hooks", help="install or remove courier's hooks in a Claude Code settings file")
    hooks.add_argument("action", choices=["install", "uninstall", "show"])
    hooks.add_argument("--scope", choices=["user", "project"], default="user")
    hooks.add_argument("--project-dir", metavar="DIR", default=".", help="with --scope project (default .)")
    hooks.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")
    hooks.add_argument("--claude-config-dir", metavar="DIR")

    spawn = sub.add_parser(
        "spawn-settings",
        help="print the path of a settings file for sessions an agent manager spawns",
        description="Write (if needed) a settings file holding {\"crossSessionInbound\": \"accept\"} and print "
        "its path, for `claude --settings <path>`. Sessions started with --dangerously-skip-permissions "
        "otherwise HOLD courier's doorbell behind a dialog nobody sees. It must be --settings (or user "
        "settings): a project settings file can only tighten this policy. Claude Code uses only the LAST "
        "--settings flag, so if you already pass your own file, use --merge FILE to get one combined file.",
    )
    spawn.add_argument("--merge", metavar="FILE", help="your own settings file to combine with ours (left untouched)")
    spawn.add_argument("--with-hooks", action="store_true", help="also include courier's claim/deliver hooks")
    spawn.add_argument("--state-dir", metavar="DIR")

    ex = sub.add_parser(
        "exec",
        help="run claude with courier's spawn settings and a pinned handle",
        description="courier exec [--handle H] -- claude ARGS...: sets HELM_MAIL_HANDLE, adds --settings with "
        "courier's spawn settings (merged with any --settings you pass), then execs the command.",
    )
    ex.add_argument("--handle", help="pin the mailbox handle")
    ex.add_argument("--with-hooks", action="store_true", help="include courier's hooks in the settings")
    ex.add_argument("--state-dir", metavar="DIR")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")

    svc = sub.add_parser("service", help="install, uninstall or show the systemd/launchd user service")
    svc.add_argument("action", choices=["install", "uninstall", "status", "print"])
    svc.add_argument("--dry-run", action="store_true", help="print what would be written and run")

    doc = sub.add_parser("doctor", help="check the setup and explain each problem with a fix")
    _add_paths(doc)

    lg = sub.add_parser("log", help="render courier's JSON log (stdin or a file) for people")
    lg.add_argument("file", nargs="?", default="-", help="log file (default stdin)")
    lg.add_argument("--handle", action="append", help="only events about this handle (repeatable)")
    lg.add_argument("--event", action="append", help="only these events (repeatable)")
    return parser


def _config(args, **knobs) -> cfgmod.Config:
    return cfgmod.from_env(
        mail_dir=getattr(args, "mail_dir", None),
        config_dir=getattr(args, "claude_config_dir", None),
        state=getattr(args, "state_dir", None),
        **knobs,
    )


def cmd_run(args) -> int:
    def load():
        return cfgmod.build(
            config_file=args.config,
            mail_dir=args.mail_dir,
            config_dir=args.claude_config_dir,
            state=args.state_dir,
            **flag_knobs,
        )

    flag_knobs = dict(
        wake_cap=args.wake_cap,
        wake_half_life_s=args.wake_half_life,
        rescan_interval_s=args.rescan_interval,
        poke_timeout_s=args.poke_timeout,
        outstanding_limit_s=args.outstanding_limit,
        session_min_interval_s=args.min_poke_interval,
        debounce_ms=args.debounce_ms,
        step_ms=args.step_ms,
        log_format=args.log_format or ("console" if sys.stderr.isatty() else "json"),
        log_level=args.log_level,
    )
    try:
        cfg = load()
    except cfgmod.ConfigError as exc:
        print(f"courier: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Heavy imports only here: the hook path must not pay for them.
    import trio

    from . import daemon, log

    log.configure(cfg.log_format, cfg.log_level)
    logger = log.get()
    try:
        lock_fd = daemon.acquire_lock(cfg.state_dir)
    except daemon.StartupError as exc:
        logger.error("daemon_start_failed", reason="locked" if exc.code == daemon.EXIT_LOCKED else "environment")
        print(f"courier: {exc}", file=sys.stderr)
        return exc.code
    d = daemon.Daemon(cfg, logger)
    d.reload_config = load  # SIGHUP re-reads the config file; flags still win
    if not args.no_receipts:
        from .receipts import Receipts

        d.receipts = Receipts(d, logger)
    try:
        trio.run(d.run)
    except daemon.StartupError as exc:
        logger.error("daemon_start_failed", reason="environment", detail=str(exc))
        print(f"courier: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 0
    finally:
        os.close(lock_fd)
    return 0


def cmd_send(args) -> int:
    from . import mailbox

    cfg = _config(args)
    handle = args.handle
    if not mailbox.valid_handle(handle):
        print(
            f"courier: {handle!r} is not a valid handle (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    box = cfg.mail_root / handle
    if os.path.islink(box):
        print(f"courier: box {box} is a symlink; refusing to write through it", file=sys.stderr)
        return 1
    if not box.is_dir():
        if not args.create:
            print(
                f"courier: no box for {handle!r} under {cfg.mail_root} (nobody has claimed it). "
                "Check the handle with `courier status`, or pass --create to queue mail for it anyway.",
                file=sys.stderr,
            )
            return 1
        os.makedirs(cfg.mail_root, mode=0o700, exist_ok=True)
        mailbox.ensure_dir(box / mailbox.READ_DIR)
    if args.body is not None:
        body = args.body
    elif args.body_file and args.body_file != "-":
        try:
            raw = Path(args.body_file).read_bytes()
        except OSError as exc:
            print(f"courier: cannot read {args.body_file}: {exc.strerror}", file=sys.stderr)
            return 1
        body = raw.decode("utf-8", "replace")
    else:
        if sys.stdin.isatty():
            print("courier: reading the body from stdin (end with Ctrl-D)", file=sys.stderr)
        body = sys.stdin.buffer.read(mailbox.MAX_MESSAGE_BYTES + 1).decode("utf-8", "replace")
    if len(body.encode("utf-8")) > mailbox.MAX_MESSAGE_BYTES - 4096:
        print(
            f"courier: body is larger than {(mailbox.MAX_MESSAGE_BYTES - 4096) // 1024} KiB; "
            "put large content in a file and send its path instead",
            file=sys.stderr,
        )
        return 1
    sender = args.sender or os.environ.get("HELM_MAIL_HANDLE") or os.environ.get("USER") or "unknown"
    try:
        owner = mailbox.read_owner(box)
        if owner.retired_at is not None:
            print(
                f"courier: warning: {handle!r} is retired (its owner is gone); the mail is queued "
                "but nobody may read it",
                file=sys.stderr,
            )
    except (OSError, mailbox.Unsafe):
        pass
    path = mailbox.drop_message(cfg.mail_root, handle, sender=sender, subject=args.subject, body=body)
    print(path)
    return 0


def cmd_status(args) -> int:
    from . import lockfile, mailbox, report

    try:
        cfg = _config(args, wake_cap=args.wake_cap, wake_half_life_s=args.wake_half_life)
    except cfgmod.ConfigError as exc:
        print(f"courier: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for h in args.handles:
        if not mailbox.valid_handle(h):
            print(f"courier: {h!r} is not a valid handle", file=sys.stderr)
            return EXIT_USAGE
    rows = report.rows(cfg, args.handles or None)
    print(report.render(rows, lockfile.holder(cfg.state_dir), args.json))
    return 0


def cmd_hook(args) -> int:
    from . import hooks

    return hooks.main(args.verb)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "hook" and argv[1] in ("claim", "deliver"):
        # The hot path: runs before every prompt. Skip building the whole parser.
        from . import hooks

        return hooks.main(argv[1])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler = {
        "run": cmd_run,
        "send": cmd_send,
        "status": cmd_status,
        "hook": cmd_hook,
    }.get(args.command)
    if handler is None:
        from . import admin

        return admin.dispatch(args)
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
