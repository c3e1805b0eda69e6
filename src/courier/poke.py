"""Hand one doorbell line to a session's socket under one deadline, after checking who is listening.

Trust: before connecting, the socket path is vetted (registry.vet_socket: shape,
lstat, one link, owner and directory mode); after connecting, the peer's
credentials must name the pid the registry vouched for and our uid, otherwise
nothing is written. What the peer sends back is read, bounded, and discarded.
Logs: nothing; returns a PokeResult whose `reason` the caller logs.
Limits: SO_PEERCRED is Linux-only; elsewhere the peer check is skipped.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass

import trio

from . import registry

# Reasons for the errnos a poke meets in practice. Every OSError is a fallback (the
# mail stays for the prompt); an errno not named here is reported by its own name.
FALLBACK_ERRNOS = {
    errno.ECONNREFUSED: "refused",
    errno.ENOENT: "socket_missing",
    errno.ENOTDIR: "socket_missing",
    errno.ENOTSOCK: "not_a_socket",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EPIPE: "broken_pipe",
    errno.ECONNRESET: "reset",
    errno.ECONNABORTED: "reset",
    errno.EAGAIN: "backlog_full",
    errno.ENOTCONN: "backlog_full",
    errno.ETIMEDOUT: "timeout",
    errno.EPROTOTYPE: "not_a_socket",
    errno.ENOBUFS: "no_buffer",
    errno.ENAMETOOLONG: "socket_path_too_long",
    errno.ELOOP: "socket_symlink",
    errno.EMFILE: "out_of_descriptors",
    errno.ENFILE: "out_of_descriptors",
}
# Reasons that say courier itself is short of something: retried with back-off, not blamed on the session.
RESOURCE_REASONS = frozenset({"out_of_descriptors", "no_buffer"})
MAX_REPLY = 65536


def reason_for(exc: OSError) -> str:
    code = exc.errno or 0
    return FALLBACK_ERRNOS.get(code) or errno.errorcode.get(code, "oserror").lower()


@dataclass(frozen=True)
class PokeResult:
    sent: bool
    reason: str | None = None  # why not sent (or a note when sent, e.g. eof_timeout)
    errno: int | None = None
    latency_ms: float = 0.0  # the whole exchange, until the session closed its side
    write_ms: float | None = None  # connect + write: when the line was in the session's socket


def peer_credentials(sock) -> tuple[int, int] | None:
    """(pid, uid) of the connected peer on Linux; None where the OS gives no SO_PEERCRED."""
    if not sys.platform.startswith("linux"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


async def poke(path: str, line: bytes, *, expected_pid: int | None, timeout: float) -> PokeResult:
    """connect -> check peer -> write one line -> half-close -> read to EOF, under one deadline."""
    problem = registry.vet_socket(path)
    if problem:
        return PokeResult(False, problem)
    start = time.perf_counter()
    written = False
    write_ms = None
    try:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:  # EMFILE/ENFILE: out of descriptors is a fallback, not a crash
        return PokeResult(False, reason_for(exc), exc.errno)
    try:
        with trio.move_on_after(timeout) as scope:
            await sock.connect(path)
            creds = peer_credentials(sock)
            if creds is not None and expected_pid is not None:
                pid, uid = creds
                if uid != os.getuid():
                    return PokeResult(False, "peer_foreign_uid")
                if pid != expected_pid:
                    return PokeResult(False, "peer_pid_mismatch")
            view = memoryview(line)
            while view:
                sent = await sock.send(view)
                view = view[sent:]
            written = True
            write_ms = (time.perf_counter() - start) * 1000
            sock.shutdown(socket.SHUT_WR)
            # Claude never writes back; reading to EOF tells us the session took the line
            # off the socket and closed its side. Bound what a hostile peer could send.
            received = 0
            while received <= MAX_REPLY:
                data = await sock.recv(4096)
                if not data:
                    break
                received += len(data)
        latency = (time.perf_counter() - start) * 1000
        if scope.cancelled_caught:
            if written:
                # The line is in the socket buffer; the session just has not closed yet.
                return PokeResult(True, "eof_timeout", None, latency, write_ms)
            return PokeResult(False, "timeout", None, latency)
        return PokeResult(True, None, None, latency, write_ms)
    except OSError as exc:
        # Any errno is a fallback. A reset after our write still counts as a failure: a
        # peer that closes with the line unread never saw it, and the mail is safe either way.
        return PokeResult(False, reason_for(exc), exc.errno, (time.perf_counter() - start) * 1000)
    finally:
        sock.close()
