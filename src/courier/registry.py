"""Claude Code's session registry: records by pid and by session id, and liveness as Claude judges it.

Trust: a record is written by whichever process owns the file and may be torn
(Claude writes it in place), oversized or hostile. Reads are bounded to 256 KiB
and never follow a symlink; every field is type-checked. A record never makes
courier connect anywhere by itself: `vet_socket` decides that, from lstat data.
Logs: nothing; callers log the reasons this module returns.
Limits: liveness on macOS compares `ps -o lstart=` as Claude does; only Linux
is exercised by the tests.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, NamedTuple

from . import mailbox

MAX_RECORD_BYTES = 262_144  # Claude's own reader limit
RECORD_NAME_RE = re.compile(r"^[1-9][0-9]{0,9}\.json$")
# Claude's socket basenames: <pid>.sock, <pid>-<8hex>.sock (pid-namespace clash), <=16 hex.
SOCKET_NAME_RE = re.compile(r"^(?:[0-9]+(?:-[0-9a-f]{8})?|[0-9a-f]{1,16})\.sock$")
MAX_SOCKET_PATH_BYTES = 103


class Record(NamedTuple):
    pid: int
    session_id: str
    proc_start: str | None
    pid_domain: str | None
    socket_path: str | None
    status: str | None
    spare: bool
    parked: bool
    version: str | None
    kind: str | None
    started_at: float | None


class BadRecord(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def parse_record(data: Any, expect_pid: int | None = None) -> Record:
    """Type-check a registry record; raises BadRecord(reason)."""
    if not isinstance(data, dict):
        raise BadRecord("record_not_object")
    pid = data.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
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

    started = data.get("startedAt")
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
        started_at=float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else None,
    )


def record_path(registry: Path, pid: int) -> Path:
    return registry / f"{int(pid)}.json"


def pid_of_record_name(name: str) -> int | None:
    return int(name[:-5]) if RECORD_NAME_RE.match(name) else None


def read_record_once(path: Path, expect_pid: int | None = None) -> Record:
    """One bounded read. Raises FileNotFoundError, BadRecord('torn' etc.), mailbox.Unsafe."""
    try:
        data = mailbox.read_json_object(path, MAX_RECORD_BYTES)
    except mailbox.Unsafe as exc:
        if exc.reason in ("malformed_json", "not_an_object"):
            raise BadRecord("record_torn") from None
        raise BadRecord(f"record_{exc.reason}") from None
    return parse_record(data, expect_pid)


def list_record_pids(registry: Path) -> list[int]:
    pids = []
    with os.scandir(registry) as entries:
        for entry in entries:
            pid = pid_of_record_name(entry.name)
            if pid is not None:
                pids.append(pid)
    return pids


# ---------------------------------------------------------------- liveness


def proc_start(pid: int) -> str | None:
    """Claude's start token for a pid: Linux field 22 of /proc/<pid>/stat; None if gone."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{int(pid)}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        try:
            return raw[raw.rindex(")") + 2 :].split(" ")[19]
        except (ValueError, IndexError):
            return None
    import subprocess  # macOS only; kept off the Linux hook path

    try:
        out = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(int(pid))],
            capture_output=True,
            text=True,
            timeout=2,
            env={"LC_ALL": "C", "TZ": "UTC", "PATH": "/bin:/usr/bin"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text or None


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
            machine = Path("/etc/machine-id").read_text().strip()
            ns = os.readlink("/proc/self/ns/pid")
            value = f"linux:{machine}:{ns}"
        except OSError:
            value = None
    _pid_domain_cache.append(value)
    return value


def liveness_problem(record: Record, live_start: str | None, own_domain: str | None) -> str | None:
    """Claude's own rule, pure: None if live, else a reason."""
    if record.pid_domain and own_domain and record.pid_domain != own_domain:
        return "foreign_pid_domain"
    if live_start is None:
        return "pid_dead"
    if record.proc_start is None:
        return "no_proc_start"
    if str(record.proc_start) != str(live_start):
        return "pid_reused"
    return None


def live_start_of(record: Record) -> str | None:
    return proc_start(record.pid) if pid_exists(record.pid) else None


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
    if not SOCKET_NAME_RE.match(parts[-1]):
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
    if stat.S_ISLNK(parent.st_mode) or not stat.S_ISDIR(parent.st_mode):
        return "socket_dir_not_directory"
    if parent.st_uid != uid:
        return "socket_dir_foreign_owner"
    if parent.st_mode & 0o077:
        return "socket_dir_permissive"
    return None


def vet_socket(path: str, uid: int | None = None) -> str | None:
    """All checks before courier may connect; None if Claude itself would accept this socket."""
    uid = os.getuid() if uid is None else uid
    problem = vet_socket_shape(path)
    if problem:
        return problem
    try:
        sock = os.lstat(path)
    except FileNotFoundError:
        return "socket_missing"
    except NotADirectoryError:
        return "socket_missing"
    except PermissionError:
        return "permission"
    try:
        parent = os.lstat(os.path.dirname(path))
    except OSError:
        return "socket_missing"
    return vet_socket_stats(sock, parent, uid)


def read_record(registry: Path, pid: int, sleep=None) -> Record:
    """Read sessions/<pid>.json, re-reading once after 25 ms on a torn read (Claude writes in place).

    Raises FileNotFoundError or BadRecord(reason).
    """
    path = record_path(registry, pid)
    try:
        return read_record_once(path, pid)
    except BadRecord as exc:
        if exc.reason != "record_torn":
            raise
    (sleep or __import__("time").sleep)(0.025)
    return read_record_once(path, pid)


def candidate_records(registry: Path, pids, read=None) -> tuple[list[Record], dict[int, str]]:
    """Read the records at `pids`; (records, {pid: reason}) for those that could not be used."""
    read = read or (lambda pid: read_record(registry, pid))
    found, problems = [], {}
    for pid in sorted(set(p for p in pids if p)):
        try:
            found.append(read(pid))
        except FileNotFoundError:
            problems[pid] = "no_record"
        except NotADirectoryError:
            problems[pid] = "no_record"
        except BadRecord as exc:
            problems[pid] = exc.reason
        except PermissionError:
            problems[pid] = "record_unreadable"
    return found, problems


def session_index(registry: Path) -> dict[str, list[int]]:
    """sessionId -> pids, from every record that parses. Missing dir -> empty."""
    index: dict[str, list[int]] = {}
    try:
        pids = list_record_pids(registry)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return index
    for pid in pids:
        try:
            rec = read_record_once(record_path(registry, pid), pid)
        except (OSError, BadRecord):
            continue
        index.setdefault(rec.session_id, []).append(pid)
    return index
