"""The daemon's wiring: watch the mail root, collapse events into a dirty set, decide per box, ring.

Lifetimes nest in the order things must stop: the signal and watchdog tasks
outermost, then in-flight pokes (given a short grace on shutdown), then the
watchers, rescan and dispatcher. Readiness is structural: both watchers are
armed before the initial scan, and READY=1 is sent only after that scan.

Trust: the mail root and the registry are written by other processes and may be
hostile. Box names are validated before any path is built; messages are counted,
never opened; every failure to reach a session is a logged fallback, and the
mail stays exactly where it is (this module never writes, renames or deletes
mail).
Logs: daemon_starting, daemon_ready, daemon_stopping, daemon_stopped, mail_seen,
session_unreachable, wake_capped, poke_sent, poke_failed, doorbell_outstanding,
doorbell_rearmed, box_gone, rescan_done, watch_failed, watch_restarted,
state_corrupt, state_write_failed, mail_name_rejected, box_name_rejected.
Limits: a box whose events the kernel drops (inotify overflow) is caught by the
periodic rescan, not sooner.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import trio
from watchfiles._rust_notify import RustNotify

from . import doorbell, lockfile, mailbox, registry, wakecap
from .config import FILE_KNOBS, Config
from .resolve import Target, Unreachable, resolve_box
from .sdnotify import Notifier

STATUS_FILE = "status.json"
EXIT_LOCKED = 3
EXIT_ENVIRONMENT = 4


class StartupError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass
class Box:
    queued: int = 0
    batch: frozenset = frozenset()  # names queued when the outstanding doorbell rang
    outstanding_since: float | None = None  # trio time of the ring
    rerung: bool = False
    in_flight: bool = False
    owner_pid: int | None = None
    owner_sid: str | None = None
    last_note: tuple | None = None  # what we last logged about it, to log changes only
    last_reason: str | None = None
    rejected_logged: frozenset = frozenset()
    pid: int | None = None
    session_id: str | None = None
    last_receipt: dict | None = None


def acquire_lock(state_dir: Path) -> int:
    try:
        return lockfile.acquire(state_dir)
    except lockfile.Locked as exc:
        raise StartupError(
            f"another courier is already running for state dir {state_dir} (pid {exc.holder}); "
            "stop it first, or give this one its own --state-dir",
            EXIT_LOCKED,
        ) from None
    except OSError as exc:
        raise StartupError(f"cannot use state dir {state_dir}: {exc.strerror}", EXIT_ENVIRONMENT) from None


def prepare_mail_root(root: Path) -> None:
    """Create the mail root 0700 if missing; refuse one that others may write into."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.stat(root)
    except OSError as exc:
        raise StartupError(f"cannot use mail root {root}: {exc.strerror}", EXIT_ENVIRONMENT) from None
    if not os.path.isdir(root):
        raise StartupError(f"mail root {root} is not a directory", EXIT_ENVIRONMENT)
    if st.st_mode & 0o022:
        raise StartupError(
            f"mail root {root} is writable by group or others (mode {st.st_mode & 0o777:o}); "
            f"any user could forge mail. Fix: chmod 700 {root}",
            EXIT_ENVIRONMENT,
        )


class Daemon:
    def __init__(self, cfg: Config, log, *, notifier: Notifier | None = None, clock=time.time):
        self.cfg = cfg
        self.log = log
        self.now = clock
        self.notifier = notifier or Notifier(on_error=self._notify_failed)
        self.boxes: dict[str, Box] = {}
        self.dirty: set[str] = set()
        self.timers: dict[str, float] = {}
        self._kick = trio.Event()
        self.session_last_poke: dict[str, float] = {}
        self.sid_index: dict[str, list[int]] = {}
        self.table = wakecap.Table({}, {})
        self._state_dirty = False
        self._state_event = trio.Event()
        self._state_saved_at = -math.inf
        self.stop_thread_event = threading.Event()
        self._rescan_tick = trio.Event()
        self._restart_watch: trio.CancelScope | None = None
        self.root_identity: tuple[int, int] | None = None
        self.watching_registry = False
        self.stats = {"pokes": 0, "fallbacks": 0, "capped": 0}
        self.ready = False
        self.stopping = False
        self._pokes_scope: trio.CancelScope | None = None
        self._main_scope: trio.CancelScope | None = None
        self._limiter = trio.CapacityLimiter(cfg.max_concurrent_pokes)
        self.own_domain = registry.own_pid_domain()
        self.receipts = None  # set by the receipts listener when enabled
        self.reload_config = None  # set by the CLI: () -> Config, re-reading the config file
        self.last_loop_progress = 0.0

    # ------------------------------------------------------------ helpers

    def _notify_failed(self, what: str, err: int | None) -> None:
        self.log.warning("sd_notify_failed", what=what, errno=err)

    def mark_dirty(self, handle: str) -> None:
        self.dirty.add(handle)
        self._kick.set()

    def schedule(self, handle: str, due: float) -> None:
        current = self.timers.get(handle)
        if current is None or due < current:
            self.timers[handle] = due
            self._kick.set()

    def box_path(self, handle: str) -> Path:
        return mailbox.box_dir(self.cfg.mail_root, handle)

    def _note(self, box: Box, key: tuple) -> bool:
        """True if this decision differs from the last one logged for the box."""
        if box.last_note == key:
            return False
        box.last_note = key
        return True

    # ------------------------------------------------------------ state

    def load_state(self) -> None:
        table, problem = wakecap.load(self.cfg.state_dir, self.cfg.wake_cap, self.now())
        self.table = table
        if problem:
            self.log.warning(
                "state_corrupt",
                reason=problem,
                decision="every recipient starts at the cap, decaying from now",
                wake_cap=self.cfg.wake_cap,
            )
            self.mark_state_dirty()

    def save_state(self, force: bool = False) -> None:
        if not self._state_dirty:
            return
        mono = time.monotonic()
        if not force and mono - self._state_saved_at < 1.0:
            return
        try:
            wakecap.save(self.cfg.state_dir, self.table)
            mailbox.write_json_atomic(self.cfg.state_dir / STATUS_FILE, self.status_snapshot())
        except OSError as exc:
            # ENOSPC and friends: keep running on the in-memory state, say so once per errno.
            if getattr(self, "_state_errno", None) != exc.errno:
                self._state_errno = exc.errno
                self.log.error("state_write_failed", errno=exc.errno, reason=errno.errorcode.get(exc.errno, "oserror"))
            return
        self._state_errno = None
        self._state_dirty = False
        self._state_saved_at = mono

    def mark_state_dirty(self) -> None:
        self._state_dirty = True
        self._state_event.set()

    async def _state_flusher(self) -> None:
        """Write state when it changed, at most once a second: event-driven, no idle timer."""
        while True:
            await self._state_event.wait()
            self._state_event = trio.Event()
            await trio.sleep(max(0.0, self._state_saved_at + 1.0 - time.monotonic()))
            self.save_state()

    # ------------------------------------------------------------ lifetimes

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.cfg
        prepare_mail_root(cfg.mail_root)
        try:
            os.makedirs(cfg.state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot use state dir {cfg.state_dir}: {exc.strerror}", EXIT_ENVIRONMENT) from None
        self.load_state()
        self.log.info(
            "daemon_starting",
            pid=os.getpid(),
            mail_root=str(cfg.mail_root),
            registry=str(cfg.registry_dir),
            state_dir=str(cfg.state_dir),
            wake_cap=cfg.wake_cap,
            wake_half_life_s=cfg.wake_half_life_s,
        )
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._signals)
                outer.start_soon(self._state_flusher)
                if self.notifier.enabled and self.notifier.watchdog_interval:
                    outer.start_soon(self._watchdog)
                if self.receipts is not None:
                    await outer.start(self.receipts.serve)
                async with trio.open_nursery() as pokes:
                    self._pokes_scope = pokes.cancel_scope
                    self._poke_nursery = pokes
                    async with trio.open_nursery() as main:
                        self._main_scope = main.cancel_scope
                        await main.start(self._watch)
                        await self._initial_scan()
                        self.ready = True
                        self.notifier.ready(self.status_line())
                        self.log.info("daemon_ready", boxes=len(self.boxes), **self.stats)
                        task_status.started()
                        main.start_soon(self._rescan_loop)
                        await self._dispatch_loop()
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                self.save_state(force=True)
                if self.receipts is not None:
                    self.receipts.close()
            self.log.info("daemon_stopped", **self.stats)

    def request_stop(self) -> None:
        if self.stopping:
            if self._pokes_scope is not None:
                self._pokes_scope.cancel()
            return
        self.stopping = True
        self.stop_thread_event.set()  # watchfiles' thread returns within one step
        self.notifier.stopping()
        self.log.info("daemon_stopping")
        if self._pokes_scope is not None:
            # In-flight pokes get a short grace; SIGTERM must finish within 2 s.
            self._pokes_scope.deadline = min(self._pokes_scope.deadline, trio.current_time() + 1.0)
        if self._main_scope is not None:
            self._main_scope.cancel()

    async def _signals(self) -> None:
        sigs = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
        with trio.open_signal_receiver(*sigs) as received:
            async for signum in received:
                if signum == signal.SIGHUP:
                    self.notifier.reloading()
                    self.reload()
                    self._request_rescan()
                    self.notifier.ready(self.status_line())
                    continue
                self.request_stop()

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
        moved = [k for k in ("mail_root", "claude_config_dir", "state_dir") if getattr(new, k) != getattr(self.cfg, k)]
        if moved:
            self.log.warning("config_paths_ignored", keys=moved, note="paths change only at start")
            new = new.with_(mail_root=self.cfg.mail_root, claude_config_dir=self.cfg.claude_config_dir,
                            state_dir=self.cfg.state_dir)
        changed = sorted(
            field for field, _kind in FILE_KNOBS.values() if getattr(new, field) != getattr(self.cfg, field)
        )
        if new.log_level != self.cfg.log_level:
            from . import log as logmod

            logmod.configure(new.log_format, new.log_level)
            self.log = logmod.get()
        self.cfg = new
        self.log.info("config_reloaded", changed=changed)

    async def _watchdog(self) -> None:
        """Pet only while the dispatcher makes progress: a wedged loop lets systemd restart us."""
        interval = self.notifier.watchdog_interval
        while True:
            await trio.sleep(interval)
            if self.loop_healthy():
                self.notifier.watchdog()

    def loop_healthy(self) -> bool:
        # The dispatcher stamps progress each pass and at least every rescan interval;
        # it is also stamped while idle-waiting (see _dispatch_loop).
        # Progress within one full watchdog period (WATCHDOG_USEC = 2 x the pet interval).
        return trio.current_time() - self.last_loop_progress < 2 * self.notifier.watchdog_interval

    def status_snapshot(self) -> dict:
        """What `courier status` shows beside what it can read from disk itself."""
        now_t = trio.current_time()
        wall = self.now()
        boxes = {}
        for handle, b in self.boxes.items():
            if not (b.queued or b.outstanding_since is not None or b.last_reason or b.last_receipt):
                continue
            boxes[handle] = {
                "queued": b.queued,
                "outstandingSince": None
                if b.outstanding_since is None
                else round(wall - (now_t - b.outstanding_since), 3),
                "lastReason": b.last_reason,
                "lastReceipt": b.last_receipt,
            }
        return {"version": 1, "pid": os.getpid(), "writtenAt": wall, "stats": dict(self.stats), "boxes": boxes}

    def status_line(self) -> str:
        waiting = sum(1 for b in self.boxes.values() if b.queued)
        outstanding = sum(1 for b in self.boxes.values() if b.outstanding_since is not None)
        return (
            f"{len(self.boxes)} boxes, {waiting} with mail, {outstanding} rung; "
            f"{self.stats['pokes']} pokes, {self.stats['fallbacks']} fallbacks, {self.stats['capped']} capped"
        )

    # ------------------------------------------------------------ watching

    def _watch_once(self, notify: RustNotify, stop: threading.Event):
        result = notify.watch(self.cfg.debounce_ms, self.cfg.step_ms, 0, stop)
        if result == "stop":
            notify.close()
        return result

    async def _watch(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """One watch over the mail root and the registry; armed (RustNotify's constructor starts it) before started().

        One RustNotify for both, because its watch loop wakes every `step_ms` even when
        nothing happens (measured: research/performance.md), so a second watcher doubles
        the idle cost. RustNotify directly rather than `awatch`: awatch's thread waits out
        a 5 s rust timeout on cancellation unless a stop event is set, and we want both
        the stop event and the freedom to rebuild the watch when the root is replaced or
        the registry appears.
        """
        root, reg = self.cfg.mail_root, self.cfg.registry_dir
        self.sid_index = registry.session_index(reg)
        started = False
        while True:
            stop = threading.Event()
            paths = [str(root)]
            self.watching_registry = os.path.isdir(reg)
            if self.watching_registry:
                paths.append(str(reg))
            try:
                os.makedirs(root, mode=0o700, exist_ok=True)
                st = os.stat(root)
                notify = RustNotify(paths, False, False, 50, True, True)
                self.root_identity = (st.st_dev, st.st_ino)
            except (OSError, RuntimeError) as exc:
                self.log.error(
                    "watch_failed",
                    path=str(root),
                    reason=type(exc).__name__,
                    errno=getattr(exc, "errno", None),
                    detail=str(exc)[:200],
                    fallback=f"rescan every {self.cfg.rescan_interval_s:g} s",
                )
                if not started:
                    started = True
                    task_status.started()
                await self._rescan_tick.wait()
                continue
            if not self.watching_registry:
                self.log.info("registry_watch_waiting", path=str(reg), reason="missing", retry="at each rescan")
            if not started:
                started = True
                task_status.started()
            else:
                self.log.info("watch_restarted", path=str(root), registry=self.watching_registry)
                self._mark_all_dirty()
                self._registry_changed(None)
            self._restart_watch = trio.CancelScope()
            try:
                with self._restart_watch:
                    while True:
                        result = await trio.to_thread.run_sync(
                            self._watch_once, notify, stop, abandon_on_cancel=True
                        )
                        if result == "stop":
                            return
                        if isinstance(result, set) and self._on_changes(result):
                            break
            finally:
                stop.set()

    def _on_changes(self, changes) -> bool:
        """Mark boxes dirty and note registry changes. True if the watch must be rebuilt."""
        root = str(self.cfg.mail_root)
        prefix = root.rstrip("/") + "/"
        reg = str(self.cfg.registry_dir)
        reg_prefix = reg.rstrip("/") + "/"
        rebuild = False
        pids: set[int] = set()
        for _kind, path in changes:
            if path.startswith(reg_prefix):
                pid = registry.pid_of_record_name(path[len(reg_prefix) :])
                if pid is not None:
                    pids.add(pid)
                continue
            if path == root or path == reg:
                rebuild = True
                continue
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            handle, _, inner = rest.partition("/")
            if not handle or handle.startswith("."):
                continue
            if inner and inner.rsplit("/", 1)[-1].startswith("."):
                # a sender's .tmp-* file; its rename to the final name is its own event
                continue
            if mailbox.valid_handle(handle):
                self.mark_dirty(handle)
        if pids:
            self._registry_changed(pids)
        if rebuild and (not os.path.isdir(root) or (self.watching_registry and not os.path.isdir(reg))):
            return True
        return False

    def _registry_changed(self, pids: set[int] | None) -> None:
        """Refresh the session index for these pids and re-evaluate the boxes they may own."""
        reg = self.cfg.registry_dir
        sids = set()
        if pids is None:
            self.sid_index = registry.session_index(reg)
            sids = set(self.sid_index)
        else:
            for pid in pids:
                for sid, owners in list(self.sid_index.items()):
                    if pid in owners:
                        owners.remove(pid)
                        if not owners:
                            del self.sid_index[sid]
                try:
                    rec = registry.read_record_once(registry.record_path(reg, pid), pid)
                except (OSError, registry.BadRecord):
                    continue
                self.sid_index.setdefault(rec.session_id, []).append(pid)
                sids.add(rec.session_id)
        for handle, box in self.boxes.items():
            if not box.queued or box.outstanding_since is not None or box.in_flight:
                continue
            if pids is None or box.owner_pid in pids or box.owner_sid in sids:
                self.mark_dirty(handle)

    # ------------------------------------------------------------ scanning

    def _mark_all_dirty(self) -> int:
        try:
            handles, skipped = mailbox.list_handles(self.cfg.mail_root)
        except OSError as exc:
            self.log.error("mail_root_unreadable", path=str(self.cfg.mail_root), errno=exc.errno)
            return 0
        for handle in handles:
            self.mark_dirty(handle)
        for gone in set(self.boxes) - set(handles):
            self.mark_dirty(gone)
        new_skips = set(skipped) - getattr(self, "_skipped_logged", set())
        for name in sorted(new_skips)[:20]:
            self.log.warning("box_name_rejected", name=repr(name)[:120], reason="not a valid handle or not a directory")
        self._skipped_logged = set(skipped)
        return len(handles)

    async def _initial_scan(self) -> None:
        self._mark_all_dirty()
        await self._dispatch_pass()

    def _request_rescan(self) -> None:
        tick, self._rescan_tick = self._rescan_tick, trio.Event()
        tick.set()
        self._mark_all_dirty()

    async def _rescan_loop(self) -> None:
        while True:
            await trio.sleep(self.cfg.rescan_interval_s)
            start = time.perf_counter()
            # The root may have been deleted and recreated: a watch on the old inode is blind.
            try:
                st = os.stat(self.cfg.mail_root)
                identity = (st.st_dev, st.st_ino)
            except OSError:
                identity = None
            registry_appeared = not self.watching_registry and os.path.isdir(self.cfg.registry_dir)
            if (identity != self.root_identity or registry_appeared) and self._restart_watch is not None:
                self._restart_watch.cancel()
            self.sid_index = registry.session_index(self.cfg.registry_dir)
            count = self._mark_all_dirty()
            tick, self._rescan_tick = self._rescan_tick, trio.Event()
            tick.set()
            await self._dispatch_pass()
            self.notifier.status(self.status_line())
            self.log.info("rescan_done", boxes=count, duration_ms=round((time.perf_counter() - start) * 1000, 2))

    # ------------------------------------------------------------ dispatch

    async def _dispatch_loop(self) -> None:
        while True:
            self.last_loop_progress = trio.current_time()
            if not self.dirty:
                due = min(self.timers.values(), default=math.inf)
                # Wake at least every watchdog interval so a healthy idle loop is seen as healthy.
                if self.notifier.watchdog_interval:
                    due = min(due, trio.current_time() + self.notifier.watchdog_interval)
                with trio.move_on_at(due):
                    await self._kick.wait()
                self._kick = trio.Event()
                now = trio.current_time()
                for handle, when in list(self.timers.items()):
                    if when <= now:
                        del self.timers[handle]
                        self.dirty.add(handle)
            await self._dispatch_pass()

    async def _dispatch_pass(self) -> None:
        batch, self.dirty = self.dirty, set()
        for handle in sorted(batch):
            await self.evaluate(handle)
            self.last_loop_progress = trio.current_time()
        await trio.sleep(0)

    async def evaluate(self, handle: str) -> None:
        """Decide about one box: nothing to do, fallback (logged), held by the cap, or ring."""
        log = self.log.bind(handle=handle)
        try:
            listing = mailbox.list_box(self.box_path(handle))
        except (FileNotFoundError, NotADirectoryError):
            if self.boxes.pop(handle, None) is not None:
                log.info("box_gone")
            self.timers.pop(handle, None)
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                box = self.boxes.setdefault(handle, Box())
                if self._note(box, ("symlink",)):
                    log.warning("box_name_rejected", reason="box_is_symlink")
                return
            log.error("box_unreadable", errno=exc.errno)
            return
        box = self.boxes.setdefault(handle, Box())
        new_rejects = set(listing.rejected) - box.rejected_logged
        if new_rejects:
            log.warning(
                "mail_name_rejected",
                count=len(new_rejects),
                names=[repr(n)[:80] for n in sorted(new_rejects)[:5]],
                reason="not a regular file with a safe name; left untouched",
            )
        box.rejected_logged = frozenset(listing.rejected)
        previously = box.queued
        box.queued = len(listing.queued)
        if box.queued > previously:
            log.debug("mail_seen", queued=box.queued)

        if box.outstanding_since is not None:
            if not box.queued or not (box.batch & set(listing.queued)):
                # The rung batch has been delivered (into read/); the next mail rings again.
                log.info("doorbell_rearmed", queued=box.queued)
                box.outstanding_since = None
                box.batch = frozenset()
                box.rerung = False
                box.last_note = None
                self.mark_state_dirty()
                self.timers.pop(handle, None)
                if self.receipts is not None:
                    self.receipts.rearmed(handle)
            else:
                age = trio.current_time() - box.outstanding_since
                if box.rerung or age < self.cfg.outstanding_limit_s:
                    if self._note(box, ("outstanding", box.queued)):
                        log.debug("doorbell_outstanding", queued=box.queued, age_s=round(age, 3))
                    if not box.rerung:
                        self.schedule(handle, box.outstanding_since + self.cfg.outstanding_limit_s)
                    return
                box.rerung = True  # one more ring for a doorbell nobody answered
        if not box.queued or box.in_flight:
            return

        target = self._resolve(handle, box)
        if isinstance(target, Unreachable):
            box.last_reason = target.reason
            self.mark_state_dirty()
            self.stats["fallbacks"] += 1
            if self._note(box, ("unreachable", target.reason, box.queued)):
                log.info(
                    "session_unreachable",
                    reason=target.reason,
                    pid=target.pid,
                    session_id=target.session_id,
                    queued=box.queued,
                    fallback="prompt",
                )
            return
        log = log.bind(pid=target.pid, session_id=target.session_id)
        box.pid, box.session_id = target.pid, target.session_id

        # Pacing: Claude's per-sender bucket refills one line per 2 s.
        last = self.session_last_poke.get(target.session_id)
        now_t = trio.current_time()
        if last is not None and now_t - last < self.cfg.session_min_interval_s:
            self.schedule(handle, last + self.cfg.session_min_interval_s)
            return

        # Receipts may have told us this session holds or refuses our doorbells.
        if self.receipts is not None:
            blocked = self.receipts.blocked(target, now_t)
            if blocked:
                box.last_reason = blocked
                if self._note(box, ("blocked", blocked, box.queued)):
                    log.info("session_unreachable", reason=blocked, queued=box.queued, fallback="prompt")
                return

        # The wake cap: a brake that holds mail, never eats it.
        now = self.now()
        level = self._current_level(handle)
        cap, half = self.cfg.wake_cap, self.cfg.wake_half_life_s
        if not wakecap.allowed(level, now, cap, half):
            when = wakecap.allowed_at(level, now, cap, half)
            box.last_reason = "wake_capped"
            self.stats["capped"] += 1
            if self._note(box, ("capped", box.queued)):
                log.info(
                    "wake_capped",
                    wake_level=round(wakecap.level_at(level, now, half), 3),
                    cap=cap,
                    queued=box.queued,
                    allowed_at=_iso(when),
                    fallback="prompt",
                )
            self.schedule(handle, now_t + max(0.05, when - now))
            return

        box.in_flight = True
        self.session_last_poke[target.session_id] = now_t
        self._poke_nursery.start_soon(self._ring, handle, box, target, listing.queued, log)

    def _current_level(self, handle: str) -> wakecap.Level:
        level = self.table.get(handle)
        turned = wakecap.apply_operator_turn(level, wakecap.operator_turn_at(self.cfg.state_dir, handle))
        if turned is not level:
            self.table.levels[handle] = turned
            self.mark_state_dirty()
        return turned

    def _resolve(self, handle: str, box: Box) -> Target | Unreachable:
        owner, result = resolve_box(self.cfg.mail_root, self.cfg.registry_dir, handle, self.sid_index, self.own_domain)
        if owner is not None:
            box.owner_pid, box.owner_sid = owner.pid, owner.session_id
        return result

    async def _ring(self, handle: str, box: Box, target: Target, names: tuple, log) -> None:
        try:
            async with self._limiter:
                self.table.ring += 1
                ring = self.table.ring
                self.mark_state_dirty()
                msg_id = doorbell.new_msg_id()
                from_addr = self.receipts.address_for(target.socket_path) if self.receipts else None
                line = doorbell.compose(
                    ring=ring,
                    queued=len(names),
                    box=str(self.box_path(handle)),
                    session_id=target.session_id,
                    msg_id=msg_id,
                    from_addr=from_addr,
                )
                result = await doorbell.poke(
                    target.socket_path, line, expected_pid=target.pid, timeout=self.cfg.poke_timeout_s
                )
            if result.sent:
                now = self.now()
                half = self.cfg.wake_half_life_s
                level = wakecap.after_poke(self._current_level(handle), now, half)
                self.table.levels[handle] = level
                self.table.last_ring[handle] = now
                self.mark_state_dirty()
                self.stats["pokes"] += 1
                box.outstanding_since = trio.current_time()
                box.batch = frozenset(names)
                box.last_reason = None
                box.last_note = ("rung", ring)
                self.schedule(handle, box.outstanding_since + self.cfg.outstanding_limit_s)
                if self.receipts is not None:
                    self.receipts.track(msg_id, handle, target, ring)
                log.info(
                    "poke_sent",
                    ring=ring,
                    queued=len(names),
                    latency_ms=round(result.latency_ms, 3),
                    write_ms=round(result.write_ms, 3) if result.write_ms is not None else None,
                    wake_level=round(level.value, 3),
                    note=result.reason,
                    msg_id=msg_id,
                )
            else:
                self.stats["fallbacks"] += 1
                self.mark_state_dirty()
                box.last_reason = result.reason
                box.last_note = ("failed", result.reason, box.queued)
                log.info(
                    "poke_failed",
                    ring=ring,
                    reason=result.reason,
                    errno=result.errno,
                    socket=target.socket_path,
                    latency_ms=round(result.latency_ms, 3),
                    fallback="prompt",
                )
            if result.sent:
                # Mail may have moved while we rang; look again. A failure waits for the
                # next event, registry change or rescan instead of retrying in a loop.
                self.mark_dirty(handle)
        finally:
            box.in_flight = False


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
