"""The service manager's notify protocol (sd_notify), dependency-free, as systemd's own example speaks it.

Trust: NOTIFY_SOCKET comes from our own environment (set by the supervisor).
Logs: `sd_notify_failed` once per failure kind; never raises.
Limits: a no-op without NOTIFY_SOCKET. Watchdog pets are sent by the daemon's
own trio task, so a wedged event loop stops them and systemd restarts us.
"""

from __future__ import annotations

import os
import socket
from typing import Callable, Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None, on_error: Callable[[str, int | None], None] | None = None):
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        self.on_error = on_error
        self._failed: set = set()
        wd_usec = env.get("WATCHDOG_USEC", "")
        wd_pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if wd_usec.isdigit() and int(wd_usec) > 0 and (not wd_pid or wd_pid == str(os.getpid())):
            # Pet at half the interval, as sd_watchdog_enabled(3) recommends.
            self.watchdog_interval = int(wd_usec) / 1e6 / 2

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, state: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(addr)
                sock.sendall(state.encode("utf-8", "replace"))
            return True
        except OSError as exc:
            key = (state.split("=", 1)[0], exc.errno)
            if key not in self._failed and self.on_error:
                self._failed.add(key)
                self.on_error(state.split("=", 1)[0], exc.errno)
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def reloading(self) -> bool:
        return self.send("RELOADING=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")
