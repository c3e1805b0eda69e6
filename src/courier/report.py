"""What an operator sees: one row per box, resolved the same way the daemon resolves it.

Trust: reads the mail root, the registry and courier's state dir; writes nothing.
Owner fields shown are one bounded line each; nothing from a message is read.
Logs: nothing (prints through the CLI).
Limits: `outstanding` and the last receipt come from the running daemon's
status snapshot, which it writes at most once a second.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from . import mailbox, registry, resolve, state, waiters, wakecap
from .config import Config
from .resolve import Target, Unreachable
from .text import one_line


@dataclass
class Row:
    root: str
    retired: bool
    handle: str
    runtime: str | None
    owner_pid: int | None
    session_id: str | None
    reachable: bool
    reason: str | None
    socket: str | None
    queued: int
    refused: int
    outstanding: bool
    wake_level: float
    last_ring: float | None
    last_reason: str | None
    last_receipt: dict | None
    version: str | None = None  # the owner session's Claude Code version, from its registry record
    supported: bool | None = None  # whether courier can ring that version's socket
    waiter: bool = False  # a courier waiter (Stop hook) serves the owner session
    transport: str | None = None  # how the last wake travelled (socket or waiter)


def resolve_with_owner(cfg: Config, root, handle: str, index) -> tuple[mailbox.Owner | None, Target | Unreachable]:
    """As the daemon resolves it, plus the socket vetting the daemon does right before a poke."""
    owner, result = resolve.resolve_box(root, cfg.registry_dir, handle, index, registry.own_pid_domain())
    return owner, reachable(result)


def reachable(result: Target | Unreachable) -> Target | Unreachable:
    """A Target only if courier would write to its socket now."""
    if not isinstance(result, Target):
        return result
    problem = None
    if result.socket_path is None:
        problem = "no_socket"
    elif result.protocol not in registry.SUPPORTED_PROTOCOLS:
        problem = "peer_protocol_unknown"
    else:
        problem = registry.vet_socket(result.socket_path)
    return Unreachable(result.handle, problem, result.pid, result.session_id) if problem else result


def rows(cfg: Config, handles: list[str] | None = None, status: dict | None = None) -> list[Row]:
    """One row per box of every mail root the daemon serves (only `handles`, if given). `status`: the
    daemon's snapshot if the caller has read it already (it can be megabytes), else it is read here."""
    index = registry.SessionIndex.build(cfg.registry_dir)
    table, _problem = wakecap.load(cfg.state_dir, cfg.wake_cap, time.time())
    snap = (state.read_status(cfg.state_dir) if status is None else status).get("boxes", {})
    if not isinstance(snap, dict):
        snap = {}
    out: list[Row] = []
    for root in cfg.mail_roots:
        if handles is None:
            try:
                names, _skipped = mailbox.list_handles(root)
            except OSError:
                names = []
        else:
            names = [h for h in handles if (root / h).is_dir()]
        out.extend(_root_rows(cfg, root, names, index, table, snap))
    return out


def _root_rows(cfg: Config, root, handles, index, table, snap) -> list[Row]:
    now = time.time()
    out = []
    for handle in handles:
        box = mailbox.box_dir(root, handle)
        try:
            listing = mailbox.list_box(box)
        except (OSError, mailbox.Damaged):
            continue
        owner, target = resolve.resolve_box(root, cfg.registry_dir, handle, index, registry.own_pid_domain())
        result = reachable(target)
        live = target if isinstance(target, Target) else None
        runtime, opid, sid = (owner.runtime, owner.pid, owner.session_id) if owner else (None, None, None)
        key = wakecap.recipient_key(sid, handle)
        level = table.get(key)
        if key not in table.levels and wakecap.box_key(handle) in table.levels:
            level = table.levels[wakecap.box_key(handle)]  # not yet migrated by the daemon
        level = wakecap.apply_operator_turn(level, wakecap.operator_turn_at(cfg.state_dir, handle, sid))
        info = snap.get(str(box)) if isinstance(snap.get(str(box)), dict) else {}
        retired = bool(owner and owner.retired_at is not None)
        out.append(
            Row(
                root=str(root),
                retired=retired,
                handle=handle,
                runtime=_line(runtime, 16),
                owner_pid=opid,
                session_id=_line(sid, 64),
                reachable=isinstance(result, Target),
                reason=None if isinstance(result, Target) else result.reason,
                socket=result.socket_path if isinstance(result, Target) else None,
                queued=len(listing.queued),
                refused=len(listing.refused),
                outstanding=bool(info.get("outstandingSince")),
                wake_level=round(wakecap.level_at(level, now, cfg.wake_half_life_s), 3),
                last_ring=table.last_ring.get(handle),
                last_reason=_line(info.get("lastReason"), 64),
                last_receipt=info.get("lastReceipt") if isinstance(info.get("lastReceipt"), dict) else None,
                version=_line(live.version, 24) if live else None,
                waiter=bool(live) and waiters.has_waiter(cfg.state_dir, live.session_id, registry_dir=cfg.registry_dir,
                                                         pid=live.pid),
                transport=_line(info.get("transport"), 16),
                supported=registry.support(live.version, live.protocol, live.socket_path is not None)[0] if live else None,
            )
        )
    return out


def _line(value, limit: int):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return one_line(value, limit, None) if isinstance(value, str) else None


def _ago(ts: float | None, now: float) -> str:
    if not ts:
        return "-"
    delta = max(0, now - ts)
    if delta < 120:
        return f"{delta:.0f}s ago"
    if delta < 7200:
        return f"{delta / 60:.0f}m ago"
    return f"{delta / 3600:.1f}h ago"


def watcher_of(status: dict) -> dict:
    """What the running daemon said about its watcher, from its status snapshot."""
    info = status.get("watcher")
    return info if isinstance(info, dict) else {}


def render(rows_: list[Row], daemon_pid: int | None, as_json: bool, watcher: dict | None = None) -> str:
    now = time.time()
    waiting = sum(1 for r in rows_ if r.queued)
    reachable = sum(1 for r in rows_ if r.reachable)
    if as_json:
        return json.dumps(
            {
                "daemon": {"running": daemon_pid is not None, "pid": daemon_pid, "watcher": watcher or {}},
                "summary": {"boxes": len(rows_), "withMail": waiting, "reachable": reachable},
                "boxes": [asdict(r) for r in rows_],
            },
            indent=2,
        )
    lines = [
        f"{'HANDLE':<28} {'RUNTIME':<7} {'PID':>7} {'SESSION':<10} {'REACH':<22} {'QUEUED':>6} "
        f"{'RUNG':<4} {'LEVEL':>5} {'LAST RING':<10} {'CLAUDE':<9} RECEIPT"
    ]
    roots = sorted({r.root for r in rows_})
    current = None
    for r in sorted(rows_, key=lambda r: (r.root, r.handle)) if len(roots) > 1 else rows_:
        if len(roots) > 1 and r.root != current:
            current = r.root
            lines.append(f"# {current}")
        if r.retired and r.queued:
            reach = f"retired, {r.queued} unread"  # pi retires its box at shutdown even with mail queued
        else:
            reach = "ok" if r.reachable else "waiter" if r.waiter else (r.reason or "?")
        receipt = "-"
        if r.last_receipt:
            receipt = f"{r.last_receipt.get('status')} {_ago(r.last_receipt.get('at'), now)}"
            hint = r.last_receipt.get("hint")
            if hint:
                receipt += f" — {hint}"
        lines.append(
            f"{r.handle[:28]:<28} {(r.runtime or '-')[:7]:<7} {r.owner_pid or '-':>7} "
            f"{(r.session_id or '-')[:8]:<10} {reach[:22]:<22} {r.queued:>6} "
            f"{'yes' if r.outstanding else 'no':<4} {r.wake_level:>5.2f} {_ago(r.last_ring, now):<10} "
            f"{(r.version or '-')[:8] + ('' if r.supported is not False else '!'):<9} {receipt}"
        )
    if daemon_pid:
        name = _line((watcher or {}).get("watcher"), 16)
        daemon = f"running (pid {daemon_pid}" + (f", watcher {name})" if name else ")")
    else:
        daemon = "NOT running"
    lines.append(f"{len(rows_)} boxes, {waiting} with mail, {reachable} reachable; daemon {daemon}")
    return "\n".join(lines)
