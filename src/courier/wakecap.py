"""A decaying per-recipient brake on wakes: pure arithmetic plus its small state files.

The level of a recipient *session* rises by 1 for every wake courier sends it,
whichever box the mail was in and whichever transport carried the wake, and
halves every `half_life` seconds. A wake that would lift it above `cap` is held:
the mail stays queued for deliver-on-prompt, never eaten. An operator turn (a
prompt that is not courier's doorbell, reported by the prompt hook) returns the
level to 0.

Trust: state files live in courier's own state dir and are read through `safeio`
(bounded, no links); a corrupt one is treated conservatively (every recipient
starts at the cap) so a crash loop can never reset the brake. Keys and file names
are built from validated handles and session ids only.
Logs: nothing; the daemon logs `wake_capped` / `state_corrupt` from what this returns.
Limits: imported by the prompt hook, so stdlib only.
"""

from __future__ import annotations

import math
import os
import time
from collections import namedtuple

from . import safeio
from .mailbox import valid_handle as _handle_key  # a box's key is its handle

STATE_FILE = "wakecap.json"
OPERATOR_DIR = "operator-turns"
MAX_STATE_BYTES = 16 << 20
# Session ids as Claude mints them (UUIDs), and anything else of that alphabet.
SESSION_ID_NAME = safeio.WholeName(r"[A-Za-z0-9._-]{1,200}")


def valid_session_id(value: object) -> bool:
    """A session id that may name a file: the charset, at most 200 characters, not hidden."""
    return isinstance(value, str) and SESSION_ID_NAME.fullmatch(value) is not None and value[0] != "."


# value: the level at time `at` (wall-clock seconds).
Level = namedtuple("Level", "value at")


ZERO = Level(0.0, 0.0)


def session_key(session_id: str) -> str:
    return f"session:{session_id}"


def box_key(handle: str) -> str:
    """The key for a recipient whose session is not known (and for levels migrated from per-box state)."""
    return f"box:{handle}"


def recipient_key(session_id: str | None, handle: str) -> str:
    """Whose level a wake counts against: the session's, or the box's when the session id (read from a
    registry record or owner.json, so hostile) could not round-trip through the state file."""
    if session_id and valid_key(session_key(session_id)):
        return session_key(session_id)
    return box_key(handle)


def valid_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    kind, _, rest = key.partition(":")
    if kind == "session":
        return SESSION_ID_NAME.fullmatch(rest) is not None
    if kind == "box":
        return _handle_key(rest)
    return False


def level_at(level: Level, now: float, half_life: float) -> float:
    if level.value <= 0:
        return 0.0
    elapsed = max(0.0, now - level.at)
    return level.value * math.pow(0.5, elapsed / half_life)


# A wake fits when the level has decayed to cap - 1 (within TOLERANCE). With cap 1
# that means "decayed to nearly nothing": ten half-lives.
TOLERANCE = 1e-3


def allowed(level: Level, now: float, cap: int, half_life: float) -> bool:
    return level_at(level, now, half_life) <= cap - 1.0 + TOLERANCE


def allowed_at(level: Level, now: float, cap: int, half_life: float) -> float:
    """The earliest time >= now at which one more wake fits under the cap."""
    current = level_at(level, now, half_life)
    threshold = cap - 1.0 + TOLERANCE
    if current <= threshold:
        return now
    return now + half_life * math.log2(current / threshold)


def after_wake(level: Level, now: float, half_life: float) -> Level:
    return Level(level_at(level, now, half_life) + 1.0, now)


def merge(a: Level, b: Level, now: float, half_life: float) -> Level:
    """The higher of two levels, as of now (migrating a per-box level into its session's)."""
    return Level(max(level_at(a, now, half_life), level_at(b, now, half_life)), now)


def apply_operator_turn(level: Level, turn_at: float | None) -> Level:
    """An operator turn after the level was last raised returns it to 0."""
    if turn_at is not None and turn_at >= level.at:
        return Level(0.0, turn_at)
    return level


# ---------------------------------------------------------------- persistence


class Table:
    """Levels per recipient key; `default` applies to keys with no entry (conservative after corruption).

    `last_ring` is per box (handle): what `courier status` shows beside each box.
    """

    def __init__(
        self,
        levels: dict[str, Level] | None = None,
        last_ring: dict[str, float] | None = None,
        ring: int = 0,
        default: Level = ZERO,
    ):
        self.levels = levels if levels is not None else {}
        self.last_ring = last_ring if last_ring is not None else {}
        self.ring = ring
        self.default = default

    def get(self, key: str) -> Level:
        return self.levels.get(key, self.default)


def encode(table: Table) -> dict:
    return {
        "version": 2,
        "ring": table.ring,
        "default": {"level": table.default.value, "at": table.default.at},
        # Only keys `decode` accepts: one bad key would make the next start treat the whole file as corrupt.
        "recipients": {k: {"level": lvl.value, "at": lvl.at} for k, lvl in sorted(table.levels.items()) if valid_key(k)},
        "lastRing": dict(sorted(table.last_ring.items())),
    }


def decode(data: object, cap: int, now: float) -> tuple[Table, bool]:
    """(table, ok). Anything malformed yields the conservative table and ok=False.

    Version 1 (levels per box) is migrated: each box's level becomes a `box:` key,
    merged into its session's level when the daemon next resolves that box.
    """
    conservative = Table({}, {}, 0, Level(float(cap), now))
    if not isinstance(data, dict) or data.get("version") not in (1, 2):
        return conservative, False
    try:
        ring = data.get("ring", 0)
        if isinstance(ring, bool) or not isinstance(ring, int) or ring < 0:
            return conservative, False
        d = data.get("default") or {"level": 0.0, "at": 0.0}
        default = Level(_finite(d["level"]), _finite(d["at"]))
        levels: dict[str, Level] = {}
        last: dict[str, float] = {}
        if data["version"] == 1:
            entries = data.get("boxes", {})
            if not isinstance(entries, dict):
                return conservative, False
            for handle, entry in entries.items():
                if not _handle_key(str(handle)) or not isinstance(entry, dict):
                    return conservative, False
                levels[box_key(handle)] = Level(_finite(entry["level"]), _finite(entry["at"]))
                if entry.get("lastRing") is not None:
                    last[handle] = _finite(entry["lastRing"])
        else:
            entries, rings = data.get("recipients", {}), data.get("lastRing", {})
            if not isinstance(entries, dict) or not isinstance(rings, dict):
                return conservative, False
            for key, entry in entries.items():
                if not valid_key(key) or not isinstance(entry, dict):
                    return conservative, False
                levels[key] = Level(_finite(entry["level"]), _finite(entry["at"]))
            for handle, at in rings.items():
                if not _handle_key(str(handle)):
                    return conservative, False
                last[handle] = _finite(at)
    except (KeyError, TypeError, ValueError):
        return conservative, False
    return Table(levels, last, ring, default), True


def _finite(value: object) -> float:
    number = safeio.finite_number(value)
    if number is None or number < 0:
        raise ValueError("not a finite, non-negative number")
    return number


def load(state_dir: str, cap: int, now: float) -> tuple[Table, str | None]:
    """(table, problem). problem is None, or a reason the file was not trusted."""
    path = os.path.join(state_dir, STATE_FILE)
    try:
        data = safeio.read_json_object(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return Table(), None
    except safeio.Unsafe as exc:
        return decode(None, cap, now)[0], f"state_{exc.reason}"
    except OSError as exc:
        return decode(None, cap, now)[0], f"state_unreadable_{exc.errno}"
    table, ok = decode(data, cap, now)
    return table, None if ok else "state_invalid"


def save(state_dir: str, table: Table) -> None:
    """Atomic write; raises OSError (e.g. ENOSPC) for the caller to log."""
    safeio.write_json_atomic(os.path.join(state_dir, STATE_FILE), encode(table))


# ---------------------------------------------------------------- operator turns
#
# The file contract between the prompt hook and the daemon: the hook, seeing a
# prompt that is not courier's doorbell, writes <state>/operator-turns/<name>
# (content: the wall-clock time), named for the session (`s-<session id>`), or for the box
# (`<handle>`) when the session id cannot name a file. The daemon reads both names when it
# decides about that recipient (older hooks wrote both): a turn after the level was last
# raised resets it to 0. One write per prompt: the hook finds its box by session id, so the
# box's owner always names the session the daemon will look up.
# A file, not a socket, so the hook never waits on the daemon.


def operator_turn_names(handle: str | None, session_id: str | None) -> list[str]:
    names = []
    if session_id and valid_session_id(session_id):
        names.append(f"s-{session_id}")
    if handle and _handle_key(handle):
        names.append(handle)
    return names


def record_operator_turn(state_dir: str, handle: str | None, session_id: str | None = None,
                         now: float | None = None) -> None:
    names = operator_turn_names(handle, session_id)
    if not names:
        return
    directory = os.path.join(state_dir, OPERATOR_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    stamp = time.time() if now is None else now
    safeio.write_json_atomic(os.path.join(directory, names[0]), {"at": stamp})


def operator_turn_at(state_dir: str, handle: str | None, session_id: str | None = None) -> float | None:
    """The latest operator turn recorded for this session or box, or None."""
    return read_operator_turns(state_dir, handle, session_id)[0]


def read_operator_turns(state_dir: str, handle: str | None, session_id: str | None = None
                        ) -> tuple[float | None, list[tuple[str, str]]]:
    """(latest turn or None, [(file name, why it was not used)]) for this session's and box's files."""
    latest = None
    problems: list[tuple[str, str]] = []
    for name in operator_turn_names(handle, session_id):
        try:
            data = safeio.read_json_object(os.path.join(state_dir, OPERATOR_DIR, name), 4096)
        except FileNotFoundError:
            continue
        except safeio.Unsafe as exc:
            problems.append((name, exc.reason))
            continue
        except OSError as exc:
            problems.append((name, f"unreadable_{exc.errno}"))
            continue
        at = safeio.finite_number(data.get("at"))
        if at is None or at < 0:
            problems.append((name, "bad_at"))
        elif latest is None or at > latest:
            latest = at
    return latest, problems
