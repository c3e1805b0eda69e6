"""handle -> Target(socket, session_id, pid) or Unreachable(reason): a pure decision over snapshots.

Trust: owner.json and registry records are hostile input; they arrive here
already parsed and type-checked, and this module only compares them. It does
no I/O: the caller hands it the records it read and the live start tokens of
their pids, so every branch is tested with plain values.
Logs: nothing; the caller logs `session_unreachable` with the reason returned.
Limits: a session in another pid namespace is treated as unreachable (courier
cannot check its liveness), although Claude itself would count it present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from .mailbox import Owner
from .registry import Record, liveness_problem


@dataclass(frozen=True)
class Target:
    handle: str
    pid: int
    session_id: str
    socket_path: str
    status: str | None = None
    version: str | None = None


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
    """Decide who, if anyone, a doorbell for `handle` may ring.

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
    # owner's pid, else the most recently started.
    live.sort(key=lambda r: (r.pid != pid, -(r.started_at or 0.0), r.pid))
    chosen = live[0]
    if not chosen.socket_path:
        return Unreachable(handle, "no_socket", chosen.pid, sid)
    return Target(handle, chosen.pid, sid, chosen.socket_path, chosen.status, chosen.version)
