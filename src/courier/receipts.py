"""Claude Code's delivery receipts: listen beside each target socket and act on what sessions report.

A socket write is a hand-off, never a delivery. A session that holds our
doorbell (bypass mode without `crossSessionInbound: "accept"`), refuses it or
drops it says so with a `peer_message_status` line sent to the `from` address
of the poke, if that address is a socket served by the same pid that sent the
line and sits beside the session's own socket. So courier listens on
`courier-<pid>.sock` in every socket directory it pokes into.

Trust: anything may connect. Only peers with our uid (SO_PEERCRED) are read;
lines and read time are bounded, connections are capped, and a line that is not
a receipt for a poke we sent is logged as `peer_reply_ignored` and never acted on.
Logs: poke_receipt, session_holds_doorbells, poke_delivered, receipt_listener_failed,
peer_reply_ignored, receipt_rejected, stale_listener_removed.
Limits: Linux peer credentials only; elsewhere the uid check is skipped.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import sys
import time
from dataclasses import dataclass

import trio

from . import doorbell, registry

STATUSES = {"held", "delivered", "denied", "expired", "refused", "dropped"}
LISTENER_RE = re.compile(r"^courier-([0-9]+)\.sock$")
MAX_LINE = 65536
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16
PENDING_MAX = 10000
HOLD_HINT = 'set "crossSessionInbound": "accept" in its settings (courier spawn-settings)'


@dataclass
class Pending:
    handle: str
    session_id: str
    pid: int
    ring: int
    at: float


class Receipts:
    def __init__(self, daemon, log, refused_backoff_s: float = 1800.0, infer_after_s: float = 3.0):
        self.daemon = daemon
        self.log = log
        self.refused_backoff_s = refused_backoff_s
        self.infer_after_s = infer_after_s
        self.listeners: dict[str, tuple[trio.socket.SocketType, str]] = {}
        self.failed_dirs: set[str] = set()
        self.pending: dict[str, Pending] = {}
        # (session_id, pid) -> (reason, until trio time or None)
        self.blocks: dict[tuple[str, int], tuple[str, float | None]] = {}
        self.warned_held: set[tuple[str, int]] = set()
        self.retried: set[str] = set()  # boxes whose dropped doorbell was already retried once
        self._nursery: trio.Nursery | None = None
        self._open_conns = 0

    # ------------------------------------------------------------ lifetime

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def close(self) -> None:
        for path, (sock, _addr) in list(self.listeners.items()):
            sock.close()
            try:
                if LISTENER_RE.match(os.path.basename(path)):
                    os.unlink(path)
            except OSError:
                pass
        self.listeners.clear()

    # ------------------------------------------------------------ addressing

    def address_for(self, target_socket: str) -> str | None:
        """The `from` address for a poke to this socket; binds the listener lazily. None if we cannot."""
        directory = os.path.dirname(target_socket)
        path = os.path.join(directory, f"courier-{os.getpid()}.sock")
        if path in self.listeners:
            return self.listeners[path][1]
        if directory in self.failed_dirs or self._nursery is None:
            return None
        if len(os.fsencode(path)) > registry.MAX_SOCKET_PATH_BYTES:
            self.failed_dirs.add(directory)
            return None
        self._remove_stale(directory)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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
            os.chmod(path, 0o600)
            sock.listen(MAX_CONNECTIONS)
        except OSError as exc:
            sock.close()
            self.failed_dirs.add(directory)
            self.log.warning("receipt_listener_failed", directory=directory, errno=exc.errno)
            return None
        address = doorbell.uds_address(path)
        self.listeners[path] = (sock, address)
        self._nursery.start_soon(self._accept_loop, sock, path)
        return address

    def _remove_stale(self, directory: str) -> None:
        """Remove courier-<pid>.sock left by dead courier pids (only those)."""
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in names:
            m = LISTENER_RE.match(name)
            if not m or int(m.group(1)) == os.getpid():
                continue
            if registry.pid_exists(int(m.group(1))):
                continue
            full = os.path.join(directory, name)
            try:
                st = os.lstat(full)
                if st.st_uid == os.getuid() and (st.st_mode & 0o170000) == 0o140000:
                    os.unlink(full)
                    self.log.info("stale_listener_removed", path=full)
            except OSError:
                pass

    # ------------------------------------------------------------ serving

    async def _accept_loop(self, sock, path: str) -> None:
        while True:
            try:
                conn, _ = await sock.accept()
            except OSError as exc:
                self.log.warning("receipt_listener_failed", path=path, errno=exc.errno)
                return
            if self._open_conns >= MAX_CONNECTIONS:
                conn.close()  # a flood cannot stall the daemon: excess connections are dropped
                continue
            self._open_conns += 1
            self._nursery.start_soon(self._handle_conn, conn)

    async def _handle_conn(self, conn) -> None:
        try:
            pid = uid = None
            if sys.platform.startswith("linux"):
                raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                pid, uid, _ = struct.unpack("3i", raw)
                if uid != os.getuid():
                    self.log.warning("receipt_rejected", reason="foreign_uid", peer_pid=pid)
                    return
            buf = b""
            with trio.move_on_after(READ_TIMEOUT_S):
                while len(buf) <= MAX_LINE:
                    try:
                        chunk = await conn.recv(8192)
                    except OSError:
                        break
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        self._on_line(line, pid)
            if buf.strip() and len(buf) <= MAX_LINE:
                self._on_line(buf, pid)
        finally:
            conn.close()
            self._open_conns -= 1

    def _on_line(self, line: bytes, peer_pid: int | None) -> None:
        if not line.strip():
            return
        try:
            data = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self.log.info("peer_reply_ignored", peer_pid=peer_pid, reason="not_json")
            return
        if not (
            isinstance(data, dict) and data.get("type") == "control" and data.get("action") == "peer_message_status"
        ):
            kind = data.get("type") if isinstance(data, dict) else None
            self.log.info("peer_reply_ignored", peer_pid=peer_pid, kind=str(kind)[:32])
            return
        status = data.get("status")
        if status == "expired" and data.get("status_detail") == "refused":
            status = "refused"
        orig = data.get("orig_msg_id")
        pending = self.pending.get(orig) if isinstance(orig, str) else None
        if status not in STATUSES or pending is None:
            self.log.info("peer_reply_ignored", peer_pid=peer_pid, reason="unknown_receipt", status=str(status)[:32])
            return
        if peer_pid is not None and peer_pid != pending.pid:
            self.log.warning("receipt_rejected", reason="peer_pid_mismatch", peer_pid=peer_pid, handle=pending.handle)
            return
        self.apply(pending, orig, status, data)

    # ------------------------------------------------------------ decisions

    def track(self, msg_id: str, handle: str, target, ring: int) -> None:
        if len(self.pending) >= PENDING_MAX:
            for key in list(self.pending)[: PENDING_MAX // 10]:
                del self.pending[key]
        self.pending[msg_id] = Pending(handle, target.session_id, target.pid, ring, trio.current_time())
        if self._nursery is not None:
            self._nursery.start_soon(self._infer, msg_id)

    async def _infer(self, msg_id: str) -> None:
        """No receipt within a few seconds and the session turned busy: delivered (inferred)."""
        await trio.sleep(self.infer_after_s)
        p = self.pending.get(msg_id)
        if p is None:
            return
        try:
            rec = registry.read_record_once(registry.record_path(self.daemon.cfg.registry_dir, p.pid), p.pid)
        except (OSError, registry.BadRecord):
            return
        if rec.session_id == p.session_id and rec.status == "busy":
            self.log.info(
                "poke_delivered", handle=p.handle, pid=p.pid, session_id=p.session_id, ring=p.ring, inferred=True
            )

    def apply(self, p: Pending, msg_id: str, status: str, data: dict) -> None:
        reason = data.get("reason") if isinstance(data.get("reason"), str) else None
        drop = data.get("drop_reason") if isinstance(data.get("drop_reason"), str) else None
        key = (p.session_id, p.pid)
        now = trio.current_time()
        box = self.daemon.boxes.get(p.handle)
        log = self.log.bind(handle=p.handle, pid=p.pid, session_id=p.session_id)
        log.info("poke_receipt", status=status, reason=(reason or "")[:200], drop_reason=drop, ring=p.ring)
        hint = None
        if status == "held":
            self.blocks[key] = ("held", None)
            hint = HOLD_HINT
            if key not in self.warned_held:
                self.warned_held.add(key)
                log.warning(
                    "session_holds_doorbells",
                    fix='add "crossSessionInbound": "accept" to the session\'s user settings, or spawn it with '
                    "`claude --settings $(courier spawn-settings)`",
                )
        elif status in ("denied", "refused"):
            self.blocks[key] = (status, now + self.refused_backoff_s)
            self.pending.pop(msg_id, None)
        elif status == "delivered":
            self.blocks.pop(key, None)
            self.pending.pop(msg_id, None)
        elif status == "expired":
            self.blocks.pop(key, None)
            self.pending.pop(msg_id, None)
        elif status == "dropped":
            self.pending.pop(msg_id, None)
            if box is not None and p.handle not in self.retried and box.outstanding_since is not None:
                # One retry, with a new ring text, after the pacing window.
                self.retried.add(p.handle)
                box.outstanding_since = None
                box.batch = frozenset()
                self.daemon.schedule(p.handle, now + self.daemon.cfg.session_min_interval_s)
        if box is not None:
            box.last_receipt = {"status": status, "reason": drop or (reason or "")[:120], "at": time.time(), "hint": hint}
            self.daemon.mark_state_dirty()

    def rearmed(self, handle: str) -> None:
        self.retried.discard(handle)

    def blocked(self, target, now: float) -> str | None:
        key = (target.session_id, target.pid)
        entry = self.blocks.get(key)
        if entry is None:
            return None
        reason, until = entry
        if until is not None and now >= until:
            del self.blocks[key]
            return None
        return f"receipt_{reason}"
