"""Sending mail: `courier send` and the checks every sender goes through (the Python API shares them).

A send is: resolve TARGET (`address.resolve_target`, the one definition `who`
shares) -> refuse no match, several matches without --all, a retired box ->
bound the fields -> scan subject and body for shapes of live credentials (refused
unless allow_secret) -> write one convention file per recipient.

Trust: the sender is whoever runs this; the recipient's box may have been planted
by anyone who can write the mail root, so a symlinked box is refused and the
message is written inside the box through an O_NOFOLLOW descriptor, by the box's
validated name (never a path from owner.json). Every field and every read is
bounded; a FIFO or a device is refused as a body file (it could block for ever or
never end). A refusal for a secret names the shape and the line, never the value.
Logs: prints for people: the path(s) written on stdout (or JSON with --json), which
rule matched on stderr. Exit status 0 sent, 1 nothing written (I/O, size), 2 bad
arguments / no match / several matches / retired box, 3 a secret shape found.
Limits: `from` is whatever the sender says; recipients see it labelled unverified.
The secret scan is a backstop for accidental pastes, not a control (see secretscan).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import NamedTuple

from . import address, mailbox, safeio

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_SECRET = 3
MAX_BODY_BYTES = mailbox.MAX_MESSAGE_BYTES - 8192  # room for the envelope within the reader's limit
MAX_SUBJECT = 400
MAX_FROM = 200
MAX_FINDINGS_SHOWN = 20


class SendError(Exception):
    """A send that cannot happen; `code` is the exit status, the message says why.

    `sent` lists what was written before the failure (only `--all` can write some and fail on others).
    """

    code = EXIT_FAILED

    def __init__(self, message: str, code: int | None = None, sent: list | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.sent = list(sent or [])


class Invalid(SendError):
    """A bad argument: a field out of bounds, a body file that is not a regular file, a bad target."""

    code = EXIT_USAGE


class NoMatch(SendError):
    """TARGET names no box and no live session. `candidates` are the closest handles."""

    code = EXIT_USAGE

    def __init__(self, message: str, target: str, candidates: tuple[str, ...] = (), creatable: bool = False):
        super().__init__(message)
        self.target, self.candidates, self.creatable = target, tuple(candidates), creatable


class Ambiguous(SendError):
    """TARGET matches several live sessions and `all` was not asked for. `matches` are their handles."""

    code = EXIT_USAGE

    def __init__(self, message: str, target: str, rule: str, matches: tuple[str, ...]):
        super().__init__(message)
        self.target, self.rule, self.matches = target, rule, tuple(matches)


class Retired(SendError):
    """The box is retired: its session is gone. `instead` names the live box(es) of its session, else its cwd."""

    code = EXIT_USAGE

    def __init__(self, message: str, handle: str, instead: tuple[str, ...] = ()):
        super().__init__(message)
        self.handle, self.instead = handle, tuple(instead)


class SecretFound(SendError):
    """The subject or body holds a shape of a live credential. `findings` carry kinds and positions, no text."""

    code = EXIT_SECRET

    def __init__(self, message: str, findings: list):
        super().__init__(message)
        self.findings = list(findings)


class Sent(NamedTuple):
    path: Path
    id: str
    handle: str
    rule: str

    def as_json(self) -> dict:
        return {"path": str(self.path), "id": self.id, "handle": self.handle, "rule": self.rule}


# ---------------------------------------------------------------- bodies and fields


def read_body_file(path: str) -> str:
    """A bounded read of a regular file; FIFOs, devices and directories are refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SendError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Invalid(f"{path} is not a regular file (a FIFO, device or directory cannot be a body)")
        if st.st_size > MAX_BODY_BYTES:
            raise SendError(_too_large())
        data = os.read(fd, MAX_BODY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BODY_BYTES:
        raise SendError(_too_large())
    return data.decode("utf-8", "replace")


def read_body_stream(stream) -> str:
    data = stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        raise SendError(_too_large())
    return data.decode("utf-8", "replace")


def _too_large() -> str:
    return (f"the body is larger than {MAX_BODY_BYTES // 1024} KiB; put large content in a file and send its "
            "path instead")


def check_fields(sender: str, subject: str, body: str) -> None:
    for name, value in (("--from", sender), ("--subject", subject), ("the body", body)):
        if not isinstance(value, str):
            raise Invalid(f"{name} must be text")
    if len(subject) > MAX_SUBJECT or "\n" in subject or "\r" in subject:
        raise Invalid(f"the subject must be one line of at most {MAX_SUBJECT} characters")
    if not sender or len(sender) > MAX_FROM or "\n" in sender or "\r" in sender:
        raise Invalid(f"--from must be one line of 1 to {MAX_FROM} characters")
    if len(body.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
        raise SendError(_too_large())


def scan_for_secrets(subject: str, body: str) -> None:
    """Raise SecretFound if the subject or body holds a credential shape (secretscan is imported only here)."""
    from . import secretscan

    findings = secretscan.scan_message(subject, body)
    if findings:
        shown = [secretscan.describe(f) for f in findings[:MAX_FINDINGS_SHOWN]]
        more = len(findings) - len(shown)
        lines = ["refusing to send: this looks like a live credential (nothing was written)"]
        lines += [f"  {line}" for line in shown]
        if more > 0:
            lines.append(f"  … and {more} more")
        lines.append("if it is not a secret, or you mean to send it, pass --allow-secret (this check is a backstop "
                     "for accidental pastes: a delivered message stays in the recipient's transcript)")
        raise SecretFound("\n".join(lines), findings)


def default_sender(directory: address.Directory | None, env=None) -> str:
    """$HELM_MAIL_HANDLE, else the box this Claude session claimed, else $USER, else "unknown"."""
    env = os.environ if env is None else env
    pinned = env.get("HELM_MAIL_HANDLE", "").strip()
    if pinned:
        return pinned
    sid = env.get("CLAUDE_CODE_SESSION_ID", "").strip()
    if sid and directory is not None:
        mine = directory.handle_of_session(sid)
        if mine:
            return mine
    return env.get("USER") or "unknown"


# ---------------------------------------------------------------- resolving and writing


def resolve_for_send(directory: address.Directory, target: str, *, all_: bool = False,
                     create: bool = False) -> address.Resolution:
    """Resolve TARGET for a send; raises Invalid, NoMatch, Ambiguous or Retired."""
    res = address.resolve_target(target, directory)
    if res.problem == "invalid":
        raise Invalid(address.problem_text(res))
    if res.problem == "retired":
        raise Retired(address.problem_text(res), res.matches[0].handle, tuple(b.handle for b in res.instead))
    if res.problem == "no_match":
        if create and res.creatable:
            return address.Resolution(target, address.RULE_NEW, (), creatable=True)
        raise NoMatch(address.problem_text(res), target, tuple(b.handle for b in res.candidates), res.creatable)
    if len(res.matches) > 1 and not all_:
        raise Ambiguous(address.ambiguous_text(res), target, res.rule or "", tuple(res.handles))
    return res


def deliver_to_box(root: Path, handle: str, *, sender: str, subject: str, body: str, create: bool) -> Path:
    """Write one message into <root>/<handle>/; returns its path. Raises SendError."""
    if not mailbox.valid_handle(handle):
        raise Invalid(
            f"{handle!r} is not a valid handle (lowercase letters, digits and '-', starting and ending with a "
            "letter or digit)")
    check_fields(sender, subject, body)
    box = Path(mailbox.box_dir(root, handle))
    if os.path.islink(box):
        raise SendError(f"box {box} is a symlink; refusing to write through it")
    if not box.is_dir():
        if not create:
            raise NoMatch(f"no box for {handle!r} under {root} (nobody has claimed it). Check the handle with "
                          "`courier who`, or pass --create to queue mail for it anyway.", handle, creatable=True)
        os.makedirs(root, mode=0o700, exist_ok=True)
        mailbox.ensure_box(root, handle)
    try:
        return Path(mailbox.drop_message(root, handle, sender=sender, subject=subject, body=body))
    except mailbox.Damaged as exc:
        raise SendError(f"box {box} is damaged ({exc.reason}); nothing was written") from None
    except safeio.Unsafe as exc:
        raise Invalid(f"the message cannot be written as JSON ({exc.reason})") from None
    except OSError as exc:
        raise SendError(f"cannot write into {box}: {os.strerror(exc.errno or errno.EIO)}") from None


def write_resolved(root: Path, res: address.Resolution, *, sender: str, subject: str, body: str,
                   allow_secret: bool = False) -> list[Sent]:
    """Check the fields, scan for secrets (unless allowed), then write one file per recipient."""
    check_fields(sender, subject, body)
    if not allow_secret:
        scan_for_secrets(subject, body)
    handles = [res.target] if res.rule == address.RULE_NEW else res.handles
    sent: list[Sent] = []
    failures: list[str] = []
    for handle in handles:
        try:
            path = deliver_to_box(root, handle, sender=sender, subject=subject, body=body,
                                  create=res.rule == address.RULE_NEW)
        except SendError as exc:
            if len(handles) == 1:
                raise
            failures.append(f"{handle}: {exc}")
            continue
        sent.append(Sent(path, path.name[: -len(".json")], handle, res.rule or ""))
    if failures:
        raise SendError("not sent to " + "; ".join(failures), EXIT_FAILED, sent)
    return sent


def send(directory: address.Directory, target: str, *, subject: str, body: str, sender: str | None = None,
         allow_secret: bool = False, all_: bool = False, create: bool = False) -> list[Sent]:
    """Resolve and write; everything the CLI does except reading the body and printing. Raises SendError."""
    res = resolve_for_send(directory, target, all_=all_, create=create)
    sender = default_sender(directory) if sender is None else sender
    return write_resolved(directory.mail_root, res, sender=sender, subject=subject, body=body,
                          allow_secret=allow_secret)


# ---------------------------------------------------------------- courier send


def _read_body(args) -> str:
    if args.body is not None:
        return args.body
    if args.body_file and args.body_file != "-":
        return read_body_file(args.body_file)
    if sys.stdin.isatty():
        print("courier: reading the body from stdin (end with Ctrl-D)", file=sys.stderr)
    return read_body_stream(sys.stdin.buffer)


def _print_sent(sent: list[Sent], as_json: bool, as_list: bool) -> None:
    import json

    if as_json:
        data = [s.as_json() for s in sent]
        print(json.dumps(data if as_list else data[0]))
    else:
        for s in sent:
            print(s.path)


def cmd_send(args) -> int:
    cfg = args.cfg
    directory = address.Directory.from_config(cfg)
    all_ = bool(getattr(args, "all", False))
    as_json = bool(getattr(args, "json", False))
    try:
        # Resolve before reading the body: a wrong address fails before anyone types a message.
        res = resolve_for_send(directory, args.target, all_=all_, create=args.create)
        body = _read_body(args)
        sender = args.sender or default_sender(directory)
        sent = write_resolved(cfg.mail_root, res, sender=sender, subject=args.subject, body=body,
                              allow_secret=getattr(args, "allow_secret", False))
    except SendError as exc:
        if exc.sent:
            _print_sent(exc.sent, as_json, True)
        print(f"courier: {exc}", file=sys.stderr)
        return exc.code
    print(f"courier: {address.explain(res)}", file=sys.stderr)
    for s in sent:
        box = directory.get(s.handle)
        note = address.state_note(box) if box is not None else "new box"
        print(f"courier: sent {s.id} to {s.handle} ({note})", file=sys.stderr)
    _print_sent(sent, as_json, all_)
    return 0
