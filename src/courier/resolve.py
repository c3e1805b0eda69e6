"""handle -> Target(socket, session_id, pid) or Unreachable(reason): a pure decision over snapshots.

Trust: owner.json and registry records are hostile input; they arrive here
already parsed and type-checked, and `resolve` only compares them. `resolve`
does no I/O: it is handed the records and the live start tokens of their pids,
so every branch is tested with plain values. `resolve_box` is the thin I/O edge
that gathers those snapshots from disk for the daemon and for `courier status`.
Logs: nothing; the caller logs `session_unreachable` with the reason returned.
Limits: a session in another pid namespace is treated as unreachable (courier
cannot check its liveness), although Claude itself would count it present.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from . import mailbox, registry, safeio
from .mailbox import Owner
from .registry import Record, SessionIndex, liveness_problem


@dataclass(frozen=True)
class Target:
    handle: str
    pid: int
    session_id: str
    socket_path: str | None  # None: a live session with no messaging socket (the waiter may still wake it)
    version: str | None = None
    protocol: int | None = None
    weak: bool = False  # liveness judged by the pid alone (the record has no procStart)


@dataclass(frozen=True)
class Unreachable:
    handle: str
    reason: str
    pid: int | None = None
    session_id: str | None = None


def resolve(
    handle: str,
    owner: Owner | str,
    records: Iterable[Record],
    live_starts: Mapping[int, str | None],
    own_domain: str | None,
) -> Target | Unreachable:
    """Decide who, if anyone, a wake for `handle` may reach.

    `owner` is the parsed owner.json or a reason it could not be read.
    `records` are every registry record that might be the owner's session: those
    whose sessionId equals the owner's, plus the record at the owner's pid.
    `live_starts[pid]` is that pid's current start token, None if it is dead.
    """
    if isinstance(owner, str):
        return Unreachable(handle, owner)
    pid, sid = owner.pid, owner.session_id
    if owner.retired_at is not None:
        return Unreachable(handle, "retired", pid, sid)
    if owner.runtime is None or sid is None:
        return Unreachable(handle, "owner_incomplete", pid, sid)
    if owner.runtime != "claude":
        # pi and other runtimes wake themselves; the prompt path covers the rest.
        return Unreachable(handle, "runtime_not_claude", pid, sid)

    records = list(records)
    mine = [r for r in records if r.session_id == sid]
    if not mine:
        at_pid = [r for r in records if r.pid == pid]
        if at_pid and liveness_problem(at_pid[0], live_starts.get(pid), own_domain) is None:
            # Same live process, another conversation: a /clear or resume re-minted the id.
            return Unreachable(handle, "session_replaced", pid, sid)
        return Unreachable(handle, "no_record", pid, sid)

    problems: dict[int, str] = {}
    live: list[Record] = []
    for r in mine:
        problem = liveness_problem(r, live_starts.get(r.pid), own_domain)
        if problem is None and r.spare:
            problem = "spare"
        if problem is None and r.parked:
            problem = "parked"
        if problem is None:
            live.append(r)
        else:
            problems[r.pid] = problem
    if not live:
        # Report the owner's own record if it is among them: that is the one an operator expects.
        first = next((r for r in mine if r.pid == pid), mine[0])
        return Unreachable(handle, problems[first.pid], first.pid, sid)

    # Two live records for one session (a resume in a second terminal): prefer the
    # owner's pid, then records with a socket, then the most recently started.
    live.sort(key=lambda r: (r.pid != pid, r.socket_path is None, -(r.started_at or 0.0), r.pid))
    chosen = live[0]
    return Target(handle, chosen.pid, sid, chosen.socket_path, chosen.version, chosen.peer_protocol,
                  registry.weak_evidence(chosen))


def read_owner_or_reason(root: Path, handle: str) -> Owner | str:
    """owner.json of a box, or the reason it cannot be used (never raises on bad input)."""
    try:
        return mailbox.read_owner(mailbox.box_dir(root, handle))
    except FileNotFoundError:
        return "owner_missing"
    except safeio.Unsafe as exc:
        return f"owner_{exc.reason}"
    except mailbox.Damaged as exc:
        return exc.reason
    except OSError as exc:
        return f"owner_unreadable_{errno.errorcode.get(exc.errno or 0, 'oserror').lower()}"


def resolve_box(
    mail_root: Path, registry_dir: Path, handle: str, index: SessionIndex, own_domain: str | None,
    owner: Owner | str | None = None,
) -> tuple[Owner | None, Target | Unreachable]:
    """Read the box's owner (unless given) and the candidate records, then decide. Never raises on bad input.

    A torn record is re-read once after 25 ms (Claude writes records in place); that
    short sleep is the only blocking this does, and only on a torn read.
    """
    if owner is None:
        owner = read_owner_or_reason(mail_root, handle)
    if isinstance(owner, str):
        return None, Unreachable(handle, owner)
    names = index.names_for(owner.session_id, owner.pid)
    records, problems = registry.candidate_records(registry_dir, names)
    live = {r.pid: registry.live_start_of(r.pid) for r in records}
    result = resolve(handle, owner, records, live, own_domain)
    if isinstance(result, Unreachable) and result.reason == "no_record" and owner.pid in problems:
        # Say what was wrong with the owner's record rather than just "none".
        result = Unreachable(handle, problems[owner.pid], owner.pid, owner.session_id)
    return owner, result
