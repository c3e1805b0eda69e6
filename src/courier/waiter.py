"""`courier hook wait`: a background Stop/SessionStart hook that blocks until the daemon rings it, then wakes its session.

Claude Code keeps an `async` + `asyncRewake` hook running after a turn; when it exits 2
a new turn starts and the model reads its stderr. The waiter is only a transport: the
daemon decides whether and when to wake (batching, pacing, the wake cap, the log). The
waiter registers itself, blocks in poll() with no timeout, and when rung shows the mail
exactly as the prompt hook does (`hooks.present`: paths, never bodies) on stderr and
stdout, moves what it showed into read/, answers the daemon and exits 2.

One waiter per Claude process, keyed by Claude's pid (not the session id: /clear keeps
the process and its waiter, and a resumed session has a new pid): an flock on
<state>/waiters/<pid>.lock held for the waiter's life. Claude arms a new waiter at every
Stop; each extra one finds the lock held and exits 0 at once.

Trust: the waiter serves only the Claude process it descends from ($CLAUDE_PID must be
its parent or grandparent, alive, with the registry record's procStart). Its socket is
0600 in a 0700 directory and a connection is served only if SO_PEERCRED names our uid;
a ring is one bounded JSON line, and the session it names must be the one Claude's
registry lists for our pid. Nothing from a message reaches the socket; the notice is
`hooks.present`'s, written before the consume completes, so a failed write (Claude gone)
leaves the mail queued.
Logs: waiter_registered, waiter_rung, waiter_empty, waiter_stood_down, waiter_refused,
waiter_failed in <state>/hooks.log (plus present's hook_delivered via=waiter).
Limits: stdlib + courier's stdlib-only modules (a waiter per idle session must stay
small: 14 MB RSS measured, 0 wakeups idle; no trio). Exits 0 on SIGTERM/SIGINT/SIGHUP, when its stdout/stderr hang
up (Claude SIGKILLed: no signal comes, but the sockets report POLLHUP), when told to
stand down, and on any doubt at start. Claude's hook `timeout` still ends it (measured:
2147483 s is the useful maximum); SIGKILL leaves files that the next waiter or the
daemon cleans. The grandparent check reads /proc (Linux); elsewhere only a direct parent
(the `exec` form of the hook command) is accepted.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from collections import namedtuple

from . import hooks, paths, registry, safeio

WAITERS_DIR = "waiters"
MAX_REQUEST = 4096
READ_TIMEOUT_S = 1.0  # a connected peer gets this long to send its line
LOCK_TRIES = 20  # x LOCK_PAUSE_S: the daemon's stale-entry cleaner holds a lock for microseconds
LOCK_PAUSE_S = 0.01
MAX_SESSION_ID = 256
EXIT_WOKE = 2  # Claude starts a turn on exit status 2

# Replies on the socket (one line each).
OK, EMPTY, GONE, ERROR = b"ok\n", b"empty\n", b"gone\n", b"error\n"
WRONG_SESSION, BAD_REQUEST = b"wrong_session\n", b"bad_request\n"


# pid: Claude's pid (the file name's too); session_id: the session the waiter was started for (it may have
# been /cleared since); proc_start: Claude's start token; socket; waiter_pid; waiter_start; started_at.
Registration = namedtuple("Registration", "pid session_id proc_start socket waiter_pid waiter_start started_at")


# ---------------------------------------------------------------- the directory and its files (shared with `waiters`)


def waiters_dir(state_dir: Path) -> Path:
    return Path(state_dir) / WAITERS_DIR


def json_path(directory: Path, pid: int) -> Path:
    return directory / f"{int(pid)}.json"


def sock_path(directory: Path, pid: int) -> Path:
    return directory / f"{int(pid)}.sock"


def lock_path(directory: Path, pid: int) -> Path:
    return directory / f"{int(pid)}.lock"


def pid_of_name(name: str) -> int | None:
    """`<pid>.json` -> pid; anything else None."""
    stem, _dot, ext = name.partition(".")
    if ext != "json" or not stem.isdigit() or len(stem) > 10 or stem.startswith("0"):
        return None
    return int(stem)


def dir_problem(directory: Path, uid: int | None = None) -> str | None:
    """None if the directory is real, ours and private (0700); else why not."""
    return registry.vet_socket_dir(os.fspath(directory), uid)


def prepare_dir(state_dir: Path) -> Path:
    """Create <state>/waiters (0700) if needed. Raises OSError, or ValueError(reason) if it is not private."""
    directory = waiters_dir(state_dir)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    problem = dir_problem(directory)
    if problem:
        raise ValueError(problem)
    return directory


def parse_registration(data: dict, pid: int) -> Registration | None:
    if safeio.positive_int(data.get("pid")) != pid:
        return None
    sid = safeio.short_str(data.get("sessionId"), MAX_SESSION_ID)
    start = safeio.short_str(data.get("procStart"), 128)
    waiter_pid = safeio.positive_int(data.get("waiterPid"))
    sock = safeio.short_str(data.get("socket"), 4096)
    if sid is None or start is None or waiter_pid is None or sock is None:
        return None
    return Registration(pid, sid, start, sock, waiter_pid, safeio.short_str(data.get("waiterStart"), 128),
                        safeio.finite_number(data.get("startedAt")))


def read_registration(directory: Path, pid: int) -> Registration | None:
    """The registration for Claude pid `pid`, None if absent or unusable. Never raises."""
    try:
        data = safeio.read_json_object(json_path(directory, pid), 8192)
    except (OSError, safeio.Unsafe):
        return None
    return parse_registration(data, pid)


def running_start(pid: int) -> str | None:
    """The pid's start token if it runs (a zombie does not: it is dead, only not yet reaped)."""
    if not sys.platform.startswith("linux"):
        return registry.proc_start(pid)
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            fields = f.read().decode("ascii", "replace").rsplit(")", 1)[1].split(" ")
    except (OSError, ValueError, OverflowError, IndexError):
        return None
    if len(fields) < 21 or fields[1] in ("Z", "X", "x"):
        return None
    return fields[20]


def alive(reg: Registration) -> bool:
    """Both processes still the ones registered: Claude's pid with its start token, and the waiter's."""
    if running_start(reg.pid) != reg.proc_start:
        return False
    waiter_start = running_start(reg.waiter_pid)
    return waiter_start is not None and (reg.waiter_start is None or waiter_start == reg.waiter_start)


def take_lock(directory: Path, pid: int, *, tries: int = 1, pause: float = LOCK_PAUSE_S) -> int | None:
    """An fd holding the exclusive flock on <pid>.lock, or None if another process holds it.

    The lock file may be unlinked by whoever holds it (a waiter leaving, the cleaner), so after
    locking we check that the path still names the inode we locked, and start over if not.
    """
    path = lock_path(directory, pid)
    busy = 0
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            busy += 1
            if busy >= tries:
                return None
            time.sleep(pause)
            continue
        except BaseException:
            os.close(fd)
            raise
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)  # unlinked (or replaced) between our open and our lock: take the new one


def remove_files(directory: Path, pid: int) -> None:
    """Unlink a registration's files; the caller holds its lock. The lock file goes last."""
    for path in (json_path(directory, pid), sock_path(directory, pid), lock_path(directory, pid)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def clean_if_stale(directory: Path, pid: int) -> bool:
    """Remove a registration nobody holds (its waiter died without cleaning up). True if removed."""
    try:
        fd = take_lock(directory, pid)
    except OSError:
        return False
    if fd is None:
        return False  # a live waiter holds it
    try:
        remove_files(directory, pid)
    finally:
        os.close(fd)
    return True


# ---------------------------------------------------------------- who we serve


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
        return int(raw[raw.rindex(")") + 2 :].split(" ")[1])
    except (OSError, ValueError, IndexError):
        return None


def serves(claude_pid: int) -> bool:
    """True if Claude is our parent (an `exec` hook command) or grandparent (`sh -c`, the default)."""
    parent = os.getppid()
    if parent == claude_pid:
        return True
    if not sys.platform.startswith("linux"):
        return False
    return parent > 1 and _parent_of(parent) == claude_pid


def claude_pid_of(env: Mapping[str, str], session_id: str, reg_dir: Path) -> int | None:
    """$CLAUDE_PID (set by Claude Code for its hooks); without it, the live registry pid of the session."""
    raw = env.get("CLAUDE_PID", "").strip()
    if raw:
        return int(raw) if raw.isdigit() and len(raw) <= 10 and 0 < int(raw) < 2**31 else None
    return hooks.registry_pid_for(reg_dir, session_id)


# ---------------------------------------------------------------- the process


class StandDown(Exception):
    """A signal arrived: show nothing more, consume nothing."""


class NoticeFailed(Exception):
    """stderr would not take the notice (Claude is gone): present() stops before consuming."""

    def __init__(self, err: int | None):
        super().__init__(err)
        self.errno = err


class _Notice:
    """The `out` handed to hooks.present: stderr first (what the model reads), then stdout.

    Writing happens before present() consumes anything; if stderr cannot take the notice
    (Claude is gone: EPIPE) the exception stops present() before the consume.
    """

    def __init__(self, err_fd: int, out_fd: int, stopping):
        self.err_fd, self.out_fd, self.stopping = err_fd, out_fd, stopping
        self.written = 0

    def write(self, text: str) -> int:
        if self.stopping():
            raise StandDown()
        data = text.encode("utf-8", "replace")
        try:
            _write_all(self.err_fd, data)
        except OSError as exc:
            raise NoticeFailed(exc.errno) from None
        if self.out_fd != self.err_fd:
            try:
                _write_all(self.out_fd, data)
            except OSError:
                pass  # stdout is ignored by Claude whenever stderr has text
        self.written += len(data)
        return len(text)

    def flush(self) -> None:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _peer_uid(conn: socket.socket) -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[1]


def _read_line(conn: socket.socket) -> bytes | None:
    """One line of at most MAX_REQUEST bytes (EOF ends it too); None if too long or nothing came."""
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(MAX_REQUEST + 1 - len(buf))
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            return None
    line = buf.split(b"\n", 1)[0]
    return line or None


class Waiter:
    def __init__(self, env: Mapping[str, str], log, *, session_id: str, claude_pid: int, proc_start: str,
                 directory: Path, lock_fd: int, out_fd: int, err_fd: int, wake_fd: int, caught: list):
        self.env, self.log = env, log
        self.session_id, self.claude_pid, self.proc_start = session_id, claude_pid, proc_start
        self.directory, self.lock_fd = directory, lock_fd
        self.out_fd, self.err_fd, self.wake_fd = out_fd, err_fd, wake_fd
        self.reg_dir = paths.registry_dir(paths.claude_config_dir(env))
        self.listener: socket.socket | None = None
        self.registered = False
        self.caught = caught  # signal numbers, appended by the handler

    @property
    def signalled(self) -> int | None:
        return self.caught[-1] if self.caught else None

    # ------------------------------------------------------------ registration

    def register(self) -> None:
        path = sock_path(self.directory, self.claude_pid)
        try:
            os.unlink(path)  # a dead waiter's; we hold the lock, so it is nobody's
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener = listener
        old = os.umask(0o177)  # born 0600
        try:
            listener.bind(os.fspath(path))
        finally:
            os.umask(old)
        listener.listen(8)
        listener.setblocking(False)
        self.registered = True  # from here on, our files are ours to remove
        safeio.write_json_atomic(json_path(self.directory, self.claude_pid), {
            "pid": self.claude_pid,
            "sessionId": self.session_id,
            "procStart": self.proc_start,
            "socket": os.fspath(path),
            "waiterPid": os.getpid(),
            "waiterStart": registry.proc_start(os.getpid()),
            "startedAt": round(time.time(), 3),
        })

    def unregister(self) -> None:
        """Exactly once: after the lock file is gone a new waiter may register at the same paths."""
        if not self.registered:
            return
        self.registered = False
        remove_files(self.directory, self.claude_pid)

    def close(self) -> None:
        self.unregister()
        if self.listener is not None:
            self.listener.close()
        os.close(self.lock_fd)

    # ------------------------------------------------------------ waiting

    def run(self) -> int:
        poller = select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        poller.register(self.wake_fd, select.POLLIN)
        # Events 0: only POLLHUP/POLLERR/POLLNVAL are reported, which is how a SIGKILLed Claude shows.
        stdio = {self.out_fd, self.err_fd}
        for fd in stdio:
            poller.register(fd, 0)
        while True:
            if self.signalled is not None:
                return self.stand_down("signal", signum=self.signalled)
            ready = dict(poller.poll())  # no timeout: no wakeups while nothing happens
            if any(ready.get(fd, 0) & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for fd in stdio):
                return self.stand_down("session_gone")
            if self.wake_fd in ready:
                continue  # a signal: handled at the top of the loop
            if self.listener.fileno() in ready:
                result = self.serve_one()
                if result is not None:
                    return result

    def stand_down(self, reason: str, **fields) -> int:
        self.unregister()
        self.log("waiter_stood_down", pid=self.claude_pid, session_id=self.session_id, reason=reason, **fields)
        return 0

    def serve_one(self) -> int | None:
        """Answer one connection. Returns the exit status if the waiter is done, None to keep waiting."""
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return None
        with conn:
            try:
                conn.settimeout(READ_TIMEOUT_S)
                uid = _peer_uid(conn)
                if uid is not None and uid != os.getuid():
                    self.log("waiter_refused", level="warning", reason="peer_foreign_uid", peer_uid=uid)
                    return None
                line = _read_line(conn)
            except OSError:
                return None  # a peer that stalls or resets costs it its ring, not us our wait
            return self.answer(conn, line)

    def answer(self, conn: socket.socket, line: bytes | None) -> int | None:
        request = None
        if line is not None:
            try:
                request = safeio.loads_object(line)
            except safeio.Unsafe:
                request = None
        if request is None:
            _reply(conn, BAD_REQUEST)
            return None
        if request.get("standDown") is True:
            code = self.stand_down("told")
            _reply(conn, OK)
            return code
        ring = safeio.positive_int(request.get("ring"), 2**62)
        sid = request.get("sessionId", self.session_id)
        if ring is None or not isinstance(sid, str) or not sid or len(sid) > MAX_SESSION_ID:
            _reply(conn, BAD_REQUEST)
            return None
        if not self.session_is_ours(sid):
            self.log("waiter_refused", level="warning", reason="wrong_session", pid=self.claude_pid,
                     session_id=sid, ring=ring)
            _reply(conn, WRONG_SESSION)
            return None
        notice = _Notice(self.err_fd, self.out_fd, lambda: self.signalled is not None)
        try:
            shown = hooks.present(self.env, sid, notice, self.log, via="waiter")
        except StandDown:
            _reply(conn, GONE)
            return self.stand_down("signal", signum=self.signalled)
        except NoticeFailed as exc:
            # Claude is gone (EPIPE) and nothing was consumed: the mail stays for whoever comes next.
            _reply(conn, GONE)
            return self.stand_down("session_gone", errno=errno.errorcode.get(exc.errno or 0, "oserror"))
        except OSError as exc:
            self.log("waiter_failed", level="error", reason="present", ring=ring,
                     errno=errno.errorcode.get(exc.errno or 0, "oserror"), after_notice=bool(notice.written))
            if not notice.written:
                _reply(conn, ERROR)  # nothing shown, nothing taken: keep waiting
                return None
            shown = 0  # the notice is out: wake (at worst the prompt shows some of it again)
        if not notice.written:
            self.log("waiter_empty", pid=self.claude_pid, session_id=sid, ring=ring)
            _reply(conn, EMPTY)
            return None
        self.unregister()
        _reply(conn, OK)
        self.log("waiter_rung", pid=self.claude_pid, session_id=sid, ring=ring, shown=shown, at=round(time.time(), 4))
        return EXIT_WOKE

    def session_is_ours(self, sid: str) -> bool:
        """The registry must list `sid` for our Claude (same process); without a record, only our own id."""
        try:
            rec = registry.read_record(self.reg_dir, self.claude_pid)
        except FileNotFoundError:
            return sid == self.session_id
        except (OSError, registry.BadRecord):
            return False
        if rec.proc_start is not None and rec.proc_start != self.proc_start:
            return False
        return rec.session_id == sid


def _reply(conn: socket.socket, word: bytes) -> None:
    try:
        conn.sendall(word)
    except OSError:
        pass  # the daemon gave up on us; what we did stands


def _stdio_open(*fds: int) -> bool:
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            return False
    return True


def main(env: Mapping[str, str], payload: dict, log, *, out_fd: int = 1, err_fd: int = 2) -> int:
    """The `wait` hook. 0: stood down (or not needed); 2: woke the session."""
    session_id = payload.get("session_id") or env.get("CLAUDE_CODE_SESSION_ID") or ""
    if not isinstance(session_id, str) or not session_id or len(session_id) > MAX_SESSION_ID:
        return 0
    if not _stdio_open(out_fd, err_fd):
        return 0  # a closed stdio fd would be reused by our own sockets and polled by mistake

    # Signals first: from here on SIGTERM means "stand down", never a half-written registration.
    # The handler only notes the signal; the wakeup fd ends the poll() it interrupted.
    caught: list[int] = []
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        return _main(env, session_id, log, out_fd, err_fd, wake_r, caught)
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(wake_r)
        os.close(wake_w)


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "oserror")


def _main(env, session_id: str, log, out_fd: int, err_fd: int, wake_r: int, caught: list) -> int:
    reg_dir = paths.registry_dir(paths.claude_config_dir(env))
    claude_pid = claude_pid_of(env, session_id, reg_dir)
    if claude_pid is None:
        log("waiter_refused", reason="no_claude_pid", session_id=session_id)
        return 0
    start = running_start(claude_pid)
    if start is None:
        log("waiter_stood_down", pid=claude_pid, session_id=session_id, reason="claude_dead")
        return 0
    if not serves(claude_pid):
        log("waiter_refused", level="warning", reason="not_our_claude", pid=claude_pid, session_id=session_id)
        return 0
    try:
        rec = registry.read_record(reg_dir, claude_pid)
    except (OSError, registry.BadRecord):
        rec = None  # not written yet at SessionStart, or torn: the ring-time check covers the session
    if rec is not None and rec.proc_start is not None and rec.proc_start != start:
        log("waiter_refused", level="warning", reason="pid_reused", pid=claude_pid, session_id=session_id)
        return 0

    state = paths.state_dir(env)
    try:
        directory = prepare_dir(state)
    except ValueError as exc:
        log("waiter_refused", level="warning", reason=str(exc), path=os.fspath(waiters_dir(state)))
        return 0
    except OSError as exc:
        log("waiter_failed", level="error", reason="state_dir", errno=_errname(exc))
        return 0
    lock_fd = None
    for _ in range(LOCK_TRIES):
        existing = read_registration(directory, claude_pid)
        if existing is not None and existing.waiter_pid != os.getpid() and alive(existing):
            return 0  # the usual case at every Stop: one is already waiting (no log line per turn)
        lock_fd = take_lock(directory, claude_pid)
        if lock_fd is not None or caught:
            break
        time.sleep(LOCK_PAUSE_S)  # held: a waiter still registering, or the daemon's cleaner for a moment
    if lock_fd is None:
        return 0
    waiter = Waiter(env, log, session_id=session_id, claude_pid=claude_pid, proc_start=start, directory=directory,
                    lock_fd=lock_fd, out_fd=out_fd, err_fd=err_fd, wake_fd=wake_r, caught=caught)
    try:
        try:
            waiter.register()
        except OSError as exc:
            log("waiter_failed", level="error", reason="register", pid=claude_pid, errno=_errname(exc))
            return 0
        except safeio.Unsafe as exc:
            log("waiter_failed", level="error", reason=exc.reason, pid=claude_pid)
            return 0
        log("waiter_registered", pid=claude_pid, session_id=session_id, waiter_pid=os.getpid())
        return waiter.run()
    finally:
        waiter.close()
