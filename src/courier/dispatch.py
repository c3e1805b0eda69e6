"""The dispatcher: a dirty set of boxes, their timers, one drain loop, and the per-box look around `decide`.

Watcher events, registry changes, receipts and rescans only mark boxes dirty (or
schedule a look); one loop drains the set one box at a time and yields between
boxes, so a big pass never delays signals, receipts or a ring elsewhere by more
than one box's work (Postfix's collapsed triggers, DESIGN §2).

Trust: a box is named by a directory listing or a watcher event and validated
before a path is built. Crash-only isolation: an unexpected exception while
looking at one box, or while ringing it, is logged (`box_failed`, with the
exception type and where) and that box alone is retried with back-off; every
other box keeps being served. Nothing read from disk can end this loop.
Logs: box_gone, box_damaged, box_failed, box_name_rejected, mail_root_unreadable,
rescan_done, and through `decide`/`ring` every decision about a box.
Limits: a box whose events the kernel drops is caught by the periodic rescan.
"""

from __future__ import annotations

import errno
import math
import os
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import trio

from . import decide, mailbox, registry
from .decide import BoxState, Hold, Policy, Ring
from .receipts import Note, Retry
from .resolve import Target, resolve_box
from .text import escape

BACKOFF_MAX_S = 300.0
LAST_WAKE_MAX = 50_000


class BoxId(NamedTuple):
    root: Path
    handle: str


class _World:
    """What `decide` asks about one box, answered from disk and the daemon's tables."""

    __slots__ = ("d", "box_id", "box")

    def __init__(self, d: "Dispatcher", box_id: BoxId, box: BoxState):
        self.d, self.box_id, self.box = d, box_id, box

    def resolve(self):
        owner, result = resolve_box(self.box_id.root, self.d.registry_dir, self.box_id.handle, self.d.sessions,
                                    self.d.own_domain)
        if owner is not None:
            self.box.owner_pid, self.box.owner_sid = owner.pid, owner.session_id
        return result

    def last_wake(self, session_id: str) -> float | None:
        return self.d.last_wake.get(session_id)

    def receipt_block(self, target: Target, now: float) -> str | None:
        receipts = self.d.receipts
        return receipts.blocked(target.session_id, target.pid, now) if receipts is not None else None

    def has_waiter(self, target: Target) -> bool:
        waiters = self.d.waiters
        return waiters is not None and waiters.has(target.session_id, pid=target.pid)

    def level(self, recipient: str, target: Target, wall: float):
        return self.d.store.level(recipient, self.box_id.handle, target.session_id, wall)

    def first_sight(self, session_id: str, what: str) -> bool:
        seen = self.d.sighted
        if (session_id, what) in seen:
            return False
        if len(seen) >= 10_000:  # sessions come and go for weeks: forget, at worst say it once more
            seen.clear()
        seen.add((session_id, what))
        return True


class Dispatcher:
    def __init__(self, roots, registry_dir: Path, store, ringer, log, policy: Policy, *,
                 receipts=None, waiters=None, own_domain: str | None = None):
        self.roots = [Path(r) for r in roots]
        self.registry_dir = Path(registry_dir)
        self.store = store
        self.ringer = ringer
        self.log = log
        self.policy = policy
        self.receipts = receipts
        self.waiters = waiters
        self.own_domain = own_domain
        self.boxes: dict[BoxId, BoxState] = {}
        self.dirty: set[BoxId] = set()
        self.timers: dict[BoxId, float] = {}
        self.last_wake: dict[str, float] = {}
        self.sighted: set[tuple[str, str]] = set()  # (session id, what) said once per session
        self.sessions = registry.SessionIndex()
        self.stats = ringer.stats
        self.progress = 0.0  # daemon clock of the last step of the loop (the watchdog looks at it)
        self.poke_nursery: trio.Nursery | None = None
        self._kick = trio.Event()
        self._skipped_logged: set[str] = set()
        self.watcher_info: dict = {}  # what the watcher said when it was armed (status shows it)
        # Receipts that came back while their ring was still being recorded (Claude answers
        # within a millisecond of reading the line, before our poke has seen EOF).
        self.early: dict[BoxId, list] = {}

    # ------------------------------------------------------------ the watcher's sink

    def box_dirty(self, root: Path, handle: str) -> None:
        self.dirty.add(BoxId(root, handle))
        self._kick.set()

    def registry_dirty(self, names) -> None:
        """Refresh the session index for these record names (None: all) and look again at the
        boxes with mail waiting whose owner they may be."""
        if names is None:
            self.sessions = registry.SessionIndex.build(self.registry_dir)
            touched, pids = None, None
        else:
            touched = self.sessions.update(self.registry_dir, names)
            pids = {registry.pid_of_record_name(n) for n in names}
        for box_id, box in self.boxes.items():
            if not box.queued or box.outstanding_since is not None or box.in_flight:
                continue
            if touched is None or box.owner_pid in pids or box.owner_sid in touched:
                self.box_dirty(*box_id)

    def waiters_changed(self, pids) -> None:
        """A rewake waiter registered for these Claude pids (None: any): look again at boxes whose mail
        waits for one (it was held while the session had neither a usable socket nor a waiter)."""
        for box_id, box in self.boxes.items():
            if not box.queued or box.outstanding_since is not None or box.in_flight:
                continue
            if pids is None or box.owner_pid in pids:
                self.box_dirty(*box_id)

    def rescan(self, reason: str) -> None:
        self.mark_all()  # events were lost: look at every box, changed or not

    # ------------------------------------------------------------ marking

    def schedule(self, box_id: BoxId, due: float) -> None:
        current = self.timers.get(box_id)
        if current is None or due < current:
            self.timers[box_id] = due
            self._kick.set()

    def mark_all(self, changed_only: bool = False) -> int:
        """Boxes of every root dirty (a rescan); returns how many boxes exist.

        With `changed_only`, a box whose directory has the same (mtime, inode) as at its last
        settled look is skipped: a safety rescan of idle boxes is a pass of stat calls. Boxes with
        mail waiting are looked at again through `registry_dirty(None)` and their timers anyway.
        """
        seen: set[BoxId] = set()
        skipped_now: set[str] = set()
        for root in self.roots:
            try:
                handles, skipped = mailbox.list_handles(root, with_identity=changed_only)
            except OSError as exc:
                self.log.error("mail_root_unreadable", path=str(root), errno=exc.errno)
                continue
            for handle in handles:
                box_id = BoxId(root, handle if isinstance(handle, str) else handle[0])
                seen.add(box_id)
                if changed_only and not isinstance(handle, str):
                    box = self.boxes.get(box_id)
                    if box is not None and box.seen is not None and box.seen == handle[1]:
                        continue
                self.box_dirty(*box_id)
            skipped_now.update(os.path.join(str(root), s) for s in skipped)
        for box_id in set(self.boxes) - seen:
            self.box_dirty(*box_id)  # gone since: the look logs box_gone
        for name in sorted(skipped_now - self._skipped_logged)[:20]:
            self.log.warning("box_name_rejected", name=escape(name, 160), reason="not a valid handle or not a directory")
        self._skipped_logged = skipped_now
        return len(seen)

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        while True:
            self.progress = trio.current_time()
            if not self.dirty:
                due = min(self.timers.values(), default=math.inf)
                with trio.move_on_at(due):
                    await self._kick.wait()
                self._kick = trio.Event()
                now = trio.current_time()
                for box_id, when in list(self.timers.items()):
                    if when <= now:
                        del self.timers[box_id]
                        self.dirty.add(box_id)
            await self.drain()

    async def drain(self) -> None:
        """Look at every dirty box once, yielding between boxes."""
        batch, self.dirty = self.dirty, set()
        for box_id in sorted(batch):
            await self.look(box_id)
            self.progress = trio.current_time()
            await trio.sleep(0)

    def stamp(self) -> None:
        self.progress = trio.current_time()

    # ------------------------------------------------------------ one box

    async def look(self, box_id: BoxId) -> None:
        known = self.boxes.get(box_id)
        ringing = known is not None and known.in_flight
        try:
            self._look(box_id)
        except Exception as exc:  # noqa: BLE001 - crash-only isolation: this box alone is retried
            self._failed(box_id, exc, ringing)

    def _failed(self, box_id: BoxId, exc: BaseException, ringing: bool = False) -> None:
        box = self.boxes.setdefault(box_id, BoxState())
        box.failures += 1
        if not ringing:  # a ring decided by the failed look never started; a running one clears its own flag
            box.in_flight = False
        delay = min(BACKOFF_MAX_S, 2.0 ** box.failures)
        frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f"{os.path.basename(frame.filename)}:{frame.lineno}:{frame.name}" if frame else "?"
        self.log.error("box_failed", handle=box_id.handle, error=type(exc).__name__, where=where,
                       retry_in_s=delay, failures=box.failures)
        self.schedule(box_id, trio.current_time() + delay)

    def _look(self, box_id: BoxId) -> None:
        root, handle = box_id
        log = self.log.bind(handle=handle, **({"root": str(root)} if len(self.roots) > 1 else {}))
        try:
            fd = mailbox.open_box(root, handle)
        except (FileNotFoundError, NotADirectoryError):
            self._gone(box_id, log)
            return
        except mailbox.Damaged as exc:
            self._damaged(box_id, exc.reason, log)
            return
        except OSError as exc:
            log.error("box_unreadable", errno=exc.errno, reason=errno.errorcode.get(exc.errno or 0, "oserror"))
            return
        try:
            st = os.fstat(fd)  # before listing: a change after this moves the mtime past what we record
            listing = mailbox.list_box(fd)
            damaged = mailbox.read_dir_problem(fd)
        finally:
            os.close(fd)
        box = self.boxes.setdefault(box_id, BoxState())
        # A directory changed within the last second may change again within the same timestamp
        # tick: only a settled mtime lets a later rescan skip the box (git's "racy" rule).
        box.seen = (st.st_mtime_ns, st.st_ino) if time.time() - st.st_mtime > 1.0 else None
        if damaged != box.damaged:
            box.damaged = damaged
            if damaged:
                log.warning("box_damaged", reason=damaged, fix=mailbox.FIXES[damaged],
                            consequence="its mail is shown at each prompt but never moved to read/")
        now = trio.current_time()
        outstanding, had_mail = box.outstanding_since is not None, box.queued > 0
        decision = decide.decide(box, listing, _World(self, box_id, box), now=now, wall=time.time(),
                                 policy=self.policy, log=log)
        box.failures = 0
        if self.receipts is not None and (
            (outstanding and box.outstanding_since is None) or (had_mail and not box.queued)
        ):
            # The batch was read (a receipt's Retry may have re-armed it already): the next
            # batch's doorbell may be retried once again if dropped.
            self.receipts.rearmed(box_id)
        if isinstance(decision, Ring):
            self.last_wake[decision.target.session_id] = now
            if len(self.last_wake) > LAST_WAKE_MAX:
                self._prune_last_wake(now)
            self.poke_nursery.start_soon(self._ring, box_id, box, decision, log)
            return
        if isinstance(decision, Hold):
            self.stats["capped" if decision.reason == "wake_capped" else "fallbacks"] += 1
            self.store.mark_dirty()
        if decision.retry_at is not None:
            self.schedule(box_id, decision.retry_at)

    def _gone(self, box_id: BoxId, log) -> None:
        if self.boxes.pop(box_id, None) is not None:
            log.info("box_gone")
        self.timers.pop(box_id, None)
        self.store.forget_box(box_id.handle)
        if self.receipts is not None:
            self.receipts.forget_box(box_id)

    def _damaged(self, box_id: BoxId, reason: str, log) -> None:
        box = self.boxes.setdefault(box_id, BoxState())
        if box.damaged != reason:
            box.damaged = reason
            log.warning("box_damaged", reason=reason, fix=mailbox.FIXES[reason],
                        consequence="courier does not ring it; its owner's prompt hook shows nothing from it")

    def _prune_last_wake(self, now: float) -> None:
        horizon = now - self.policy.min_interval
        for sid in [s for s, at in self.last_wake.items() if at < horizon]:
            del self.last_wake[sid]

    async def _ring(self, box_id: BoxId, box: BoxState, decision: Ring, log) -> None:
        log = log.bind(pid=decision.target.pid, session_id=decision.target.session_id)
        try:
            outcome = await self.ringer.ring(box_id, decision, log)
        except Exception as exc:  # noqa: BLE001 - one ring must never end the daemon
            outcome = None
            self._failed(box_id, exc)
        finally:
            box.in_flight = False
            early = self.early.pop(box_id, ())
        if outcome is None:
            self.apply(early)  # a receipt that came meanwhile still says what the session did
            return
        now = trio.current_time()
        note = ("rung", outcome.ring) if outcome.sent else ("failed", outcome.reason, box.queued)
        decide.after_ring(box, decision, outcome.sent, outcome.reason, now, note, outcome.ring)
        self.store.mark_dirty()
        if outcome.sent:
            self.schedule(box_id, now + self.policy.outstanding_limit)
            # Mail may have moved while we rang; look again. A failure waits for the
            # next event, registry change or rescan instead of retrying in a loop.
            self.box_dirty(*box_id)
        self.apply(early)  # after the ring is recorded: a held receipt re-arms what it rang

    # ------------------------------------------------------------ receipts' effects

    def apply(self, effects) -> None:
        for effect in effects:
            box = self.boxes.get(effect.box)
            if box is None:
                continue
            if box.in_flight:
                self.early.setdefault(effect.box, []).append(effect)
                continue
            if isinstance(effect, Note):
                box.last_receipt = effect.receipt
                self.store.mark_dirty()
            elif isinstance(effect, Retry) and box.outstanding_since is not None and box.ring == effect.ring:
                decide.rearm(box)
                if box.recipient:
                    self.store.refund(box.recipient, time.time())
                self.schedule(effect.box, effect.at)

    # ------------------------------------------------------------ what status shows

    def snapshot(self, wall: float) -> dict:
        now = trio.current_time()
        boxes = {}
        for (root, handle), b in self.boxes.items():
            if not (b.queued or b.outstanding_since is not None or b.last_reason or b.last_receipt or b.damaged):
                continue
            boxes[str(root / handle)] = {
                "queued": b.queued,
                "outstandingSince": None if b.outstanding_since is None else round(wall - (now - b.outstanding_since), 3),
                "lastReason": b.last_reason,
                "lastReceipt": b.last_receipt,
                "recipient": b.recipient,
                "transport": b.transport,
                "damaged": b.damaged,
            }
        return {"version": 2, "pid": os.getpid(), "writtenAt": wall, "stats": dict(self.stats), "boxes": boxes,
                "watcher": self.watcher_info, "tables": self.table_sizes()}

    def table_sizes(self) -> dict:
        """How big every table that grows with mail or sessions is (the soak benchmark watches these)."""
        sizes = {"boxes": len(self.boxes), "timers": len(self.timers), "last_wake": len(self.last_wake),
                 "sighted": len(self.sighted),
                 "sessions": len(self.sessions), "wake_levels": len(self.store.table.levels)}
        if self.receipts is not None:
            sizes.update({f"receipts_{k}": v for k, v in self.receipts.sizes().items()})
        return sizes

    def status_line(self) -> str:
        waiting = sum(1 for b in self.boxes.values() if b.queued)
        outstanding = sum(1 for b in self.boxes.values() if b.outstanding_since is not None)
        return (
            f"{len(self.boxes)} boxes, {waiting} with mail, {outstanding} rung; "
            f"{self.stats['pokes']} pokes, {self.stats['fallbacks']} fallbacks, {self.stats['capped']} capped"
        )
