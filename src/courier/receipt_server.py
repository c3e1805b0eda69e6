"""The receipt listeners: a `courier-<pid>.sock` beside each session socket courier pokes, serving receipts.

Claude Code sends a receipt only to a `from` address served by the same pid that
sent the line and sitting beside the session's own socket, so courier binds one
listener per socket directory, lazily, and only in a directory `vet_socket_dir`
accepts (absolute, real, ours, 0700).

Trust: anything of our uid may connect (SO_PEERCRED; other uids are refused).
Every connection is bounded: a first byte within FIRST_BYTE_S, all of it within
READ_S, lines of at most MAX_LINE bytes, LINES_PER_CONN lines. Each peer pid has a
line budget (a token bucket) and a log budget; past it, lines are dropped and one
`peer_flood_suppressed` event says so. When all MAX_CONNECTIONS slots are taken, the
oldest connection is evicted, so idle or flooding peers cannot keep a real receipt
out. Stale listeners are removed only when proven courier's: our name shape, our
uid, a dead pid, and a connect that is refused.
Logs: receipt_listener_failed, receipt_listener_closed, receipt_rejected,
receipt_connection_failed, peer_flood_suppressed, stale_listener_removed.
Limits: Linux peer credentials only; elsewhere the uid check is skipped.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
from typing import Callable

import trio

from . import doorbell, registry
from .poke import peer_credentials
from .receipts import Receipts

LISTENER_RE = re.compile(r"courier-([0-9]+)\.sock")
MAX_LINE = 65536
FIRST_BYTE_S = 2.0
READ_S = 5.0
LINES_PER_CONN = 64
MAX_CONNECTIONS = 16
MAX_LISTENERS = 64  # and at most a quarter of the descriptor limit: listeners must never starve the rest


def listener_cap() -> int:
    import resource

    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return MAX_LISTENERS
    if soft == resource.RLIM_INFINITY:
        return MAX_LISTENERS
    return max(1, min(MAX_LISTENERS, soft // 4))
LISTENER_IDLE_S = 1800.0  # a listener nobody was poked through for this long is closed
PEER_BURST = 32  # lines a peer may send at once ...
PEER_RATE = 2.0  # ... and per second after that
LOG_BURST = 20
LOG_RATE = 0.2
SUMMARY_EVERY_S = 10.0  # at most one peer_flood_suppressed per peer this often
PEERS_MAX = 1024


class Bucket:
    """A token bucket on the daemon clock."""

    def __init__(self, burst: float, rate: float, now: float):
        self.burst, self.rate = burst, rate
        self.tokens, self.at = burst, now
        self.dropped = 0
        self.summarized_at = float("-inf")

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class _Listener:
    def __init__(self, sock, path: str, address: str, used: float):
        self.sock, self.path, self.address, self.used = sock, path, address, used
        self.scope = trio.CancelScope()


class _Budgeted:
    """A logger that spends a peer's log budget; past it, nothing (the caller summarises)."""

    def __init__(self, log, bucket: Bucket, now: float):
        self._log, self._bucket, self._now = log, bucket, now

    def __getattr__(self, level):
        emit = getattr(self._log, level)

        def call(event, **kw):
            if self._bucket.take(self._now):
                emit(event, **kw)
            else:
                self._bucket.dropped += 1

        return call

    def bind(self, **kw):
        return _Budgeted(self._log.bind(**kw), self._bucket, self._now)


class ReceiptServer:
    def __init__(self, receipts: Receipts, log, apply: Callable[[list], None]):
        self.receipts = receipts
        self.log = log
        self.apply = apply
        self.listeners: dict[str, _Listener] = {}  # directory -> listener
        self.failed_dirs: dict[str, str] = {}
        self._nursery: trio.Nursery | None = None
        self._conns: dict[int, tuple[float, trio.CancelScope]] = {}
        self._next_conn = 0
        self._lines: dict[int | None, Bucket] = {}
        self._logs: dict[int | None, Bucket] = {}
        self.max_listeners = listener_cap()

    # ------------------------------------------------------------ lifetime

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    await trio.sleep(LISTENER_IDLE_S / 4)
                    self._close_idle(trio.current_time())
        finally:
            self._nursery = None
            self.close()

    def close(self) -> None:
        for listener in list(self.listeners.values()):
            self._close(listener)
        self.listeners.clear()

    def _close(self, listener: _Listener) -> None:
        listener.scope.cancel()
        listener.sock.close()
        try:
            os.unlink(listener.path)
        except OSError:
            pass

    def _close_idle(self, now: float) -> None:
        for directory, listener in list(self.listeners.items()):
            if now - listener.used > LISTENER_IDLE_S:
                del self.listeners[directory]
                self._close(listener)
                self.log.info("receipt_listener_closed", directory=directory, reason="idle")

    # ------------------------------------------------------------ addressing

    def address_for(self, target_socket: str) -> str | None:
        """The `from` address for a poke to this (already vetted) socket; binds lazily. None if we cannot."""
        directory = os.path.dirname(target_socket)
        now = trio.current_time()
        listener = self.listeners.get(directory)
        if listener is not None:
            listener.used = now
            return listener.address
        if self._nursery is None or directory in self.failed_dirs:
            return None
        problem = registry.vet_socket_dir(directory)
        path = os.path.join(directory, f"courier-{os.getpid()}.sock")
        if problem is None and len(os.fsencode(path)) > registry.MAX_SOCKET_PATH_BYTES:
            problem = "socket_path_too_long"
        if problem is None and len(self.listeners) >= self.max_listeners:
            # Make room: the least recently used listener goes first.
            oldest = min(self.listeners, key=lambda d: self.listeners[d].used)
            self._close(self.listeners.pop(oldest))
            self.log.info("receipt_listener_closed", directory=oldest, reason="listener_cap")
        if problem is not None:
            self._fail(directory, problem, None)
            return None
        self._remove_stale(directory)
        try:
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:  # EMFILE: no receipts for this poke; the poke itself may still go
            self.log.warning("receipt_listener_failed", directory=directory, errno=exc.errno,
                             reason=errno.errorcode.get(exc.errno or 0, "oserror"))
            return None
        try:
            try:
                os.unlink(path)  # our own pid's leftover can only be ours
            except FileNotFoundError:
                pass
            old = os.umask(0o177)
            try:
                sock._sock.bind(path)  # sync bind: we are inside the dispatcher, not awaiting
            finally:
                os.umask(old)
            sock.listen(MAX_CONNECTIONS)
        except OSError as exc:
            sock.close()
            self._fail(directory, errno.errorcode.get(exc.errno or 0, "oserror"), exc.errno)
            return None
        listener = _Listener(sock, path, doorbell.uds_address(path), now)
        self.listeners[directory] = listener
        self._nursery.start_soon(self._accept_loop, listener)
        return listener.address

    def _fail(self, directory: str, reason: str, err: int | None) -> None:
        if len(self.failed_dirs) >= MAX_LISTENERS * 4:
            self.failed_dirs.pop(next(iter(self.failed_dirs)))
        self.failed_dirs[directory] = reason
        self.log.warning("receipt_listener_failed", directory=directory, reason=reason, errno=err)

    def _remove_stale(self, directory: str) -> None:
        """Remove courier-<pid>.sock left by dead courier pids, and only sockets proven to be such leftovers."""
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in names:
            m = LISTENER_RE.fullmatch(name)
            if not m or int(m.group(1)) == os.getpid() or registry.pid_exists(int(m.group(1))):
                continue
            full = os.path.join(directory, name)
            try:
                st = os.lstat(full)
                if st.st_uid != os.getuid() or not stat.S_ISSOCK(st.st_mode) or st.st_nlink != 1:
                    continue
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.setblocking(False)
                    try:
                        probe.connect(full)
                        continue  # somebody listens there: not a leftover
                    except ConnectionRefusedError:
                        pass
                    except BlockingIOError:
                        continue
                os.unlink(full)
                self.log.info("stale_listener_removed", path=full)
            except OSError:
                continue

    # ------------------------------------------------------------ serving

    async def _accept_loop(self, listener: _Listener) -> None:
        with listener.scope:
            while True:
                try:
                    conn, _ = await listener.sock.accept()
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        await trio.sleep(0.5)  # out of descriptors: back off, keep the listener
                        continue
                    self.log.warning("receipt_listener_failed", path=listener.path, errno=exc.errno)
                    return
                if len(self._conns) >= MAX_CONNECTIONS:
                    # Evict the oldest connection: a real receipt always gets a slot.
                    oldest = min(self._conns, key=lambda k: self._conns[k][0])
                    self._conns.pop(oldest)[1].cancel()
                self._next_conn += 1
                scope = trio.CancelScope()
                self._conns[self._next_conn] = (trio.current_time(), scope)
                self._nursery.start_soon(self._serve_conn, conn, self._next_conn, scope)

    async def _serve_conn(self, conn, conn_id: int, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await self._read_conn(conn)
        except Exception as exc:  # noqa: BLE001 - one connection must never end the daemon
            self.log.error("receipt_connection_failed", error=type(exc).__name__)
        finally:
            conn.close()
            self._conns.pop(conn_id, None)

    async def _read_conn(self, conn) -> None:
        pid = None
        try:
            creds = peer_credentials(conn)
        except OSError:
            return
        if creds is not None:
            pid, uid = creds
            if uid != os.getuid():
                self.log.warning("receipt_rejected", reason="foreign_uid", peer_pid=pid)
                return
        now = trio.current_time()
        lines = self._bucket(self._lines, pid, PEER_BURST, PEER_RATE, now)
        logs = self._bucket(self._logs, pid, LOG_BURST, LOG_RATE, now)
        buf = b""
        seen = 0
        with trio.move_on_after(READ_S):
            first = True
            while seen < LINES_PER_CONN:
                with trio.move_on_after(FIRST_BYTE_S if first else READ_S):
                    try:
                        chunk = await conn.recv(8192)
                    except OSError:
                        break
                    first = False
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n" in buf and seen < LINES_PER_CONN:
                        line, buf = buf.split(b"\n", 1)
                        seen += 1
                        self._line(line, pid, lines, logs)
                    if len(buf) > MAX_LINE:
                        break
                    continue
                break  # no first byte in time
        if buf.strip() and len(buf) <= MAX_LINE and seen < LINES_PER_CONN:
            self._line(buf, pid, lines, logs)
        now = trio.current_time()
        if (logs.dropped or lines.dropped) and now - logs.summarized_at >= SUMMARY_EVERY_S:
            # One summary per peer per period, whatever the number of connections it opens.
            self.log.warning("peer_flood_suppressed", peer_pid=pid, lines_dropped=lines.dropped,
                             log_lines_suppressed=logs.dropped)
            logs.dropped = lines.dropped = 0
            logs.summarized_at = now

    def _bucket(self, table: dict, pid, burst: float, rate: float, now: float) -> Bucket:
        bucket = table.get(pid)
        if bucket is None:
            if len(table) >= PEERS_MAX:
                table.pop(next(iter(table)))
            bucket = table[pid] = Bucket(burst, rate, now)
        return bucket

    def _line(self, line: bytes, pid, lines: Bucket, logs: Bucket) -> None:
        now = trio.current_time()
        if not lines.take(now):
            lines.dropped += 1
            return
        effects = self.receipts.on_line(line, pid, now, _Budgeted(self.receipts.log, logs, now))
        if effects:
            self.apply(effects)
