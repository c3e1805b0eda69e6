"""The helm file-mailbox convention on disk: names, boxes, owners, listings, drops and consumes.

Trust: every file in the mail root may have been written by a hostile same-user
process. A path is only ever built from a handle that passed `valid_handle` or a
name read from a directory listing, never from file content. Boxes, `read/` and
message files are opened relative to directory descriptors with O_NOFOLLOW, so no
link (a symlinked box, a symlinked `read/`) can carry a consume or a claim outside
the mail root. Messages are never opened here (counting needs only the listing).
This module never deletes mail and never modifies a message: the only mutation of
mail is `consume`, a link into read/ plus unlink that exactly one process can win.
Logs: nothing; callers log (the prompt hooks import this module and stay stdlib-only).
Limits: the convention's `from` is an unverified claim; nothing here pretends otherwise.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections import namedtuple
from collections.abc import Callable

from . import safeio

OWNER_FILE = "owner.json"
READ_DIR = "read"
RESERVED_HANDLES = frozenset({"operator"})

# The convention's handles are slugs: lowercase [a-z0-9], runs of anything else
# turned into '-', trimmed; helm sets no length limit but the filesystem's 255-byte
# name. A directory whose name is outside this shape is not a box we will ever
# build a path from.
MAX_NAME_BYTES = 255
HANDLE_NAME = safeio.WholeName(r"[a-z0-9](?:[a-z0-9-]{0,253}[a-z0-9])?")

MAX_MESSAGE_BYTES = 1 << 20  # a body larger than 1 MiB is refused by `courier send`
MAX_OWNER_BYTES = 64 << 10
MAX_SESSION_ID = 4096


class Damaged(Exception):
    """A box whose shape would let a consume or claim leave the mail root (a symlinked box or read/)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


FIXES = {
    "box_is_symlink": "replace the link with a real directory holding the box's files",
    "read_is_symlink": "replace read/ with a real directory (move the archived files into it)",
    "read_not_directory": "move the file named read aside and create the directory read/",
}


def valid_handle(name: str) -> bool:
    return isinstance(name, str) and HANDLE_NAME.fullmatch(name) is not None


def valid_message_name(name: str) -> bool:
    """Mail is what helm delivers: every name ending in .json that is not hidden and not owner.json.

    Any other character is allowed (spaces, dots, non-ASCII, even newlines): the name is only
    ever one directory entry joined to its box, and it is rendered escaped wherever it is shown.
    """
    return (
        isinstance(name, str)
        and name.endswith(".json")
        and not name.startswith(".")
        and name != OWNER_FILE
        and "/" not in name
        and "\0" not in name
        and len(os.fsencode(name)) <= MAX_NAME_BYTES
    )


def slug(text: str) -> str:
    cleaned = re.sub(r"[^a-z0-9]+", "-", str(text or "").lower()).strip("-")
    return cleaned or "agent"


def tail(ident: str, width: int) -> str:
    """The tail of an id: the head of a time-ordered UUID is a clock."""
    return ident[-width:].strip("-")


def box_dir(root: str, handle: str) -> str:
    if not valid_handle(handle):
        raise ValueError(f"not a valid handle: {handle!r}")
    return os.path.join(root, handle)


def root_problem(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a mail root is unsafe to serve, or None. One rule for the daemon and `doctor`."""
    uid = os.getuid() if uid is None else uid
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); any user could forge mail"
    return None


# ---------------------------------------------------------------- boxes by descriptor


def open_box(root: str, handle: str) -> int:
    """An O_NOFOLLOW descriptor for <root>/<handle>. Raises FileNotFoundError, NotADirectoryError,
    Damaged("box_is_symlink"), or OSError."""
    box = box_dir(root, handle)
    try:
        return safeio.open_dir_nofollow(box)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(box)):
            raise Damaged("box_is_symlink") from None
        raise


def open_read_dir(box_fd: int, *, create: bool) -> int:
    """An O_NOFOLLOW descriptor for read/ inside a box. Raises Damaged if read/ is a link or a file."""
    if create:
        try:
            os.mkdir(READ_DIR, 0o700, dir_fd=box_fd)
        except FileExistsError:
            pass
    try:
        return safeio.open_dir_nofollow(READ_DIR, dir_fd=box_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Damaged("read_is_symlink") from None
        if exc.errno == errno.ENOTDIR:
            try:
                st = os.lstat(READ_DIR, dir_fd=box_fd)
            except OSError:
                raise exc from None
            raise Damaged("read_is_symlink" if stat.S_ISLNK(st.st_mode) else "read_not_directory") from None
        raise


def read_dir_problem(box_fd: int) -> str | None:
    """Why read/ cannot take a consume (Damaged reason), or None (absent counts as fine: it is created)."""
    try:
        st = os.lstat(READ_DIR, dir_fd=box_fd)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "read_is_symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "read_not_directory"
    return None


class _BoxFd:
    """`with _BoxFd(box) as fd`: accepts a path (opened O_NOFOLLOW) or an fd the caller owns."""

    def __init__(self, box: str | int):
        self.box = box
        self.fd = -1

    def __enter__(self) -> int:
        if isinstance(self.box, int):
            return self.box
        try:
            self.fd = safeio.open_dir_nofollow(self.box)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Damaged("box_is_symlink") from None
            raise
        return self.fd

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)


# ---------------------------------------------------------------- owners


# collections.namedtuple, not a dataclass or typing.NamedTuple: `dataclasses` pulls in `inspect` (~14 ms) and
# `typing` ~3-4 ms, and this module is on the hook path (research/performance.md §6).
# Owner: handle, runtime, session_id, cwd: str | None; pid: int | None; claimed_at, retired_at: float | None;
# provisional: bool; raw: the parsed dict.
Owner = namedtuple("Owner", "handle runtime pid session_id cwd claimed_at provisional retired_at raw")


def parse_owner(data: dict) -> Owner:
    return Owner(
        handle=safeio.short_str(data.get("handle"), 256),
        runtime=safeio.short_str(data.get("runtime"), 64),
        pid=safeio.positive_int(data.get("pid")),
        session_id=safeio.short_str(data.get("sessionId"), MAX_SESSION_ID),
        cwd=safeio.short_str(data.get("cwd")),
        claimed_at=safeio.finite_number(data.get("claimedAt")),
        provisional=data.get("pidIsProvisional") is True,
        retired_at=safeio.finite_number(data.get("retiredAt")),
        raw=data,
    )


def read_owner(box: str | int) -> Owner:
    """Raises FileNotFoundError when absent, Unsafe(reason) when unusable, Damaged for a symlinked box."""
    with _BoxFd(box) as fd:
        return parse_owner(safeio.read_json_object(OWNER_FILE, MAX_OWNER_BYTES, dir_fd=fd))


def write_owner(box: str | int, data: dict) -> None:
    """Write owner.json atomically inside the box, never through a link."""
    with _BoxFd(box) as fd:
        safeio.write_json_atomic(OWNER_FILE, data, dir_fd=fd)


# ---------------------------------------------------------------- listing


# queued: messages (regular files with one link), sorted oldest first; refused: (name, why) of *.json
# entries that are not mail to read.
Listing = namedtuple("Listing", "queued refused")


def entry_refusal(st: os.stat_result) -> str | None:
    """Why a *.json entry is not a message to read, from its lstat; None if it is one."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if not stat.S_ISREG(mode):
        return "not_regular"
    if st.st_nlink != 1:
        # A hard link to some other file (maybe one the sender may not read): a confused deputy.
        return "hard_linked"
    return None


def list_box(box: str | int) -> Listing:
    """List one box. Raises FileNotFoundError/NotADirectoryError if the box is gone, Damaged if it is a link.

    Never opens a message: an lstat per entry is enough, so a FIFO cannot block it.
    """
    queued, refused = [], []
    with _BoxFd(box) as fd:
        # scandir duplicates the descriptor it is given and closes only its own copy.
        with os.scandir(fd) as entries:
            for entry in entries:
                name = entry.name
                if not valid_message_name(name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone between the listing and the stat: consumed
                why = entry_refusal(st)
                if why == "hard_linked" and being_consumed(fd, name, st):
                    why = None
                if why is None:
                    queued.append(name)
                else:
                    refused.append((name, why))
    queued.sort()
    refused.sort()
    return Listing(tuple(queued), tuple(refused))


def being_consumed(box_fd: int, name: str, st: os.stat_result) -> bool:
    """A message with two links, the second its own copy in a real read/: a consume half done
    (by a racing prompt, or one that crashed between its link and its unlink).

    Looked up a few times over ~10 ms: ext4 raises the link count before the new name appears
    in read/ (measured: 16 racing prompts saw it), and a planted hard link never gains a copy there.
    """
    if st.st_nlink != 2:
        return False
    try:
        read_fd = safeio.open_dir_nofollow(READ_DIR, dir_fd=box_fd)
    except OSError:
        return False
    try:
        for attempt in range(4):
            try:
                return os.path.samestat(st, os.lstat(name, dir_fd=read_fd))
            except FileNotFoundError:
                if attempt < 3:
                    time.sleep(0.003)
            except OSError:
                return False
        return False
    finally:
        os.close(read_fd)


def list_handles(root: str, with_identity: bool = False) -> tuple[list, list[str]]:
    """(valid handles that are real directories, names skipped). Raises if root is unreadable.

    With `with_identity`, each handle comes as (handle, (mtime_ns, inode)) of its directory.
    """
    handles: list = []
    skipped: list[str] = []
    with os.scandir(root) as entries:
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                st = entry.stat(follow_symlinks=False) if is_dir and with_identity else None
            except OSError:
                is_dir = False
            if is_dir and valid_handle(name):
                handles.append((name, (st.st_mtime_ns, st.st_ino)) if with_identity else name)
            else:
                skipped.append(name)
    handles.sort()
    return handles, skipped


# ---------------------------------------------------------------- writing


def ensure_box(root: str, handle: str) -> None:
    """Create <root>/<handle>/read/ (0700) if missing, refusing links."""
    try:
        os.mkdir(box_dir(root, handle), 0o700)
    except FileExistsError:
        pass
    fd = open_box(root, handle)
    try:
        os.close(open_read_dir(fd, create=True))
    finally:
        os.close(fd)


def new_message_name(now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{now_ms}-{safeio.random_hex(3)}.json"


def message(handle: str, *, sender: str, subject: str, body: str, name: str, now_ms: int) -> dict:
    return {"id": name[: -len(".json")], "from": sender, "to": handle, "subject": subject, "body": body, "sentAt": now_ms}


def drop_message(
    root: str,
    handle: str,
    *,
    sender: str,
    subject: str,
    body: str,
    now_ms: int | None = None,
) -> str:
    """Write one convention message into <root>/<handle>/ via .tmp-* + rename. Returns its path."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    name = new_message_name(now_ms)
    fd = open_box(root, handle)
    try:
        safeio.write_json_atomic(name, message(handle, sender=sender, subject=subject, body=body, name=name,
                                               now_ms=now_ms), dir_fd=fd)
    finally:
        os.close(fd)
    return os.path.join(box_dir(root, handle), name)


def consume(box: str, name: str) -> str | None:
    """Move one message into read/. Returns its new path if *this* process won, else None.

    link + unlink rather than rename: rename would silently replace an archived
    message of the same name, and "nothing is lost" covers read/ too. Of racing
    processes exactly one unlink succeeds; that process owns the consume. A link
    left behind by a crash between the two steps is finished by the next consumer.
    Both steps are relative to O_NOFOLLOW descriptors: a symlinked read/ raises Damaged.
    """
    if not valid_message_name(name):
        return None
    with _BoxFd(box) as fd:
        rfd = open_read_dir(fd, create=True)
        try:
            won = consume_at(fd, rfd, name)
        finally:
            os.close(rfd)
    return None if won is None else os.path.join(box, READ_DIR, won)


def consume_at(box_fd: int, read_fd: int, name: str) -> str | None:
    """`consume` on open descriptors; returns the name the message has in read/, or None."""
    if not valid_message_name(name):
        return None
    return _consume_at(box_fd, read_fd, name)


def link_at(box_fd: int, read_fd: int, name: str) -> str | None:
    """The first half of a consume: a link in read/ (never replacing an archived message).
    Returns the name it has there, or None if it is gone. The message stays queued until `unlink_at`."""
    if not valid_message_name(name):
        return None
    dst = name
    for _attempt in range(8):
        try:
            os.link(name, dst, src_dir_fd=box_fd, dst_dir_fd=read_fd, follow_symlinks=False)
            return dst
        except FileExistsError:
            try:
                if os.path.samestat(os.lstat(name, dir_fd=box_fd), os.lstat(dst, dir_fd=read_fd)):
                    return dst  # a consume that crashed between its two steps, or a racing one
            except FileNotFoundError:
                return None
            dst = _archive_name(name)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None
        except PermissionError:
            # Linux refuses to hard-link a directory with EPERM: move it whole, never over anything.
            return _rename_dir(box_fd, read_fd, name)
    return None


def unlink_at(box_fd: int, name: str) -> bool:
    """The second half of a consume; True if this process removed the queued entry (won the consume)."""
    try:
        os.unlink(name, dir_fd=box_fd)
        return True
    except FileNotFoundError:
        return False
    except (IsADirectoryError, PermissionError):
        return False  # a directory was renamed by link_at already


def _archive_name(name: str) -> str:
    return f"{name[: -len('.json')]}-{safeio.random_hex(3)}.json"


def _rename_dir(box_fd: int, read_fd: int, name: str) -> str | None:
    dst = name
    for _attempt in range(8):
        try:
            os.lstat(dst, dir_fd=read_fd)
            dst = _archive_name(name)
            continue
        except FileNotFoundError:
            pass
        try:
            os.rename(name, dst, src_dir_fd=box_fd, dst_dir_fd=read_fd)
            return dst
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                dst = _archive_name(name)
                continue
            return None
    return None


def _consume_at(box_fd: int, read_fd: int, name: str) -> str | None:
    dst = name
    try:
        os.link(name, dst, src_dir_fd=box_fd, dst_dir_fd=read_fd, follow_symlinks=False)
    except FileExistsError:
        try:
            same = os.path.samestat(os.lstat(name, dir_fd=box_fd), os.lstat(dst, dir_fd=read_fd))
        except FileNotFoundError:
            return None
        if not same:
            # A different message already archived under this name: keep both.
            dst = _archive_name(name)
            try:
                os.link(name, dst, src_dir_fd=box_fd, dst_dir_fd=read_fd, follow_symlinks=False)
            except (FileNotFoundError, FileExistsError):
                return None
    except FileNotFoundError:
        return None
    try:
        os.unlink(name, dir_fd=box_fd)
    except FileNotFoundError:
        return None
    return dst


def retire(box: str | int, owner_data: dict, now_ms: int | None = None) -> None:
    """Mark a box retired in owner.json. Never touches mail."""
    data = dict(owner_data)
    data["retiredAt"] = int(time.time() * 1000) if now_ms is None else now_ms
    write_owner(box, data)


def handle_for(where: str, ident: str) -> str:
    """`<where>-<ident>`, shortening `where` (never the id) to fit a 255-byte name."""
    room = MAX_NAME_BYTES - len(ident) - 1
    if room < 1:
        return ident[-MAX_NAME_BYTES:].strip("-") or "agent"
    return f"{where[:room].strip('-') or 'agent'}-{ident}"


def ladder(cwd: str, session_id: str, pid: int) -> list[str]:
    """The convention's candidate handles for a session, in order: the tail of the session id
    widening 4 -> 6 -> 8 -> whole, then (every rung held) the whole id with the claiming pid."""
    where = slug(os.path.basename(cwd.rstrip("/")) if cwd else "")
    full = slug(session_id)
    tails = [tail(full, w) for w in (4, 6, 8) if w < len(full)] + [full]
    out: list[str] = []
    for piece in [t for t in tails if t] + [f"{full}-{pid}"]:
        handle = handle_for(where, piece)
        if handle not in out and valid_handle(handle) and handle not in RESERVED_HANDLES:
            out.append(handle)
    return out


def pinned_handle(pin: str | None) -> tuple[str | None, str | None]:
    """(handle, None) for a usable HELM_MAIL_HANDLE, or (None, why it is not used)."""
    if not pin or not pin.strip():
        return None, None
    handle = slug(pin)
    if handle in RESERVED_HANDLES:
        return None, "reserved"
    if not valid_handle(handle):
        handle = handle[:MAX_NAME_BYTES].strip("-")
        if not valid_handle(handle):
            return None, "invalid"
    return handle, None


def derive_handle(
    cwd: str,
    session_id: str,
    held_by_another: Callable[[str], bool],
    *,
    pid: int,
    pinned: str | None = None,
) -> tuple[str, str | None]:
    """The handle this session claims, and a note for the log (why a pin was not used), or raises
    LookupError when every candidate is held (the caller adds randomness; it never overwrites).

    `held_by_another(handle)` says whether another session's box sits there and must not be taken.
    """
    note = None
    pin, why = pinned_handle(pinned)
    if pin is not None:
        if not held_by_another(pin):
            return pin, None
        note = "pin_held"
    elif why is not None:
        note = f"pin_{why}"
    for candidate in ladder(cwd, session_id, pid):
        if not held_by_another(candidate):
            return candidate, note
    raise LookupError("every candidate handle is held")
