"""A decaying per-recipient brake on wakes: pure arithmetic plus its small state files.

The level of a recipient rises by 1 for every poke courier sends and halves
every `half_life` seconds. A poke that would lift it above `cap` is held: the
mail stays queued for deliver-on-prompt, never eaten. An operator turn (a
prompt that is not courier's doorbell, reported by the prompt hook) returns the
level to 0.

Trust: state files live in courier's own state dir; a corrupt one is treated
conservatively (every recipient starts at the cap) so a crash loop can never
reset the brake. Handles are validated before they name a file.
Logs: nothing; the daemon logs `wake_capped` / `state_corrupt` from what this returns.
Limits: imported by the prompt hook, so stdlib only.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import NamedTuple

from . import mailbox

STATE_FILE = "wakecap.json"
# Every doorbell's text starts with this marker; the prompt hook treats a prompt
# that starts with it as courier's own ring, and anything else as an operator turn.
DOORBELL_MARKER = "[courier doorbell]"


def is_doorbell(prompt: object) -> bool:
    return isinstance(prompt, str) and prompt.lstrip().startswith(DOORBELL_MARKER)
OPERATOR_DIR = "operator-turns"


class Level(NamedTuple):
    value: float  # level at time `at`
    at: float  # wall-clock seconds


ZERO = Level(0.0, 0.0)


def level_at(level: Level, now: float, half_life: float) -> float:
    if level.value <= 0:
        return 0.0
    elapsed = max(0.0, now - level.at)
    return level.value * math.pow(0.5, elapsed / half_life)


# A poke fits when the level has decayed to cap - 1 (within TOLERANCE). With cap 1
# that means "decayed to nearly nothing": ten half-lives.
TOLERANCE = 1e-3


def allowed(level: Level, now: float, cap: int, half_life: float) -> bool:
    return level_at(level, now, half_life) <= cap - 1.0 + TOLERANCE


def allowed_at(level: Level, now: float, cap: int, half_life: float) -> float:
    """The earliest time >= now at which one more poke fits under the cap."""
    current = level_at(level, now, half_life)
    threshold = cap - 1.0 + TOLERANCE
    if current <= threshold:
        return now
    return now + half_life * math.log2(current / threshold)


def after_poke(level: Level, now: float, half_life: float) -> Level:
    return Level(level_at(level, now, half_life) + 1.0, now)


# ---------------------------------------------------------------- persistence


class Table:
    """Levels per handle; `default` applies to handles with no entry (conservative after corruption)."""

    def __init__(self, levels: dict[str, Level], last_ring: dict[str, float], ring: int = 0, default: Level = ZERO):
        self.levels = levels
        self.last_ring = last_ring
        self.ring = ring
        self.default = default

    def get(self, handle: str) -> Level:
        return self.levels.get(handle, self.default)


def encode(table: Table) -> dict:
    return {
        "version": 1,
        "ring": table.ring,
        "default": {"level": table.default.value, "at": table.default.at},
        "boxes": {
            h: {"level": lvl.value, "at": lvl.at, "lastRing": table.last_ring.get(h)}
            for h, lvl in sorted(table.levels.items())
        },
    }


def decode(data: object, cap: int, now: float) -> tuple[Table, bool]:
    """(table, ok). Anything malformed yields the conservative table and ok=False."""
    conservative = Table({}, {}, 0, Level(float(cap), now))
    if not isinstance(data, dict) or data.get("version") != 1:
        return conservative, False
    try:
        ring = data.get("ring", 0)
        if isinstance(ring, bool) or not isinstance(ring, int) or ring < 0:
            return conservative, False
        d = data.get("default") or {"level": 0.0, "at": 0.0}
        default = Level(_finite(d["level"]), _finite(d["at"]))
        levels, last = {}, {}
        boxes = data.get("boxes", {})
        if not isinstance(boxes, dict):
            return conservative, False
        for handle, entry in boxes.items():
            if not mailbox.valid_handle(handle) or not isinstance(entry, dict):
                return conservative, False
            levels[handle] = Level(_finite(entry["level"]), _finite(entry["at"]))
            if entry.get("lastRing") is not None:
                last[handle] = _finite(entry["lastRing"])
    except (KeyError, TypeError, ValueError):
        return conservative, False
    conservative.ring = ring
    return Table(levels, last, ring, default), True


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("not a finite number")
    if value < 0:
        raise ValueError("negative")
    return float(value)


def load(state_dir: Path, cap: int, now: float) -> tuple[Table, str | None]:
    """(table, problem). problem is None, or a reason the file was not trusted."""
    path = state_dir / STATE_FILE
    try:
        raw = mailbox.read_bounded(path, 16 << 20)
    except FileNotFoundError:
        return Table({}, {}), None
    except mailbox.Unsafe as exc:
        return decode(None, cap, now)[0], f"state_{exc.reason}"
    except OSError as exc:
        return decode(None, cap, now)[0], f"state_unreadable_{exc.errno}"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return decode(None, cap, now)[0], "state_malformed_json"
    table, ok = decode(data, cap, now)
    return table, None if ok else "state_invalid"


def save(state_dir: Path, table: Table) -> None:
    """Atomic write; raises OSError (e.g. ENOSPC) for the caller to log."""
    mailbox.write_json_atomic(state_dir / STATE_FILE, encode(table))


# ---------------------------------------------------------------- operator turns
#
# The file contract between the prompt hook and the daemon: the hook, seeing a
# prompt that is not courier's doorbell, writes <state>/operator-turns/<handle>
# (its content the wall-clock time). The daemon reads its mtime when it decides
# about that handle: a turn after the level was last raised resets it to 0.
# A file, not a socket, so the hook never waits on the daemon.


def operator_turn_path(state_dir: Path, handle: str) -> Path:
    if not mailbox.valid_handle(handle):
        raise ValueError(f"not a valid handle: {handle!r}")
    return state_dir / OPERATOR_DIR / handle


def record_operator_turn(state_dir: Path, handle: str, now: float | None = None) -> None:
    path = operator_turn_path(state_dir, handle)
    os.makedirs(path.parent, mode=0o700, exist_ok=True)
    stamp = time.time() if now is None else now
    mailbox.write_json_atomic(path, {"at": stamp})


def operator_turn_at(state_dir: Path, handle: str) -> float | None:
    try:
        data = mailbox.read_json_object(operator_turn_path(state_dir, handle), 4096)
        return _finite(data.get("at"))
    except (FileNotFoundError, mailbox.Unsafe, ValueError, OSError):
        return None


def apply_operator_turn(level: Level, turn_at: float | None) -> Level:
    """An operator turn after the level was last raised returns it to 0."""
    if turn_at is not None and turn_at >= level.at:
        return Level(0.0, turn_at)
    return level
