"""Sending mail: `courier send` and the same checks for Python senders.

Trust: the sender is whoever runs this; the recipient's box may have been planted
by anyone who can write the mail root, so a symlinked box is refused and the
message is written inside the box through an O_NOFOLLOW descriptor. Every field
and every read is bounded; a FIFO or a device is refused as a body file (it could
block for ever or never end).
Logs: prints for people; exit status 2 for bad arguments, 1 when nothing was sent.
Limits: `from` is whatever the sender says; recipients see it labelled unverified.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

from . import mailbox, safeio

EXIT_USAGE = 2
EXIT_FAILED = 1
MAX_BODY_BYTES = mailbox.MAX_MESSAGE_BYTES - 8192  # room for the envelope within the reader's limit
MAX_SUBJECT = 400
MAX_FROM = 200


class SendError(Exception):
    """A send that cannot happen; `code` is the exit status, the message says why in one line."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def read_body_file(path: str) -> str:
    """A bounded read of a regular file; FIFOs, devices and directories are refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SendError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SendError(f"{path} is not a regular file (a FIFO, device or directory cannot be a body)",
                            EXIT_USAGE)
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
    if len(subject) > MAX_SUBJECT or "\n" in subject:
        raise SendError(f"the subject must be one line of at most {MAX_SUBJECT} characters", EXIT_USAGE)
    if not sender or len(sender) > MAX_FROM or "\n" in sender:
        raise SendError(f"--from must be one line of 1 to {MAX_FROM} characters", EXIT_USAGE)
    if len(body.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
        raise SendError(_too_large())


def deliver_to_box(root: Path, handle: str, *, sender: str, subject: str, body: str, create: bool) -> Path:
    """Write one message into <root>/<handle>/; returns its path. Raises SendError."""
    if not mailbox.valid_handle(handle):
        raise SendError(
            f"{handle!r} is not a valid handle (lowercase letters, digits and '-', starting and ending with a "
            "letter or digit)", EXIT_USAGE)
    check_fields(sender, subject, body)
    box = mailbox.box_dir(root, handle)
    if os.path.islink(box):
        raise SendError(f"box {box} is a symlink; refusing to write through it")
    if not box.is_dir():
        if not create:
            raise SendError(f"no box for {handle!r} under {root} (nobody has claimed it). Check the handle with "
                            "`courier status`, or pass --create to queue mail for it anyway.")
        os.makedirs(root, mode=0o700, exist_ok=True)
        mailbox.ensure_box(root, handle)
    try:
        return mailbox.drop_message(root, handle, sender=sender, subject=subject, body=body)
    except mailbox.Damaged as exc:
        raise SendError(f"box {box} is damaged ({exc.reason}); nothing was written") from None
    except safeio.Unsafe as exc:
        raise SendError(f"the message cannot be written as JSON ({exc.reason})", EXIT_USAGE) from None
    except OSError as exc:
        raise SendError(f"cannot write into {box}: {os.strerror(exc.errno or errno.EIO)}") from None


def cmd_send(args) -> int:
    cfg = args.cfg
    try:
        if args.body is not None:
            body = args.body
        elif args.body_file and args.body_file != "-":
            body = read_body_file(args.body_file)
        else:
            if sys.stdin.isatty():
                print("courier: reading the body from stdin (end with Ctrl-D)", file=sys.stderr)
            body = read_body_stream(sys.stdin.buffer)
        sender = args.sender or os.environ.get("HELM_MAIL_HANDLE") or os.environ.get("USER") or "unknown"
        try:
            owner = mailbox.read_owner(mailbox.box_dir(cfg.mail_root, args.handle))
            if owner.retired_at is not None:
                print(f"courier: warning: {args.handle!r} is retired (its owner is gone); the mail is queued "
                      "but nobody may read it", file=sys.stderr)
        except (OSError, ValueError, safeio.Unsafe, mailbox.Damaged):
            pass
        path = deliver_to_box(cfg.mail_root, args.handle, sender=sender, subject=args.subject, body=body,
                              create=args.create)
    except SendError as exc:
        print(f"courier: {exc}", file=sys.stderr)
        return exc.code
    print(path)
    return 0
