"""Claude Code's session registry: records, the session index, liveness as Claude judges it, socket vetting.

Trust: a record is written by whichever process owns the file and may be torn
(Claude writes it in place), oversized or hostile. Reads are bounded to 256 KiB,
never follow a symlink and parse through `safeio`; every field is type-checked.
A record never makes courier connect anywhere by itself: `vet_socket` decides
that, from lstat data (a real socket, one link, ours, in a private directory).
Logs: nothing; callers log the reasons this module returns.
Limits: liveness on macOS rebuilds `ps -o lstart=` (UTC) from psutil's process
start time; only Linux is exercised by the tests.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections import namedtuple
from collections.abc import Iterable

from . import safeio

MAX_RECORD_BYTES = 262_144  # Claude's own reader limit
# `<pid>.json` is what Claude writes; `<pid>-<suffix>.json` is tolerated (other tools
# and future releases); the record itself must name the same pid.
RECORD_NAME = safeio.WholeName(r"([1-9][0-9]{0,9})(?:-[A-Za-z0-9._-]{1,64})?\.json")
# Claude's socket basenames: <pid>.sock, <pid>-<8hex>.sock (pid-namespace clash), <=16 hex.
SOCKET_NAME = safeio.WholeName(r"(?:[0-9]+(?:-[0-9a-f]{8})?|[0-9a-f]{1,16})\.sock")
MAX_SOCKET_PATH_BYTES = 103
# peerProtocol values courier has been tested against: every release from 2.1.200 to 2.1.332
# writes 1 (research/claude-code-versions.md). Anything else is never written to.
SUPPORTED_PROTOCOLS = frozenset({1})
OLDEST_WITH_SOCKET = (2, 1, 248)  # oldest release whose sessions open a socket with no flag
OLDEST_WITH_MESSAGING = (2, 1, 224)  # messaging exists from here, behind CLAUDE_CODE_HARBOR_KITE=1


# One registry record, type-checked: pid, session_id; proc_start, pid_domain, socket_path, status, version,
# kind: str | None; spare, parked: bool; started_at: float | None; peer_protocol: int | None; name: the file name.
Record = namedtuple(
    "Record",
    "pid session_id proc_start pid_domain socket_path status spare parked version kind started_at peer_protocol name",
    defaults=(None, None),
)


class BadRecord(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def parse_record(data: object, expect_pid: int | None = None, name: str | None = None) -> Record:
    """Type-check a registry record; raises BadRecord(reason)."""
    if not isinstance(data, dict):
        raise BadRecord("record_not_object")
    pid = safeio.positive_int(data.get("pid"), 2**31)
    if pid is None:
        raise BadRecord("record_bad_pid")
    if expect_pid is not None and pid != expect_pid:
        raise BadRecord("record_pid_mismatch")
    sid = data.get("sessionId")
    if not isinstance(sid, str) or not sid or len(sid) > 256:
        raise BadRecord("record_bad_session_id")

    def opt_str(key: str, limit: int = 4096) -> str | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > limit:
            raise BadRecord(f"record_bad_{key}")
        return value

    protocol = data.get("peerProtocol")
    return Record(
        pid=pid,
        session_id=sid,
        proc_start=opt_str("procStart", 128),
        pid_domain=opt_str("pidDomain", 512),
        socket_path=opt_str("messagingSocketPath", 4096) or None,
        status=opt_str("status", 64),
        spare=data.get("spare") is True,
        parked=data.get("parkedJobId") not in (None, "", False),
        version=opt_str("version", 64),
        kind=opt_str("kind", 64),
        started_at=safeio.finite_number(data.get("startedAt")),
        peer_protocol=protocol if isinstance(protocol, int) and not isinstance(protocol, bool) and 0 <= protocol < 1000 else None,
        name=name,
    )


def parse_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits or len(digits) > 6:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 3 else None


def support(version: str | None, protocol: int | None, has_socket: bool) -> tuple[bool, str]:
    """Whether courier can ring this Claude Code session by its socket, and what to do if not."""
    if has_socket and protocol in SUPPORTED_PROTOCOLS:
        return True, "supported"
    if has_socket:
        return False, (f"peerProtocol {protocol!r} is not one courier was tested with; courier will not write to it "
                       "(its waiter or the next prompt delivers). Update courier, or report the new protocol.")
    parsed = parse_version(version)
    if parsed is not None and parsed < OLDEST_WITH_MESSAGING:
        return False, (f"Claude Code {version} has no cross-session messaging; install courier's waiter "
                       "(courier hooks install) or update Claude Code to 2.1.248 or later")
    if parsed is not None and parsed < OLDEST_WITH_SOCKET:
        return False, (f"Claude Code {version} opens its socket only with CLAUDE_CODE_HARBOR_KITE=1 (or update to "
                       "2.1.248 or later); the waiter wakes it meanwhile")
    return False, ("no messaging socket (CLAUDE_CODE_HARBOR_KITE=0, or a provider without messaging); "
                   "courier's waiter wakes it if installed (courier hooks install)")


def record_path(registry: str, pid: int) -> str:
    return os.path.join(registry, f"{int(pid)}.json")


def pid_of_record_name(name: str) -> int | None:
    m = RECORD_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def read_record_once(registry: str, name: str) -> Record:
    """One bounded read of sessions/<name>. Raises FileNotFoundError or BadRecord(reason)."""
    pid = pid_of_record_name(name)
    if pid is None:
        raise BadRecord("record_bad_name")
    try:
        data = safeio.read_json_object(os.path.join(registry, name), MAX_RECORD_BYTES)
    except safeio.Unsafe as exc:
        if exc.reason in ("malformed_json", "not_an_object", "not_utf8"):
            raise BadRecord("record_torn") from None  # Claude writes in place: a half-written record
        raise BadRecord(f"record_{exc.reason}") from None
    except (IsADirectoryError, NotADirectoryError):
        raise BadRecord("record_not_regular") from None
    except PermissionError:
        raise BadRecord("record_unreadable") from None
    return parse_record(data, pid, name)


def read_record(registry: str, name_or_pid: str | int, sleep=time.sleep) -> Record:
    """Read one record, re-reading once after 25 ms on a torn read (Claude writes in place).

    Raises FileNotFoundError or BadRecord(reason).
    """
    name = f"{int(name_or_pid)}.json" if isinstance(name_or_pid, int) else name_or_pid
    try:
        return read_record_once(registry, name)
    except BadRecord as exc:
        if exc.reason != "record_torn":
            raise
    sleep(0.025)
    return read_record_once(registry, name)


def list_record_names(registry: str) -> list[str]:
    """Names in sessions/ shaped like records. Raises OSError if the directory cannot be listed."""
    with os.scandir(registry) as entries:
        return sorted(e.name for e in entries if RECORD_NAME.fullmatch(e.name))


# ---------------------------------------------------------------- the session index


class SessionIndex:
    """sessionId -> record names and pid -> record names, from every record that parses.

    Kept up to date from watcher events (`update(names)`) and rebuilt at each rescan.
    """

    def __init__(self) -> None:
        self.by_sid: dict[str, set[str]] = {}
        self.by_pid: dict[int, set[str]] = {}
        self._sid_of: dict[str, str] = {}

    @classmethod
    def build(cls, registry: str) -> "SessionIndex":
        index = cls()
        try:
            names = list_record_names(registry)
        except OSError:
            return index
        index.update(registry, names)
        return index

    def update(self, registry: str, names: Iterable[str]) -> set[str]:
        """Re-read these record names; returns the session ids they named before or now."""
        touched: set[str] = set()
        for name in names:
            pid = pid_of_record_name(name)
            if pid is None:
                continue
            old = self._sid_of.pop(name, None)
            if old is not None:
                touched.add(old)
                self._discard(self.by_sid, old, name)
                self._discard(self.by_pid, pid, name)
            try:
                rec = read_record_once(registry, name)
            except (OSError, BadRecord):
                continue
            self._sid_of[name] = rec.session_id
            self.by_sid.setdefault(rec.session_id, set()).add(name)
            self.by_pid.setdefault(pid, set()).add(name)
            touched.add(rec.session_id)
        return touched

    @staticmethod
    def _discard(table: dict, key, name: str) -> None:
        names = table.get(key)
        if names is not None:
            names.discard(name)
            if not names:
                del table[key]

    def names_for(self, session_id: str | None, pid: int | None) -> set[str]:
        """Record names that may be this session's: those naming the session id, and those at the pid."""
        names = set(self.by_sid.get(session_id or "", ()))
        if pid:
            names |= self.by_pid.get(pid, set()) or {f"{pid}.json"}
        return names

    def __len__(self) -> int:
        return len(self._sid_of)


def candidate_records(registry: str, names: Iterable[str], read=None) -> tuple[list[Record], dict[int, str]]:
    """Read these records; (records, {pid: reason}) for those that could not be used."""
    read = read or (lambda name: read_record(registry, name))
    found, problems = [], {}
    for name in sorted(set(names)):
        pid = pid_of_record_name(name)
        if pid is None:
            continue
        try:
            found.append(read(name))
        except (FileNotFoundError, NotADirectoryError):
            problems.setdefault(pid, "no_record")
        except BadRecord as exc:
            problems[pid] = exc.reason
        except OSError:
            problems[pid] = "record_unreadable"
    return found, problems


# ---------------------------------------------------------------- liveness


def proc_start(pid: int) -> str | None:
    """Claude's start token for a pid; None if gone.

    Linux: field 22 of /proc/<pid>/stat. macOS: `LC_ALL=C TZ=UTC ps -o lstart=`, rebuilt from
    psutil's start time (the same second) rather than running `ps` inside the event loop.
    """
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{int(pid)}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except (OSError, ValueError, OverflowError):
            return None
        try:
            return raw[raw.rindex(")") + 2 :].split(" ")[19]
        except (ValueError, IndexError):
            return None
    import psutil  # off the Linux hook path

    try:
        started = psutil.Process(int(pid)).create_time()
    except (psutil.Error, ValueError, OverflowError, OSError):
        return None
    return time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(int(started)))


def pid_exists(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


_pid_domain_cache: list[str | None] = []


def own_pid_domain() -> str | None:
    """`linux:<machine-id>:<pid ns>` as Claude writes it; None where it cannot be read."""
    if _pid_domain_cache:
        return _pid_domain_cache[0]
    value = None
    if sys.platform.startswith("linux"):
        try:
            with open("/etc/machine-id", encoding="utf-8", errors="replace") as f:
                machine = f.read().strip()
            ns = os.readlink("/proc/self/ns/pid")
            value = f"linux:{machine}:{ns}"
        except OSError:
            value = None
    _pid_domain_cache.append(value)
    return value


def liveness_problem(record: Record, live_start: str | None, own_domain: str | None) -> str | None:
    """Claude's own rule, pure: None if the record's process is alive, else a reason.

    A record without `procStart` (other tools, older releases) is judged by the pid alone;
    `weak_evidence` says so, and the doorbell's pinned session id guards the rest.
    """
    if record.pid_domain and own_domain and record.pid_domain != own_domain:
        return "foreign_pid_domain"
    if live_start is None:
        return "pid_dead"
    if record.proc_start is not None and str(record.proc_start) != str(live_start):
        return "pid_reused"
    return None


def weak_evidence(record: Record) -> bool:
    return record.proc_start is None


def live_start_of(pid: int) -> str | None:
    return proc_start(pid) if pid_exists(pid) else None


def check_liveness(record: Record) -> str | None:
    """`liveness_problem` with the live facts read from this machine."""
    return liveness_problem(record, live_start_of(record.pid), own_pid_domain())


# ---------------------------------------------------------------- socket vetting


def vet_socket_shape(path: str) -> str | None:
    """Pure checks on the path string itself; None if acceptable."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "socket_path_not_absolute"
    if "\x00" in path or "\n" in path:
        return "socket_path_invalid"
    if len(path.encode("utf-8", "surrogateescape")) > MAX_SOCKET_PATH_BYTES:
        return "socket_path_too_long"
    parts = path.split("/")
    if ".." in parts or "." in parts:
        return "socket_path_invalid"
    if not SOCKET_NAME.fullmatch(parts[-1]):
        return "socket_name_unexpected"
    return None


def vet_socket_stats(sock: os.stat_result, parent: os.stat_result, uid: int) -> str | None:
    """Pure checks on lstat results of the socket and its directory."""
    if stat.S_ISLNK(sock.st_mode):
        return "socket_symlink"
    if not stat.S_ISSOCK(sock.st_mode):
        return "not_a_socket"
    if sock.st_uid != uid:
        return "foreign_owner"
    if sock.st_nlink != 1:
        # A hard link to somebody else's socket, planted in a private directory.
        return "socket_hard_linked"
    return private_dir_problem(parent, uid)


def private_dir_problem(st: os.stat_result, uid: int) -> str | None:
    """A socket directory must be a real directory, ours, with no group or other bits (Claude's own rule)."""
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "socket_dir_not_directory"
    if st.st_uid != uid:
        return "socket_dir_foreign_owner"
    if st.st_mode & 0o077:
        return "socket_dir_permissive"
    return None


def vet_socket_dir(directory: str, uid: int | None = None) -> str | None:
    """A directory courier may bind a listener in: absolute, real, ours, private."""
    uid = os.getuid() if uid is None else uid
    if not directory.startswith("/"):
        return "socket_path_not_absolute"
    try:
        st = os.lstat(directory)
    except OSError:
        return "socket_missing"
    return private_dir_problem(st, uid)


def vet_socket(path: str, uid: int | None = None) -> str | None:
    """All checks before courier may connect; None if Claude itself would accept this socket."""
    uid = os.getuid() if uid is None else uid
    problem = vet_socket_shape(path)
    if problem:
        return problem
    try:
        sock = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "socket_missing"
    except PermissionError:
        return "permission"
    except OSError:  # ELOOP in a parent, ENAMETOOLONG...
        return "socket_missing"
    try:
        parent = os.lstat(os.path.dirname(path))
    except OSError:
        return "socket_missing"
    return vet_socket_stats(sock, parent, uid)
