"""courier's own persisted state: wake levels (wakecap.json) and the status snapshot (status.json); and the
pruning of what the hooks leave in the state dir (operator turns, session hints).

Trust: both files live in courier's private state dir; they are still read through
`safeio` (bounded, no links) because a corrupt or planted file must never stop the
daemon or `courier status`. A corrupt wake-level file makes every recipient start at
the cap (a crash loop cannot reset the brake).
Logs: state_corrupt, state_write_failed (once per errno until a write succeeds); the daemon logs
state_files_pruned from what prune_files returns.
Limits: stdlib only, so `courier status` and `doctor` read the snapshot without trio.
The daemon writes it at most once a second, so what `status` shows may be that old.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Callable

from . import paths, safeio, wakecap

STATUS_FILE = "status.json"
MAX_STATUS_BYTES = 32 << 20
SAVE_INTERVAL_S = 1.0


def read_status(state_dir: Path) -> dict:
    """The daemon's last status snapshot, or {} if there is none it can trust."""
    try:
        return safeio.read_json_object(state_dir / STATUS_FILE, MAX_STATUS_BYTES)
    except (OSError, safeio.Unsafe):
        return {}


class StateStore:
    """The wake-level table and the status snapshot, written when changed, at most once a second."""

    def __init__(self, state_dir: Path, log, *, cap: int, half_life: float, snapshot: Callable[[], dict] | None = None):
        self.state_dir = state_dir
        self.log = log
        self.cap = cap
        self.half_life = half_life
        self.table = wakecap.Table()
        self.snapshot = snapshot or (lambda: {})
        self.dirty = False
        self.saved_at = float("-inf")  # daemon clock
        self._errno: int | None = None
        self._bad_turns: dict[str, str] = {}
        self.on_dirty: Callable[[], None] = lambda: None

    def load(self, wall: float) -> None:
        table, problem = wakecap.load(self.state_dir, self.cap, wall)
        self.table = table
        if problem:
            self.log.warning(
                "state_corrupt",
                reason=problem,
                decision="every recipient starts at the cap, decaying from now",
                wake_cap=self.cap,
            )
            self.mark_dirty()

    def mark_dirty(self) -> None:
        self.dirty = True
        self.on_dirty()

    def due(self, now: float, force: bool = False) -> bool:
        return self.dirty and (force or now - self.saved_at >= SAVE_INTERVAL_S)

    def _take(self) -> tuple[dict, dict]:
        """What to write, as fresh dicts (safe to hand to another thread), and the store clean again:
        a change made while they are written marks it dirty for the next write."""
        self.dirty = False
        return wakecap.encode(self.table), self.snapshot()

    @staticmethod
    def _write(state_dir: Path, table: dict, snapshot: dict) -> None:
        # Compact JSON: only then does `json` use its C encoder (indent=2 runs the pure-Python one, ~10x
        # slower, and a thread still holds the GIL while it encodes).
        safeio.write_bytes_atomic(state_dir / wakecap.STATE_FILE, safeio.dumps(table, indent=None))
        safeio.write_bytes_atomic(state_dir / STATUS_FILE, safeio.dumps(snapshot, indent=None))

    def _written(self, now: float, exc: OSError | None) -> bool:
        if exc is not None:
            self.dirty = True
            # ENOSPC and friends: keep running on the in-memory state, say so once per errno.
            if self._errno != exc.errno:
                self._errno = exc.errno
                self.log.error("state_write_failed", errno=exc.errno,
                               reason=errno.errorcode.get(exc.errno or 0, "oserror"))
            return False
        self._errno = None
        self.saved_at = now
        return True

    def save(self, now: float, force: bool = False) -> bool:
        """Write both files now, in this thread (at shutdown), if changed."""
        if not self.due(now, force):
            return False
        table, snapshot = self._take()
        try:
            self._write(self.state_dir, table, snapshot)
        except OSError as exc:
            return self._written(now, exc)
        return self._written(now, None)

    async def save_in_thread(self, now: float) -> bool:
        """The same, with the encoding and the writes off the event loop: a big snapshot written once a
        second was the tail of the notice latency (research/performance.md §1)."""
        import trio

        if not self.due(now):
            return False
        table, snapshot = self._take()
        try:
            await trio.to_thread.run_sync(self._write, self.state_dir, table, snapshot)
        except OSError as exc:
            return self._written(now, exc)
        return self._written(now, None)

    # ------------------------------------------------------------ levels

    def level(self, recipient: str, handle: str, session_id: str | None, wall: float) -> wakecap.Level:
        """The recipient's level now: a migrated per-box level folded in, an operator turn applied."""
        level = self.table.get(recipient)
        box = wakecap.box_key(handle)
        legacy = self.table.levels.pop(box, None) if recipient != box else None  # a box-keyed recipient keeps its own
        if legacy is not None:
            level = wakecap.merge(level, legacy, wall, self.half_life)
            self.table.levels[recipient] = level
            self.mark_dirty()
        turn, problems = wakecap.read_operator_turns(self.state_dir, handle, session_id)
        for name, why in problems:
            if self._bad_turns.get(name) != why:  # once per file and reason, not at every look
                self._bad_turns[name] = why
                if len(self._bad_turns) > 10_000:
                    self._bad_turns.clear()
                self.log.warning("operator_turn_unreadable", file=name, reason=why, decision="ignored")
        turned = wakecap.apply_operator_turn(level, turn)
        if turned is not level:
            self.table.levels[recipient] = turned
            self.mark_dirty()
        return turned

    def woke(self, recipient: str, handle: str, level: wakecap.Level, wall: float) -> wakecap.Level:
        """Record one wake of `recipient` through box `handle`; returns the new level."""
        raised = wakecap.after_wake(level, wall, self.half_life)
        self.table.levels[recipient] = raised
        self.table.last_ring[handle] = wall
        self.mark_dirty()
        return raised

    def refund(self, recipient: str, wall: float) -> None:
        """Take one wake back (the doorbell was held or dropped: nobody woke)."""
        level = self.table.levels.get(recipient)
        if level is None:
            return
        self.table.levels[recipient] = wakecap.Level(max(0.0, wakecap.level_at(level, wall, self.half_life) - 1.0), wall)
        self.mark_dirty()

    def prune(self, wall: float) -> int:
        """Forget levels that have decayed to what an unknown recipient gets anyway (sessions come and go:
        without this the table, and every state write, grows with every session ever woken)."""
        if wakecap.level_at(self.table.default, wall, self.half_life) > 0.01:
            return 0  # after a corrupt state the default is high: a low level (an operator's reset) is news
        gone = [k for k, lvl in self.table.levels.items() if wakecap.level_at(lvl, wall, self.half_life) <= 0.01]
        for key in gone:
            del self.table.levels[key]
        if gone:
            self.mark_dirty()
        return len(gone)

    def forget_box(self, handle: str) -> None:
        if self.table.last_ring.pop(handle, None) is not None:
            self.mark_dirty()

    def next_ring(self) -> int:
        self.table.ring += 1
        self.mark_dirty()
        return self.table.ring


def ensure_state_dir(path: Path) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)


# ---------------------------------------------------------------- files the hooks leave behind
#
# One operator-turn file and one hint per session ever seen: without this the two directories grow for as long
# as courier is installed. An operator turn older than a day cannot matter (any level raised before it has decayed
# to nothing by now); a hint older than a month costs a resumed session one owner.json scan.
FILE_MAX_AGE_S = {wakecap.OPERATOR_DIR: 86_400.0, paths.HINT_DIR: 30 * 86_400.0}


def prune_files(state_dir: Path, wall: float, max_age: dict[str, float] = FILE_MAX_AGE_S) -> int:
    """Remove regular files older than their directory's age limit; returns how many. Never follows a link
    (the directories are opened O_NOFOLLOW, entries are unlinked by name), never raises for a missing dir."""
    removed = 0
    for sub, age in max_age.items():
        try:
            fd = safeio.open_dir_nofollow(os.path.join(state_dir, sub))
        except OSError:
            continue
        try:
            for entry in os.scandir(fd):
                try:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and wall - st.st_mtime > age:
                        os.unlink(entry.name, dir_fd=fd)
                        removed += 1
                except OSError:
                    continue  # gone meanwhile, or not ours to remove: the next pass looks again
        finally:
            os.close(fd)
    return removed
