"""Which watcher backend serves the mail roots and the registry: inotify in trio's loop, else watchfiles.

Both backends take the same sink (`box_dirty(root, handle)`, `registry_dirty(names)`,
`rescan(reason)`) and have the same lifetime (`run` arms every watch before
`started(snapshot)`; `recheck()` at each rescan re-arms what is missing).

Trust: see the backends; only names that pass `mailbox.valid_handle` become boxes. Crash-only: an
unexpected error inside a running backend is logged (`watch_failed`), every box is marked dirty, and the
backend is started again after a back-off; the rescans cover the gap. It never ends the daemon.
Logs: watcher_fallback (inotify unavailable, with the reason and the fix), watch_failed.
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

    inner, fallback = _choose(cfg, sink, log, watchfiles)
    return _Supervised(inner, sink, log, fallback)


def _choose(cfg, sink, log, watchfiles):
    choice = getattr(cfg, "watcher", "auto")
    if choice == "watchfiles" or not sys.platform.startswith("linux"):
        return watchfiles(), None
    try:
        from .watch_inotify import InotifyWatcher
    except ImportError as exc:
        if choice == "inotify":
            raise
        log.warning("watcher_fallback", wanted="inotify", reason=f"import failed: {exc}", using="watchfiles")
        return watchfiles(), None
    primary = InotifyWatcher(cfg.mail_roots, cfg.registry_dir, sink, log, is_box_name=mailbox.valid_handle)
    return primary, (None if choice == "inotify" else watchfiles)


def _unavailable(exc: BaseException) -> bool:
    from .watch_inotify import WatcherUnavailable

    return isinstance(exc, WatcherUnavailable)


class _Started:
    """A task_status that remembers whether started() was called."""

    def __init__(self, inner):
        self.inner = inner
        self.called = False

    def started(self, value=None) -> None:
        self.called = True
        self.inner.started(value)


class _Supervised:
    """Runs the chosen backend: falls back to watchfiles if inotify cannot start at all (before readiness,
    so nothing is missed), and restarts a backend that fails after it was armed (a watcher error costs
    latency, never the daemon)."""

    BACKOFF_MAX_S = 60.0

    def __init__(self, inner, sink, log, fallback=None):
        self.inner = inner
        self.sink = sink
        self.log = log
        self._fallback = fallback

    @property
    def name(self) -> str:
        return self.inner.name

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        status = _Started(task_status)
        delay = 1.0
        while True:
            try:
                await self.inner.run(task_status=status if not status.called else _Rearmed(self))
                return
            except Exception as exc:  # noqa: BLE001 - crash-only: the rescans cover what the watcher misses
                if not status.called and self._fallback is not None and _unavailable(exc):
                    self.log.warning("watcher_fallback", wanted="inotify", reason=str(exc), using="watchfiles")
                    self.inner, self._fallback = self._fallback(), None
                    continue
                if not status.called:
                    raise  # not armed yet: a start-up problem (or WatcherUnavailable for the fallback)
                self.log.error("watch_failed", watcher=self.inner.name, error=type(exc).__name__,
                               detail=str(exc)[:200], retry_in_s=delay, fallback="rescans until it is back")
                self.sink.rescan("watch_failed")
                await trio.sleep(delay)
                delay = min(self.BACKOFF_MAX_S, delay * 2)

    def rearmed(self) -> None:
        # Whatever landed while the watcher was down is found by looking at every box once.
        self.log.info("watch_restarted", watcher=self.inner.name)
        self.sink.rescan("watch_restarted")

    def recheck(self) -> None:
        try:
            self.inner.recheck()
        except Exception as exc:  # noqa: BLE001 - a re-arm that fails waits for the next rescan
            self.log.error("watch_failed", watcher=self.inner.name, error=type(exc).__name__, detail=str(exc)[:200],
                           during="recheck")

    def snapshot(self) -> dict:
        return self.inner.snapshot()

    def complete(self) -> bool:
        return self.inner.complete()

    def stop(self) -> None:
        stop = getattr(self.inner, "stop", None)
        if stop is not None:
            stop()


class _Rearmed:
    """The task_status of a restarted backend: once armed again, look at every box."""

    def __init__(self, supervisor: _Supervised):
        self.supervisor = supervisor

    def started(self, value=None) -> None:
        self.supervisor.rearmed()
