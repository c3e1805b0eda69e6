"""The portable watcher backend: watchfiles (FSEvents on macOS, inotify elsewhere) over the mail roots and registry.

Used where the inotify backend is unavailable and as its fallback. watchfiles'
Python-side loop wakes every `step_ms` even when nothing happens, so latency and
idle cost trade against each other here (research/decisions.md); the inotify
backend has neither cost.

Trust: event paths name hostile files; only a directory name directly under a
root that passes `is_box_name` ever becomes a box, and a registry name is only
handed on (the session index parses it).
Logs: watch_failed, watch_restarted, registry_watch_waiting.
Limits: watches the roots recursively (watchfiles has no other mode), so events
from read/ archives arrive and are dropped here.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Sequence

import trio
from watchfiles._rust_notify import RustNotify


class WatchfilesWatcher:
    name = "watchfiles"

    def __init__(self, roots: Sequence[Path], registry_dir: Path, sink, log, *,
                 is_box_name: Callable[[str], bool], debounce_ms: int = 20, step_ms: int = 10):
        self.roots = [Path(r) for r in roots]
        self.registry_dir = Path(registry_dir)
        self.sink = sink
        self.log = log
        self.is_box_name = is_box_name
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.watching_registry = False
        self.identities: dict[Path, tuple[int, int] | None] = {}
        self._restart: trio.CancelScope | None = None
        self._retry = trio.Event()
        self._stop = threading.Event()

    def snapshot(self) -> dict:
        return {"watcher": self.name, "roots": len(self.roots), "registry": self.watching_registry,
                "step_ms": self.step_ms}

    def complete(self) -> bool:
        """watchfiles does not say when it lost events: the daemon keeps its regular safety pass."""
        return False

    def stop(self) -> None:
        """Let watchfiles' thread return within one step (a cancelled watch would otherwise wait 5 s)."""
        self._stop.set()

    def recheck(self) -> None:
        """At each rescan: rebuild the watch if a root was replaced or the registry appeared."""
        replaced = any(_identity(r) != self.identities.get(r) for r in self.roots)
        appeared = not self.watching_registry and self.registry_dir.is_dir()
        if replaced or appeared:
            if self._restart is not None:
                self._restart.cancel()
            self._retry.set()

    def _watch_once(self, notify: RustNotify, stop: threading.Event):
        result = notify.watch(self.debounce_ms, self.step_ms, 0, stop)
        if result == "stop":
            notify.close()
        return result

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Arm one RustNotify over the roots and the registry (its constructor starts the watch), then started().

        One RustNotify for everything, because each one's loop wakes every step: a second
        doubles the idle cost. RustNotify directly rather than `awatch`: awatch's thread
        waits out a 5 s timeout on cancellation unless a stop event is set, and we want
        both the stop event and the freedom to rebuild the watch.
        """
        started = False
        while True:
            stop = threading.Event()
            self._stop = stop
            self.watching_registry = self.registry_dir.is_dir()
            paths = [str(r) for r in self.roots] + ([str(self.registry_dir)] if self.watching_registry else [])
            try:
                for root in self.roots:
                    os.makedirs(root, mode=0o700, exist_ok=True)
                self.identities = {r: _identity(r) for r in self.roots}
                notify = RustNotify(paths, False, False, 50, True, True)
            except (OSError, RuntimeError) as exc:
                self.log.error("watch_failed", reason=type(exc).__name__, errno=getattr(exc, "errno", None),
                               detail=str(exc)[:200], fallback="rescans only, until the watch can be rebuilt")
                if not started:
                    started = True
                    task_status.started(self.snapshot())
                self._retry = trio.Event()
                await self._retry.wait()
                continue
            if not self.watching_registry:
                self.log.info("registry_watch_waiting", path=str(self.registry_dir), reason="missing",
                              retry="at each rescan")
            if not started:
                started = True
                task_status.started(self.snapshot())
            else:
                self.log.info("watch_restarted", roots=[str(r) for r in self.roots], registry=self.watching_registry)
                self.sink.rescan("watch_restarted")
                self.sink.registry_dirty(None)
            self._restart = trio.CancelScope()
            try:
                with self._restart:
                    while True:
                        result = await trio.to_thread.run_sync(self._watch_once, notify, stop, abandon_on_cancel=True)
                        if result == "stop":
                            return
                        if isinstance(result, set) and self._on_changes(result):
                            break
            finally:
                stop.set()

    def _on_changes(self, changes) -> bool:
        """Hand box and registry changes to the sink. True if the watch must be rebuilt."""
        reg = str(self.registry_dir)
        reg_prefix = reg.rstrip("/") + "/"
        roots = [(str(r), str(r).rstrip("/") + "/", r) for r in self.roots]
        rebuild = False
        names: set[str] = set()
        for _kind, path in changes:
            if path.startswith(reg_prefix):
                name = path[len(reg_prefix):]
                if "/" not in name and name.endswith(".json") and not name.startswith("."):
                    names.add(name)
                continue
            if path == reg:
                rebuild = True
                continue
            for text, prefix, root in roots:
                if path == text:
                    rebuild = True
                    break
                if not path.startswith(prefix):
                    continue
                handle, _, inner = path[len(prefix):].partition("/")
                if not handle or handle.startswith("."):
                    break
                if inner and (inner.startswith("read/") or inner.rsplit("/", 1)[-1].startswith(".")):
                    break  # an archive, or a sender's .tmp-* file (its rename is its own event)
                if self.is_box_name(handle):
                    self.sink.box_dirty(root, handle)
                break
        if names:
            self.sink.registry_dirty(frozenset(names))
        if rebuild:
            gone = any(not r.is_dir() for r in self.roots) or (self.watching_registry and not self.registry_dir.is_dir())
            return gone
        return False


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
