"""The single-instance lock: an flock on <state>/courier.lock, which the kernel drops when we die.

Trust: the state dir is courier's own (0700). Never a pidfile that can go stale:
the pid written into the lock file is informational, the flock is the truth.
Logs: nothing. Limits: stdlib only (the prompt hook asks whether a daemon runs).
"""

from __future__ import annotations

import fcntl
import os
import time

LOCK_FILE = "courier.lock"


class Locked(Exception):
    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def acquire(state_dir: str) -> int:
    """Take the lock or raise Locked(holder pid). Returns the fd to keep open for our lifetime."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # The winner writes its pid just after taking the lock: a loser started in the same instant
        # waits a moment for it, rather than reporting "pid unknown" or the pid a dead daemon left.
        from .registry import pid_exists  # here, not at the top: the prompt hook imports this module

        for _ in range(50):
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            if holder.isdigit() and int(holder) > 0 and pid_exists(int(holder)):
                break
            time.sleep(0.01)
        else:
            holder = "unknown"
        os.close(fd)
        raise Locked(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def holder(state_dir: str) -> int | None:
    """The pid of the running courier for this state dir, -1 if unknown, None if none runs."""
    try:
        fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
