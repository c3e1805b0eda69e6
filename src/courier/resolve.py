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

from dataclasses import dataclass
import errno
from pathlib import Path
from typing import Iterable, Mapping

from . import mailbox, registry
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


def resolve_box(
    mail_root: Path, registry_dir: Path, handle: str, index: Mapping[str, list[int]], own_domain: str | None
) -> tuple[Owner | None, Target | Unreachable]:
    """Read the box's owner and the candidate records, then decide. Never raises on bad input.

    A torn record is re-read once after 25 ms (Claude writes records in place); that
    short sleep is the only blocking this does, and only on a torn read.
    """
    try:
        owner = mailbox.read_owner(mailbox.box_dir(mail_root, handle))
    except FileNotFoundError:
        return None, Unreachable(handle, "owner_missing")
    except mailbox.Unsafe as exc:
        return None, Unreachable(handle, f"owner_{exc.reason}")
    except OSError as exc:
        return None, Unreachable(handle, f"owner_unreadable_{errno.errorcode.get(exc.errno or 0, 'oserror')}")
    pids = {owner.pid} if owner.pid else set()
    pids.update(index.get(owner.session_id or "", ()))
    records, problems = registry.candidate_records(registry_dir, pids)
    live = {r.pid: registry.live_start_of(r) for r in records}
    result = resolve(handle, owner, records, live, own_domain)
    if isinstance(result, Unreachable) and result.reason == "no_record" and owner.pid in problems:
        # Say what was wrong with the owner's record rather than just "none".
        result = Unreachable(handle, problems[owner.pid], owner.pid, owner.session_id)
    return owner, result
