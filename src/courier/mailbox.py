"""The helm file-mailbox convention on disk: names, boxes, owners, drops and consumes.

Trust: every file in the mail root may have been written by a hostile same-user
process. Handles and message names are validated against a fixed shape before
any path is built from them; message files are opened without following
symlinks and without blocking (a FIFO named x.json must not hang anyone); reads
are bounded. This module never deletes mail and never modifies a message: the
only mutation of mail is `consume`, a link into read/ plus unlink that exactly
one process can win.
Logs: nothing; callers log (this module is imported by the prompt hooks, which
must stay stdlib-only).
Limits: the convention's `from` is an unverified claim; nothing here pretends
otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

OWNER_FILE = "owner.json"
READ_DIR = "read"
RESERVED_HANDLES = frozenset({"operator"})

# The convention's handles are slugs: lowercase [a-z0-9], runs of anything else
# turned into '-', trimmed. A directory whose name is outside this shape is not a
# box we will ever build a path from.
HANDLE_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,198}[a-z0-9])?$")
# `<millis>-<6 hex>.json` is what senders write; any other plain name is accepted
# as mail too (helm does), but only from this safe alphabet, so a name can never
# carry a newline, a path separator or a terminal escape into a notice.
MESSAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,200}\.json$")

MAX_MESSAGE_BYTES = 1 << 20  # a body larger than 1 MiB is refused by `courier send`
MAX_OWNER_BYTES = 64 << 10


def _hex(nbytes: int) -> str:
    return os.urandom(nbytes).hex()  # `secrets` would import hashlib and random on the hook path


def valid_handle(name: str) -> bool:
    return isinstance(name, str) and bool(HANDLE_RE.match(name))


def valid_message_name(name: str) -> bool:
    return isinstance(name, str) and name != OWNER_FILE and bool(MESSAGE_RE.match(name))


def slug(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9]+", "-", str(text or "").lower()).strip("-")
    return cleaned or "agent"


def tail(ident: str, width: int) -> str:
    """The tail of an id: the head of a time-ordered UUID is a clock."""
    return ident[-width:].strip("-")


def box_dir(root: Path, handle: str) -> Path:
    if not valid_handle(handle):
        raise ValueError(f"not a valid handle: {handle!r}")
    return root / handle


# ---------------------------------------------------------------- reading


class Unsafe(Exception):
    """A file that is not a plain regular file of ours to read (symlink, FIFO, dir, too big)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def read_bounded(path: Path, limit: int) -> bytes:
    """Read a regular file without following a final symlink and without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unsafe("symlink") from None
        if exc.errno == errno.ENXIO:  # a FIFO or socket with no writer
            raise Unsafe("not_regular") from None
        if exc.errno == errno.EISDIR:
            raise Unsafe("not_regular") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe("not_regular")
        if st.st_size > limit:
            raise Unsafe("too_large")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise Unsafe("too_large")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json_object(path: Path, limit: int) -> dict:
    """Parse a bounded JSON object; raises Unsafe with a reason for anything else."""
    raw = read_bounded(path, limit)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Unsafe("malformed_json") from None
    if not isinstance(value, dict):
        raise Unsafe("not_an_object")
    return value


# NamedTuple, not dataclass: `dataclasses` pulls in `inspect` (~14 ms), and this module is on the hook path.
class Owner(NamedTuple):
    handle: str | None
    runtime: str | None
    pid: int | None
    session_id: str | None
    cwd: str | None
    claimed_at: float | None
    provisional: bool
    retired_at: float | None
    raw: dict


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _num_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _str_or_none(value: Any, limit: int = 4096) -> str | None:
    return value if isinstance(value, str) and value and len(value) <= limit else None


def parse_owner(data: dict) -> Owner:
    return Owner(
        handle=_str_or_none(data.get("handle"), 256),
        runtime=_str_or_none(data.get("runtime"), 64),
        pid=_int_or_none(data.get("pid")),
        session_id=_str_or_none(data.get("sessionId"), 256),
        cwd=_str_or_none(data.get("cwd")),
        claimed_at=_num_or_none(data.get("claimedAt")),
        provisional=data.get("pidIsProvisional") is True,
        retired_at=_num_or_none(data.get("retiredAt")),
        raw=data,
    )


def read_owner(box: Path) -> Owner:
    """Raises FileNotFoundError when absent and Unsafe(reason) when unusable."""
    return parse_owner(read_json_object(box / OWNER_FILE, MAX_OWNER_BYTES))


class Listing(NamedTuple):
    queued: tuple[str, ...]  # valid message names, sorted (oldest first)
    rejected: tuple[str, ...]  # *.json entries that are not safe mail (bad name, symlink, FIFO…)


def list_box(box: Path) -> Listing:
    """List one box. Raises FileNotFoundError/NotADirectoryError if the box is gone.

    Never opens a message: counting needs only the directory, so a FIFO cannot block it.
    """
    queued, rejected = [], []
    # A box that is a symlink is not followed: O_NOFOLLOW|O_DIRECTORY on the box itself.
    fd = os.open(box, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") or name == OWNER_FILE or name == READ_DIR:
                    continue
                if not name.endswith(".json"):
                    continue
                try:
                    regular = entry.is_file(follow_symlinks=False)
                except OSError:
                    regular = False
                if regular and valid_message_name(name):
                    queued.append(name)
                else:
                    rejected.append(name)
    finally:
        os.close(fd)
    queued.sort()
    rejected.sort()
    return Listing(tuple(queued), tuple(rejected))


def list_handles(root: Path) -> tuple[list[str], list[str]]:
    """(valid handles that are real directories, names skipped). Raises if root is unreadable."""
    handles, skipped = [], []
    with os.scandir(root) as entries:
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and valid_handle(name):
                handles.append(name)
            else:
                skipped.append(name)
    handles.sort()
    return handles, skipped


# ---------------------------------------------------------------- writing


def ensure_dir(path: Path, mode: int = 0o700) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)


def write_json_atomic(path: Path, data: Any, *, fsync: bool = False) -> None:
    """temp + rename in the same directory, mode 0600: a reader never sees half a file."""
    temp = path.parent / f".tmp-{_hex(6)}"
    payload = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def new_message_name(now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{now_ms}-{_hex(3)}.json"


def drop_message(
    root: Path,
    handle: str,
    *,
    sender: str,
    subject: str,
    body: str,
    now_ms: int | None = None,
) -> Path:
    """Write one convention message into <root>/<handle>/ via .tmp-* + rename. Returns its path."""
    box = box_dir(root, handle)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    name = new_message_name(now_ms)
    message = {
        "id": name[: -len(".json")],
        "from": sender,
        "to": handle,
        "subject": subject,
        "body": body,
        "sentAt": now_ms,
    }
    path = box / name
    write_json_atomic(path, message)
    return path


def consume(box: Path, name: str) -> Path | None:
    """Move one message into read/. Returns its new path if *this* process won, else None.

    link + unlink rather than rename: rename would silently replace an archived
    message of the same name, and "nothing is lost" covers read/ too. Of racing
    processes exactly one unlink succeeds; that process owns the consume. A link
    left behind by a crash between the two steps is finished by the next consumer.
    """
    if not valid_message_name(name):
        return None
    src = box / name
    read = box / READ_DIR
    ensure_dir(read)
    dst = read / name
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        try:
            same = os.path.samestat(os.lstat(src), os.lstat(dst))
        except FileNotFoundError:
            return None
        if not same:
            # A different message already archived under this name: keep both.
            stem = name[: -len(".json")]
            dst = read / f"{stem}-{_hex(3)}.json"
            try:
                os.link(src, dst, follow_symlinks=False)
            except (FileNotFoundError, FileExistsError):
                return None
    except FileNotFoundError:
        return None
    try:
        os.unlink(src)
    except FileNotFoundError:
        return None
    return dst


def retire(box: Path, owner_data: dict, now_ms: int | None = None) -> None:
    """Mark a box retired in owner.json. Never touches mail."""
    data = dict(owner_data)
    data["retiredAt"] = int(time.time() * 1000) if now_ms is None else now_ms
    write_json_atomic(box / OWNER_FILE, data)


def derive_handle(
    root: Path,
    cwd: str,
    session_id: str,
    held_by_another: Callable[[str], bool],
    pinned: str | None = None,
) -> str | None:
    """The convention's handle for this session; None if the only candidate is reserved.

    `held_by_another(handle)` says whether a live, unretired owner with another
    session id holds that handle; the tail widens 4 -> 6 -> 8 -> full around it.
    """
    if pinned and pinned.strip():
        handle = slug(pinned)
        return None if handle in RESERVED_HANDLES else handle[:200].strip("-") or None
    where = slug(os.path.basename(cwd.rstrip("/")) if cwd else "")[:120].strip("-") or "agent"
    full = slug(session_id)
    candidates = [tail(full, w) for w in (4, 6, 8) if w < len(full)] + [full]
    handle = f"{where}-{full}"
    for which in candidates:
        if not which:
            continue
        candidate = f"{where}-{which}"
        if candidate in RESERVED_HANDLES or not valid_handle(candidate):
            continue
        if not held_by_another(candidate):
            return candidate
    return handle if valid_handle(handle) and handle not in RESERVED_HANDLES else None
