"""courier's command line: one table of commands, each building its configuration the same way.

Trust: handles given on the command line are validated before a path is built;
message bodies are written to disk and never echoed; arguments that are not
valid UTF-8 are refused in one line. Heavy imports (trio, structlog, watchfiles)
happen only inside the `run` branch, and `courier hook …` skips argparse entirely,
so a hook stays inside its time budget.
Logs: `run` logs through structlog; the other commands print for people.
Limits: `service` drives systemctl/launchctl when present; otherwise it prints the commands.
"""

from __future__ import annotations

import os
import sys

EXIT_USAGE = 2
HOOK_VERBS = ("claim", "deliver", "wait")

DESCRIPTION = """\
courier wakes idle Claude Code sessions when mail lands in their file mailbox.

A sender drops a JSON file into <mail root>/<handle>/; courier sees it, finds the
session that owns the box (owner.json -> Claude Code's session registry), checks
it is alive and really that session, and writes one body-less doorbell line to its
messaging socket. Any failure leaves the mail where it is for the prompt hook.
"""

PATHS_HELP = """\
paths (flags win over the config file, which wins over the environment):
  mail root      --mail-dir, else $HELM_MAIL_DIR, else ~/.helm/mail-<$HELM_DEFAULTS_SUITE>, else ~/.helm/mail;
                 with neither flag nor $HELM_MAIL_DIR, `run` also serves every other ~/.helm/mail-<suite>
  Claude config  --claude-config-dir, else $CLAUDE_CONFIG_DIR, else ~/.claude (registry: <dir>/sessions)
  state dir      --state-dir, else $COURIER_STATE_DIR, else $XDG_STATE_HOME/courier, else ~/.local/state/courier
  config file    --config, else $COURIER_CONFIG, else $XDG_CONFIG_HOME/courier/config.toml
"""


def _add_paths(p) -> None:
    g = p.add_argument_group("paths")
    g.add_argument("--mail-dir", metavar="DIR", action="append",
                   help="mail root (default: see 'paths' below); repeat it to serve several roots, the first primary")
    g.add_argument("--claude-config-dir", metavar="DIR", help="Claude Code config dir holding sessions/")
    g.add_argument("--state-dir", metavar="DIR", help="courier's own state: lock, wake levels, logs of hooks")
    g.add_argument("--config", metavar="FILE", help="TOML settings (see `courier run --help`)")


def _duration(text: str) -> float:
    import argparse

    from . import config as cfgmod

    try:
        return cfgmod.parse_duration(text)
    except cfgmod.ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _whole(text: str) -> int:
    import argparse

    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _sub(sub, name: str, help: str, description: str | None = None, paths: bool = True):
    import argparse

    p = sub.add_parser(name, help=help, description=description or help, epilog=PATHS_HELP if paths else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    if paths:
        _add_paths(p)
    return p


def build_parser():
    # argparse is imported here, not at module level: `courier hook …` must not pay for it.
    import argparse

    parser = argparse.ArgumentParser(prog="courier", description=DESCRIPTION, epilog=PATHS_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = _sub(sub, "run", "run the daemon in the foreground (what systemd/launchd start)",
               "Watch the mail root and ring the owning session's socket when mail lands. Logs one JSON object "
               "per line on stderr. SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the config file and rescans.")
    k = run.add_argument_group("tuning (also settable in the config file)")
    k.add_argument("--wake-cap", type=_whole, help="max wake level per recipient session (default 3)")
    k.add_argument("--wake-half-life", type=_duration, metavar="DUR", help="wake level half-life (default 10m)")
    k.add_argument("--rescan-interval", type=_duration, metavar="DUR", help="safety rescan period (default 60s)")
    k.add_argument("--poke-timeout", type=_duration, metavar="DUR", help="deadline for one doorbell (default 2s)")
    k.add_argument("--outstanding-limit", type=_duration, metavar="DUR",
                   help="ring once more if a doorbell is unanswered this long with mail queued (default 10m)")
    k.add_argument("--min-poke-interval", type=_duration, metavar="DUR",
                   help="at most one wake per session per (default 2s)")
    k.add_argument("--watcher", choices=["auto", "inotify", "watchfiles"],
                   help="kernel events: inotify in courier's own loop (Linux), or watchfiles (portable); default auto")
    k.add_argument("--debounce-ms", type=_whole, help="watchfiles backend: debounce (default 20)")
    k.add_argument("--step-ms", type=_whole,
                   help="watchfiles backend: step; latency ~1.5x, idle wakeups 1000/step per second (default 10)")
    k.add_argument("--log-format", choices=["json", "console"], help="default json (console on a TTY)")
    k.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="default info")
    k.add_argument("--no-receipts", action="store_true", help="do not listen for Claude Code's delivery receipts")

    send_description = """\
Write one message into the box TARGET names (temp file + rename, mode 0600) and
print its path. The body comes from --body, --body-file FILE, or stdin (no body
flag, or --body-file -).

TARGET is tried in this order; courier says on stderr which rule matched:
  handle          a box of exactly that name (e.g. api-3f2a)
  path            contains '/' or starts with '.' or '~': the live session(s)
                  whose working directory is that directory, else its git
                  worktree root; compared after resolving '~', symlinks and
                  (where the file system ignores case) case
  session id      a prefix of at least 6 characters of one live session's id
Several matches are refused unless --all (one message, own file and id, each).
A retired box is refused; courier names the live box of the same session, or
else of the same directory, if there is one. No match: exit 2 with the closest.

Secret check: before anything is written the subject and body are scanned for
shapes of live credentials (private-key blocks, cloud access keys, provider API
tokens such as sk-ant-/sk-/ghp_/xox-, JWTs, password=/token= assignments with
random-looking values, .env blocks). A hit refuses the send with exit 3, naming
the shape and the line, never the value; --allow-secret sends anyway. This is a
backstop for accidental pastes, not a control: it knows only those shapes, and
delivery copies a message into the recipient's transcript, which no cleanup
reaches. A secret that was sent must be rotated, not deleted.

exit status: 0 sent; 1 nothing written (I/O error, too large); 2 bad arguments,
no match, several matches without --all, retired box; 3 a secret shape found.
"""
    send = _sub(sub, "send", "drop a message into the box of a handle, a directory, or a session-id prefix",
                send_description)
    send.add_argument("target", metavar="TARGET", help="a handle, a path, or a session-id prefix (>= 6 chars)")
    send.add_argument("--from", dest="sender", default=None,
                      help="your handle (default $HELM_MAIL_HANDLE, else this session's box, else $USER)")
    send.add_argument("--subject", default="", help="one line")
    body = send.add_mutually_exclusive_group()
    body.add_argument("--body", help="the message text")
    body.add_argument("--body-file", metavar="FILE", help="read the message text from FILE ('-' = stdin)")
    send.add_argument("--all", action="store_true", help="TARGET matches several sessions: send one message to each")
    send.add_argument("--create", action="store_true", help="allow a handle that has no box yet")
    send.add_argument("--allow-secret", action="store_true",
                      help="send even if the subject or body looks like a live credential (see above)")
    send.add_argument("--json", action="store_true",
                      help="print {path, id, handle, rule} (a list with --all) instead of the path")

    who = _sub(sub, "who", "list addressable sessions: handle, runtime, cwd, live or not, how it wakes, queued mail",
               "One row per box: its handle, runtime, state (live, dead, retired, unowned), how it can be woken now "
               "(socket: courier rings it; waiter: a courier waiter in the session; prompt only: shown at its next "
               "prompt; self: pi watches its own box; none: nobody lives there), queued mail, session id and "
               "working directory. With TARGET, only what TARGET resolves to, by exactly the rules `courier send` "
               "uses (see `courier send --help`); exit 2 if it matches nothing.")
    who.add_argument("target", nargs="?", metavar="TARGET", help="a path, handle or session-id prefix")
    who.add_argument("--json", action="store_true", help="machine-readable output")

    status = _sub(sub, "status", "one line per box: owner, reachability, queue, wake level")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("handles", nargs="*", metavar="HANDLE", help="only these boxes")

    hook = sub.add_parser("hook", help="Claude Code hook entry points (reads the hook payload on stdin)")
    hook.add_argument("verb", choices=list(HOOK_VERBS), help="claim at SessionStart, deliver at UserPromptSubmit")

    hooks = _sub(sub, "hooks", "install or remove courier's hooks in a Claude Code settings file")
    hooks.add_argument("action", choices=["install", "uninstall", "show"])
    hooks.add_argument("--scope", choices=["user", "project"], default="user")
    hooks.add_argument("--project-dir", metavar="DIR", default=".", help="with --scope project (default .)")
    hooks.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")

    spawn = _sub(sub, "spawn-settings", "print the path of a settings file for sessions an agent manager spawns",
                 "Write (if needed) a settings file holding {\"crossSessionInbound\": \"accept\"} and print its path, "
                 "for `claude --settings <path>`. Sessions started with --dangerously-skip-permissions otherwise "
                 "HOLD courier's doorbell behind a dialog nobody sees. It must be --settings (or user settings): a "
                 "project settings file can only tighten this policy. Claude Code uses only the LAST --settings "
                 "flag, so if you already pass your own file, use --merge FILE to get one combined file. An "
                 "explicit \"hold\" or \"refuse\" in your file is kept (with a warning).")
    spawn.add_argument("--merge", metavar="FILE", help="your own settings file to combine with ours (left untouched)")
    spawn.add_argument("--with-hooks", action="store_true", help="also include courier's claim/deliver hooks")

    ex = _sub(sub, "exec", "run claude with courier's spawn settings and a pinned handle",
              "courier exec [--handle H] -- claude ARGS...: sets HELM_MAIL_HANDLE, adds --settings with courier's "
              "spawn settings (merged with any --settings you pass), then execs the command.")
    ex.add_argument("--handle", help="pin the mailbox handle")
    ex.add_argument("--with-hooks", action="store_true", help="include courier's hooks in the settings")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")

    svc = _sub(sub, "service", "install, uninstall or show the systemd/launchd user service", paths=False)
    svc.add_argument("action", choices=["install", "uninstall", "status", "print"])
    svc.add_argument("--dry-run", action="store_true", help="print what would be written and run")

    _sub(sub, "doctor", "check the setup and explain each problem with a fix")

    lg = _sub(sub, "log", "render courier's JSON log (stdin or a file) for people", paths=False)
    lg.add_argument("file", nargs="?", default="-", help="log file (default stdin)")
    lg.add_argument("--handle", action="append", help="only events about this handle (repeatable)")
    lg.add_argument("--event", action="append", help="only these events (repeatable)")
    return parser


def _flag_knobs(args) -> dict:
    return dict(
        wake_cap=getattr(args, "wake_cap", None),
        wake_half_life_s=getattr(args, "wake_half_life", None),
        rescan_interval_s=getattr(args, "rescan_interval", None),
        poke_timeout_s=getattr(args, "poke_timeout", None),
        outstanding_limit_s=getattr(args, "outstanding_limit", None),
        session_min_interval_s=getattr(args, "min_poke_interval", None),
        watcher=getattr(args, "watcher", None),
        debounce_ms=getattr(args, "debounce_ms", None),
        step_ms=getattr(args, "step_ms", None),
        log_format=getattr(args, "log_format", None)
        or ("console" if getattr(args, "command", None) == "run" and sys.stderr.isatty() else None),
        log_level=getattr(args, "log_level", None),
    )


def load_config(args):
    """The one way every command builds its configuration: defaults < config file < flags."""
    from . import config as cfgmod

    return cfgmod.build(
        config_file=getattr(args, "config", None),
        mail_dir=getattr(args, "mail_dir", None),
        config_dir=getattr(args, "claude_config_dir", None),
        state=getattr(args, "state_dir", None),
        **_flag_knobs(args),
    )


# ---------------------------------------------------------------- commands


def cmd_run(args) -> int:
    cfg = args.cfg
    # Heavy imports only here: the hook path must not pay for them.
    import trio

    from . import daemon, log, startup

    log.configure(cfg.log_format, cfg.log_level)
    logger = log.get()
    try:
        lock_fd = startup.acquire_lock(cfg.state_dir)
    except startup.StartupError as exc:
        logger.error("daemon_start_failed", reason="locked" if exc.code == startup.EXIT_LOCKED else "environment")
        print(f"courier: {exc}", file=sys.stderr)
        return exc.code
    d = daemon.Daemon(cfg, logger, receipts=not args.no_receipts, reload_config=lambda: load_config(args))
    try:
        trio.run(d.run)
    except startup.StartupError as exc:
        logger.error("daemon_start_failed", reason="environment", detail=str(exc))
        print(f"courier: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 0
    finally:
        os.close(lock_fd)
    return 0


def cmd_send(args) -> int:
    from . import sendmail

    return sendmail.cmd_send(args)


def cmd_status(args) -> int:
    from . import lockfile, mailbox, report, state

    for h in args.handles:
        if not mailbox.valid_handle(h):
            print(f"courier: {h!r} is not a valid handle", file=sys.stderr)
            return EXIT_USAGE
    status = state.read_status(args.cfg.state_dir)  # read once: rows and the watcher line both come from it
    rows = report.rows(args.cfg, args.handles or None, status)
    print(report.render(rows, lockfile.holder(args.cfg.state_dir), args.json, report.watcher_of(status)))
    return 0


def cmd_hook(args) -> int:
    from . import hooks

    return hooks.main(args.verb)


def _lazy(module: str, function: str):
    def handler(args) -> int:
        import importlib

        return getattr(importlib.import_module(f"courier.{module}"), function)(args)

    return handler


# The one command table: name -> (handler, needs a Config).
COMMANDS = {
    "run": (cmd_run, True),
    "send": (cmd_send, True),
    "status": (cmd_status, True),
    "who": (_lazy("address", "cmd_who"), True),
    "hook": (cmd_hook, False),
    "hooks": (_lazy("settings", "cmd_hooks"), True),
    "spawn-settings": (_lazy("settings", "cmd_spawn_settings"), True),
    "exec": (_lazy("settings", "cmd_exec"), True),
    "service": (_lazy("service", "cmd_service"), False),
    "doctor": (_lazy("doctor", "cmd_doctor"), True),
    "log": (_lazy("logview", "cmd_log"), False),
}


def _undecodable(argv: list[str]) -> str | None:
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return arg
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "hook" and argv[1] in HOOK_VERBS:
        # The hot path: runs before every prompt. Skip building the whole parser.
        from . import hooks

        return hooks.main(argv[1])
    bad = _undecodable(argv)
    if bad is not None:
        print(f"courier: an argument is not valid UTF-8 ({bad.encode('utf-8', 'backslashreplace').decode()[:80]})",
              file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler, needs_config = COMMANDS[args.command]
    if needs_config:
        from . import config as cfgmod

        try:
            args.cfg = load_config(args)
        except cfgmod.ConfigError as exc:
            print(f"courier: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
