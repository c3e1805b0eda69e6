"""Which watcher backend serves the mail roots and the registry: inotify in trio's loop, else watchfiles.

Both backends take the same sink (`box_dirty(root, handle)`, `registry_dirty(names)`,
`rescan(reason)`) and have the same lifetime (`run` arms every watch before
`started(snapshot)`; `recheck()` at each rescan re-arms what is missing).

Trust: see the backends; only names that pass `mailbox.valid_handle` become boxes.
Logs: watcher_fallback (inotify unavailable, with the reason and the fix).
Limits: `auto` picks inotify on Linux; macOS and others get watchfiles (FSEvents).
"""

from __future__ import annotations

import sys

import trio

from . import mailbox

CHOICES = ("auto", "inotify", "watchfiles")


def make(cfg, sink, log):
    """The watcher `cfg.watcher` asks for; `auto` falls back to watchfiles when inotify cannot be used."""
    def watchfiles():
        from .watch_files import WatchfilesWatcher

        return WatchfilesWatcher(cfg.mail_roots, cfg.registry_dir, sink, log, is_box_name=mailbox.valid_handle,
                                 debounce_ms=cfg.debounce_ms, step_ms=cfg.step_ms)

    choice = getattr(cfg, "watcher", "auto")
    if choice == "watchfiles" or not sys.platform.startswith("linux"):
        return watchfiles()
    try:
        from .watch_inotify import InotifyWatcher
    except ImportError as exc:
        if choice == "inotify":
            raise
        log.warning("watcher_fallback", wanted="inotify", reason=f"import failed: {exc}", using="watchfiles")
        return watchfiles()
    primary = InotifyWatcher(cfg.mail_roots, cfg.registry_dir, sink, log, is_box_name=mailbox.valid_handle)
    return primary if choice == "inotify" else _Fallback(primary, watchfiles, log)


class _Fallback:
    """inotify first; if it cannot start at all, watchfiles (before readiness, so nothing is missed)."""

    def __init__(self, primary, make_fallback, log):
        self.active = primary
        self._make_fallback = make_fallback
        self.log = log

    @property
    def name(self) -> str:
        return self.active.name

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from .watch_inotify import WatcherUnavailable

        try:
            await self.active.run(task_status=task_status)
        except WatcherUnavailable as exc:
            self.log.warning("watcher_fallback", wanted="inotify", reason=str(exc), using="watchfiles")
            self.active = self._make_fallback()
            await self.active.run(task_status=task_status)

    def recheck(self) -> None:
        self.active.recheck()

    def snapshot(self) -> dict:
        return self.active.snapshot()

    def complete(self) -> bool:
        return self.active.complete()

    def stop(self) -> None:
        stop = getattr(self.active, "stop", None)
        if stop is not None:
            stop()
