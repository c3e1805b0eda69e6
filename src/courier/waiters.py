"""The daemon's side of the rewake waiters: which sessions have one, and ringing one under a deadline.

A waiter (`courier hook wait`, module `waiter`) registers <state>/waiters/<claude pid>.json
and listens on <pid>.sock beside it. `Waiters.has(session_id)` answers from a small index
of those files, re-read only when the directory changes; `Waiters.wake(...)` connects,
checks who answers, sends one line and reads one word back. The waiter then shows the
mail (paths, never bodies) and exits 2, which makes Claude Code start a turn.

Trust: registrations are written by same-user processes and read like any hostile file
(bounded, no links, typed). A registration counts only while both processes it names are
the ones it names (Claude's pid with its start token, the waiter's pid with its own) and,
for a session id, only if the registration or Claude's registry record at that pid names
it. The socket path is built from the directory and the pid, never taken from the file,
and vetted (a real socket of ours, one link, 0700 directory) before connecting; the peer
must be the registered waiter pid under our uid (SO_PEERCRED) before the line is sent.
The line carries courier's own values only (ring number, count, box path, session id).
`Waiters.watch(on_change)` tells the daemon when a waiter registers, so mail held while a
session had none (between a rewake and its next Stop) is looked at again at once.

Logs: nothing; `wake` returns a PokeResult whose `reason` the ringer logs.
Limits: `has_waiter` and the index are stdlib-only (for `courier who` and `status`); trio and
inotify_simple are imported inside `wake` and `watch`. A registration from a waiter that died
without cleaning up (SIGKILL) is removed when `has` meets it, under the registration's lock.
Without `pid`, `has`/`wake` also read Claude's registry record of every other registration
(to follow a /clear); the dispatcher should pass the pid it resolved.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from . import registry
from .waiter import (
    Registration,
    alive,
    clean_if_stale,
    pid_of_name,
    prepare_dir,
    read_registration,
    sock_path,
    waiters_dir,
)

MAX_REPLY = 64
FRESH_MARGIN_NS = 100_000_000  # directory timestamps are coarse (a jiffy): trust the cache only past this
REPLIES = {"ok": None, "empty": "waiter_empty", "gone": "waiter_session_gone", "error": "waiter_error",
           "wrong_session": "waiter_wrong_session", "bad_request": "waiter_bad_request"}


class _Stamp(NamedTuple):
    mtime_ns: int
    ino: int


def _stamp(directory: Path) -> _Stamp | None:
    try:
        st = os.stat(directory, follow_symlinks=False)
    except OSError:
        return None
    return _Stamp(st.st_mtime_ns, st.st_ino)


def scan(directory: Path) -> dict[int, Registration]:
    """Every parseable registration in the directory, by Claude pid. Never raises."""
    found: dict[int, Registration] = {}
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries]
    except OSError:
        return found
    for name in names:
        pid = pid_of_name(name)
        if pid is None:
            continue
        reg = read_registration(directory, pid)
        if reg is not None:
            found[pid] = reg
    return found


def record_session(registry_dir: Path | None, pid: int, proc_start: str) -> str | None:
    """The session Claude's registry lists now for this pid (same process), else None."""
    if registry_dir is None:
        return None
    try:
        rec = registry.read_record(registry_dir, pid)
    except (OSError, registry.BadRecord):
        return None
    if rec.proc_start is not None and rec.proc_start != proc_start:
        return None
    return rec.session_id


class Waiters:
    """The index of live waiters, kept by the daemon; `wake` rings one."""

    def __init__(self, state_dir: Path, registry_dir: Path | None = None, *, clock_ns=time.time_ns):
        self.directory = waiters_dir(state_dir)
        self.registry_dir = Path(registry_dir) if registry_dir is not None else None
        self.clock_ns = clock_ns
        self.index: dict[int, Registration] = {}
        self._stamp: _Stamp | None = None
        self._scanned_ns = 0
        self.stats = {"scans": 0, "cleaned": 0}

    # ------------------------------------------------------------ the index

    def refresh(self) -> None:
        """Re-read the directory if it changed since the last scan (one stat when it did not)."""
        stamp = _stamp(self.directory)
        if stamp is None:
            self.index, self._stamp = {}, None
            return
        if stamp == self._stamp and self._scanned_ns - stamp.mtime_ns > FRESH_MARGIN_NS:
            return
        self._scanned_ns = self.clock_ns()
        self.index = scan(self.directory)
        self._stamp = stamp
        self.stats["scans"] += 1

    def find(self, session_id: str, pid: int | None = None) -> Registration | None:
        """The live registration that serves this session (at `pid`, if the caller resolved it)."""
        self.refresh()
        if pid is not None:
            candidates = [self.index[pid]] if pid in self.index else []
        else:
            candidates = [r for r in self.index.values() if r.session_id == session_id]
            candidates += [r for r in self.index.values() if r.session_id != session_id
                           and record_session(self.registry_dir, r.pid, r.proc_start) == session_id]
        for reg in candidates:
            if alive(reg):
                return reg
            self._drop_stale(reg)
        return None

    def has(self, session_id: str, pid: int | None = None) -> bool:
        return self.find(session_id, pid) is not None

    def _drop_stale(self, reg: Registration) -> None:
        """A registration whose waiter or Claude is gone: remove its files if nobody holds its lock.
        (A waiter whose Claude died still holds it until its POLLHUP exit, a few ms later.)"""
        if clean_if_stale(self.directory, reg.pid):
            self.stats["cleaned"] += 1
            self.index.pop(reg.pid, None)

    # ------------------------------------------------------------ ringing

    async def wake(self, session_id: str, *, ring: int, queued: int, box: str, timeout: float,
                   pid: int | None = None):
        """Ring the session's waiter: PokeResult(True) once it has shown the mail (it then exits 2)."""
        # trio here, not at the top: `courier status` / `who` import this module for has_waiter.
        import socket

        import trio

        from .poke import PokeResult, peer_credentials, reason_for

        reg = self.find(session_id, pid)
        if reg is None:
            return PokeResult(False, "no_waiter")
        path = os.fspath(sock_path(self.directory, reg.pid))
        problem = registry.vet_socket(path)
        if problem:
            return PokeResult(False, f"waiter_{problem}")
        line = (json.dumps({"ring": ring, "queued": queued, "box": box, "sessionId": session_id},
                           ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")
        start = time.perf_counter()
        write_ms = None
        try:
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            return PokeResult(False, reason_for(exc), exc.errno)
        try:
            reply = b""
            with trio.move_on_after(timeout) as scope:
                await sock.connect(path)
                creds = peer_credentials(sock)
                if creds is not None:
                    peer_pid, uid = creds
                    if uid != os.getuid():
                        return PokeResult(False, "peer_foreign_uid")
                    if peer_pid != reg.waiter_pid:
                        return PokeResult(False, "peer_pid_mismatch")
                view = memoryview(line)
                while view:
                    view = view[await sock.send(view):]
                write_ms = (time.perf_counter() - start) * 1000
                while b"\n" not in reply and len(reply) <= MAX_REPLY:
                    data = await sock.recv(MAX_REPLY)
                    if not data:
                        break
                    reply += data
            latency = (time.perf_counter() - start) * 1000
            if scope.cancelled_caught:
                # Unknown whether it showed the mail: not counted as a wake; the mail, if taken, is in read/.
                return PokeResult(False, "waiter_timeout", None, latency, write_ms)
            word = reply.split(b"\n", 1)[0].decode("ascii", "replace").strip()
            if not reply:
                return PokeResult(False, "waiter_closed", None, latency, write_ms)
            if word not in REPLIES:
                return PokeResult(False, "waiter_bad_reply", None, latency, write_ms)
            reason = REPLIES[word]
            return PokeResult(reason is None, reason, None, latency, write_ms)
        except OSError as exc:
            return PokeResult(False, reason_for(exc), exc.errno, (time.perf_counter() - start) * 1000, write_ms)
        finally:
            sock.close()


    # ------------------------------------------------------------ noticing new waiters

    async def watch(self, on_change, *, task_status=None) -> None:
        """Call `on_change(pids)` when waiters register (`None`: maybe any), so mail held while a session
        had no waiter (between a rewake and the next Stop) is looked at again. inotify in trio's own
        loop: no wakeups while nothing changes. Off Linux it returns at once (the rescan covers it)."""
        import trio

        try:
            from inotify_simple import INotify, flags, parse_events
        except ImportError:
            if task_status is not None:
                task_status.started(False)
            return
        try:
            prepare_dir(self.directory.parent)
        except (OSError, ValueError):
            if task_status is not None:
                task_status.started(False)
            return
        mask = flags.CREATE | flags.MOVED_TO | flags.ONLYDIR | flags.DONT_FOLLOW | flags.DELETE_SELF | flags.MOVE_SELF
        with INotify(nonblocking=True) as ino:
            ino.add_watch(os.fspath(self.directory), mask)
            if task_status is not None:
                task_status.started(True)
            while True:
                await trio.lowlevel.wait_readable(ino.fileno())
                pids: set[int] | None = set()
                lost = False
                while True:
                    try:
                        data = os.read(ino.fileno(), 65536)
                    except BlockingIOError:
                        break
                    for event in parse_events(data):
                        if event.mask & (flags.Q_OVERFLOW):
                            pids = None
                        elif event.mask & (flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED):
                            lost = True
                        elif pids is not None:
                            pid = pid_of_name(event.name)
                            if pid is not None:
                                pids.add(pid)
                if pids is None or pids:
                    on_change(pids)
                if lost:  # the directory went away: make it again and watch the new one
                    await trio.sleep(1.0)
                    try:
                        prepare_dir(self.directory.parent)
                        ino.add_watch(os.fspath(self.directory), mask)
                    except (OSError, ValueError):
                        return
                    on_change(None)


def has_waiter(state_dir: Path, session_id: str, registry_dir: Path | None = None, pid: int | None = None) -> bool:
    """One-shot, stdlib-only: does a live waiter serve this session? (for `courier who` and `status`)"""
    return Waiters(state_dir, registry_dir).has(session_id, pid)


def stand_down(state_dir: Path, pid: int, timeout: float = 1.0) -> bool:
    """Tell the waiter of Claude pid `pid` to exit 0 (e.g. when courier's hooks are removed). True if it agreed."""
    import socket

    directory = waiters_dir(state_dir)
    path = os.fspath(sock_path(directory, pid))
    if registry.vet_socket(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b'{"standDown":true}\n')
            return s.recv(MAX_REPLY).startswith(b"ok")
    except OSError:
        return False

