"""The daemon's wiring: lifetimes, signals, reload and the watchdog around the watcher and the dispatcher.

Lifetimes nest in the order things must stop: signals, the state flusher, the
watchdog and the receipt listeners outermost; in-flight rings (given a short grace
on shutdown) inside them; the watcher, the rescan and the drain loop innermost.
Readiness is structural: the watcher is armed (`nursery.start`) before the initial
scan, and READY=1 is sent only after that scan has been drained.

Trust: see `dispatch` (nothing read from disk or a socket ends the daemon) and
`startup` (what does end it at once, with its own exit status).
Logs: daemon_starting, daemon_ready, daemon_stopping, daemon_stopped,
reload_requested, config_reloaded, config_reload_failed, config_paths_ignored,
sd_notify_failed, rescan_done; the components log the rest.
Limits: paths (mail roots, config and state dirs) change only at start.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

import trio

from . import registry, state, watcher
from .config import FILE_KNOBS, Config
from .decide import Policy
from .dispatch import Dispatcher
from .receipt_server import ReceiptServer
from .receipts import Receipts
from .ring import Ringer
from .sdnotify import Notifier
from .startup import prepare_mail_root, prepare_state_dir
from .state import SAVE_INTERVAL_S, StateStore
from .waiters import Waiters

SHUTDOWN_GRACE_S = 1.0  # SIGTERM must finish within 2 s; in-flight rings get this long
# With kernel events on every box (inotify, nothing polled) a lost event is announced (overflow),
# so the full pass that stats every box runs this rarely; measured: one pass over 10,000 boxes costs
# 52-99 ms of CPU, every minute that is 0.1 % of a core (research/performance.md §2).
FULL_PASS_S = 600.0


def policy_of(cfg: Config) -> Policy:
    return Policy(
        min_interval=cfg.session_min_interval_s,
        outstanding_limit=cfg.outstanding_limit_s,
        cap=cfg.wake_cap,
        half_life=cfg.wake_half_life_s,
    )


class Daemon:
    def __init__(self, cfg: Config, log, *, notifier: Notifier | None = None, receipts: bool = True,
                 reload_config: Callable[[], Config] | None = None):
        self.cfg = cfg
        self.log = log
        self.notifier = notifier or Notifier(on_error=self._notify_failed)
        self.reload_config = reload_config  # () -> Config, re-reading the config file (flags still win)
        self.store = StateStore(cfg.state_dir, log, cap=cfg.wake_cap, half_life=cfg.wake_half_life_s)
        self.receipts = Receipts(log) if receipts else None
        self.waiters = Waiters(cfg.state_dir, cfg.registry_dir)
        self.ringer = Ringer(self.store, log, registry_dir=cfg.registry_dir, poke_timeout=cfg.poke_timeout_s,
                             receipts=self.receipts, waiters=self.waiters)
        self.dispatcher = Dispatcher(cfg.mail_roots, cfg.registry_dir, self.store, self.ringer, log, policy_of(cfg),
                                     receipts=self.receipts, waiters=self.waiters,
                                     own_domain=registry.own_pid_domain())
        self.receipt_server = ReceiptServer(self.receipts, log, self.dispatcher.apply) if receipts else None
        self.ringer.receipt_server = self.receipt_server
        self.store.snapshot = lambda: self.dispatcher.snapshot(time.time())
        self.watcher = watcher.make(cfg, self.dispatcher, log)
        self.stopping = False
        self._state_changed = trio.Event()
        self._pokes_scope: trio.CancelScope | None = None
        self._main_scope: trio.CancelScope | None = None

    def _notify_failed(self, what: str, err: int | None) -> None:
        self.log.warning("sd_notify_failed", what=what, errno=err)

    # ------------------------------------------------------------ lifetimes

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        for root in cfg.mail_roots:
            prepare_mail_root(root)
        prepare_state_dir(cfg.state_dir)
        self.store.on_dirty = lambda: self._state_changed.set()
        self.store.load(time.time())
        self.log.info(
            "daemon_starting",
            pid=os.getpid(),
            mail_roots=[str(r) for r in cfg.mail_roots],
            registry=str(cfg.registry_dir),
            state_dir=str(cfg.state_dir),
            wake_cap=cfg.wake_cap,
            wake_half_life_s=cfg.wake_half_life_s,
        )
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._signals)
                outer.start_soon(self._flusher)
                if self.notifier.enabled and self.notifier.watchdog_interval:
                    outer.start_soon(self._watchdog)
                if self.receipt_server is not None:
                    await outer.start(self.receipt_server.serve)
                await outer.start(self.waiters.watch, self.dispatcher.waiters_changed)
                async with trio.open_nursery() as pokes:
                    self._pokes_scope = pokes.cancel_scope
                    self.dispatcher.poke_nursery = pokes
                    self.ringer.nursery = pokes
                    async with trio.open_nursery() as main:
                        self._main_scope = main.cancel_scope
                        watching = await main.start(self.watcher.run)
                        self.dispatcher.watcher_info = dict(watching or {})
                        self.dispatcher.registry_dirty(None)
                        self.dispatcher.mark_all()
                        await self.dispatcher.drain()
                        self.notifier.ready(self.dispatcher.status_line())
                        self.log.info("daemon_ready", boxes=len(self.dispatcher.boxes), **watching,
                                      **self.dispatcher.stats)
                        task_status.started()
                        main.start_soon(self._rescan_loop)
                        await self.dispatcher.run()
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                self.store.save(trio.current_time(), force=True)
            self.log.info("daemon_stopped", **self.dispatcher.stats)

    def request_stop(self) -> None:
        if self.stopping:
            if self._pokes_scope is not None:
                self._pokes_scope.cancel()  # a second signal cancels everything
            return
        self.stopping = True
        stop = getattr(self.watcher, "stop", None)
        if stop is not None:
            stop()
        self.notifier.stopping()
        self.log.info("daemon_stopping")
        if self._pokes_scope is not None:
            self._pokes_scope.deadline = min(self._pokes_scope.deadline, trio.current_time() + SHUTDOWN_GRACE_S)
        if self._main_scope is not None:
            self._main_scope.cancel()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
            async for signum in received:
                if signum == signal.SIGHUP:
                    self.notifier.reloading()
                    self.reload()
                    self.watcher.recheck()
                    self.dispatcher.mark_all()
                    self.notifier.ready(self.dispatcher.status_line())
                    continue
                self.request_stop()

    async def _flusher(self) -> None:
        """Write state when it changed, at most once a second: event-driven, no idle timer."""
        while True:
            await self._state_changed.wait()
            self._state_changed = trio.Event()
            await trio.sleep(max(0.0, self.store.saved_at + SAVE_INTERVAL_S - trio.current_time()))
            if not await self.store.save_in_thread(trio.current_time()) and self.store.dirty:
                self._state_changed.set()  # a write failed (ENOSPC): try again a second later

    async def _rescan_loop(self) -> None:
        """The heartbeat: re-arm what the watcher lost, re-read the registry, look again at boxes with mail
        waiting, and stat every box for changes (every time without complete kernel coverage, else every
        FULL_PASS_S)."""
        last_full = trio.current_time()
        while True:
            await trio.sleep(self.cfg.rescan_interval_s)
            start = time.perf_counter()
            self.watcher.recheck()
            self.dispatcher.registry_dirty(None)
            self.store.prune(time.time())
            now = trio.current_time()
            full = not self.watcher.complete() or now - last_full >= max(FULL_PASS_S, self.cfg.rescan_interval_s)
            count = None
            if full:
                count = self.dispatcher.mark_all(changed_only=True)
                last_full = now
                pruned = await trio.to_thread.run_sync(state.prune_files, self.cfg.state_dir, time.time())
                if pruned:
                    self.log.info("state_files_pruned", count=pruned)
            self.notifier.status(self.dispatcher.status_line())
            self.log.info("rescan_done", boxes=count, full=full,
                          duration_ms=round((time.perf_counter() - start) * 1000, 2))

    async def _watchdog(self) -> None:
        """Pet from inside the loop: a wedged loop cannot run this task, and systemd restarts us."""
        while True:
            await trio.sleep(self.notifier.watchdog_interval)
            self.notifier.watchdog()

    # ------------------------------------------------------------ reload

    def reload(self) -> None:
        """SIGHUP: re-read the config file (flags still win), keep every bit of state, rescan."""
        self.log.info("reload_requested")
        if self.reload_config is None:
            return
        try:
            new = self.reload_config()
        except ValueError as exc:  # ConfigError: keep running on the old settings
            self.log.error("config_reload_failed", reason=str(exc)[:300], kept="previous settings")
            return
        moved = [k for k in ("mail_roots", "claude_config_dir", "state_dir") if getattr(new, k) != getattr(self.cfg, k)]
        if moved:
            self.log.warning("config_paths_ignored", keys=moved, note="paths change only at start")
            new = new.with_(mail_root=self.cfg.mail_root, extra_mail_roots=self.cfg.extra_mail_roots,
                            claude_config_dir=self.cfg.claude_config_dir, state_dir=self.cfg.state_dir)
        changed = sorted(field for field, _kind in FILE_KNOBS.values() if getattr(new, field) != getattr(self.cfg, field))
        if new.log_level != self.cfg.log_level:
            from . import log as logmod

            logmod.configure(new.log_format, new.log_level)  # every component holds a lazy logger
        self.cfg = new
        self.dispatcher.policy = policy_of(new)
        self.store.cap, self.store.half_life = new.wake_cap, new.wake_half_life_s
        self.ringer.poke_timeout = new.poke_timeout_s
        self.log.info("config_reloaded", changed=changed)
