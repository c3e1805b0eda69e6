"""Claude Code's delivery receipts, the bookkeeping: what we sent, what came back, and what it means.

A socket write is a hand-off, never a delivery. A session that holds our
doorbell (bypass mode without `crossSessionInbound: "accept"`), denies, refuses
or drops it says so with a `peer_message_status` line sent to the poke's `from`
address (served by `receipt_server`). This module turns such a line into a
verdict about the session and into effects for the dispatcher to apply; it
changes no daemon state itself.

Trust: a line is hostile until it matches a poke we sent (its `orig_msg_id`) and
comes from that poke's session pid (SO_PEERCRED). Every string from a peer is
escaped before it is logged. Every table here is bounded.
Logs: poke_receipt, session_holds_doorbells, receipt_rejected, peer_reply_ignored.
Limits: a receipt for a poke older than the pending table's bound is ignored.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import NamedTuple

from . import safeio
from .text import escape

STATUSES = {"held", "delivered", "denied", "expired", "refused", "dropped"}
PENDING_MAX = 10_000
DROPPED_IDS_MAX = 256  # Claude's own bound on one batched dropped receipt
PENDING_TTL_S = 3600.0  # a held doorbell can be denied by a person much later; not an hour later
BLOCKS_MAX = 10_000
HOLD_HINT = 'set "crossSessionInbound": "accept" in its settings (courier spawn-settings)'
HOLD_FIX = (
    'add "crossSessionInbound": "accept" to the session\'s user settings, or spawn it with '
    "`claude --settings $(courier spawn-settings)`"
)


class Pending(NamedTuple):
    box: tuple  # the dispatcher's box id
    handle: str
    session_id: str
    pid: int
    ring: int
    at: float
    batch: int = 0  # the box's batch when it rang: a late receipt of an earlier batch retries nothing


class Note(NamedTuple):
    """Record this receipt on the box (status shows it)."""

    box: tuple
    receipt: dict


class Retry(NamedTuple):
    """If the box's outstanding wake is still ring `ring`: forget it and look again at `at`, and take
    the wake back off its recipient's level (a held or dropped doorbell woke nobody). A receipt about
    an earlier ring says nothing about the wake outstanding now."""

    box: tuple
    at: float
    ring: int


class Receipts:
    def __init__(self, log, *, refused_backoff_s: float = 1800.0, retry_after_s: float = 2.0):
        self.log = log
        self.refused_backoff_s = refused_backoff_s
        self.retry_after_s = retry_after_s
        self.pending: OrderedDict[str, Pending] = OrderedDict()
        # (session_id, pid) -> (reason, until daemon time or None)
        self.blocks: OrderedDict[tuple[str, int], tuple[str, float | None]] = OrderedDict()
        self.warned_held: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.retried: set[tuple] = set()  # boxes whose dropped doorbell was already retried once
        self.batches: dict[tuple, int] = {}  # box -> how many batches it has had read (rearmed)

    # ------------------------------------------------------------ what we sent

    def track(self, msg_id: str, box: tuple, handle: str, session_id: str, pid: int, ring: int, now: float) -> None:
        self.pending[msg_id] = Pending(box, handle, session_id, pid, ring, now, self.batches.get(box, 0))
        while self.pending and (
            len(self.pending) > PENDING_MAX or now - next(iter(self.pending.values())).at > PENDING_TTL_S
        ):
            self.pending.popitem(last=False)

    def untrack(self, msg_id: str) -> None:
        """The write failed: nothing reached the session, so no receipt can be about it."""
        self.pending.pop(msg_id, None)

    def rearmed(self, box: tuple) -> None:
        self.retried.discard(box)
        self.batches[box] = self.batches.get(box, 0) + 1

    def forget_box(self, box: tuple) -> None:
        self.retried.discard(box)
        self.batches.pop(box, None)

    # ------------------------------------------------------------ what came back

    def on_line(self, line: bytes, peer_pid: int | None, now: float, log=None) -> list:
        """One line from a peer; returns effects (Note, Retry) for the dispatcher. Never raises on bad input.

        `log` is the peer's log budget (receipt_server); default: this module's logger."""
        log = log or self.log
        if not line.strip():
            return []
        try:
            data = safeio.loads(line)
        except safeio.Unsafe as exc:
            log.info("peer_reply_ignored", peer_pid=peer_pid, reason=exc.reason)
            return []
        if not (
            isinstance(data, dict) and data.get("type") == "control" and data.get("action") == "peer_message_status"
        ):
            kind = data.get("type") if isinstance(data, dict) else None
            log.info("peer_reply_ignored", peer_pid=peer_pid, reason="not_a_receipt", kind=escape(kind, 32))
            return []
        status = data.get("status")
        if status == "expired" and data.get("status_detail") == "refused":
            status = "refused"
        ids = [data.get("orig_msg_id")]
        if status == "dropped" and isinstance(data.get("dropped_msg_ids"), list):
            # Claude batches the later drops of one sender into one receipt (after 5 s, up to 256 ids).
            ids += data["dropped_msg_ids"][:DROPPED_IDS_MAX]
        matched = {i: self.pending[i] for i in ids if isinstance(i, str) and i in self.pending}
        if status not in STATUSES or not matched:
            log.info("peer_reply_ignored", peer_pid=peer_pid, reason="unknown_receipt", status=escape(status, 32))
            return []
        effects: list = []
        for msg_id, pending in matched.items():
            if peer_pid is not None and peer_pid != pending.pid:
                log.warning("receipt_rejected", reason="peer_pid_mismatch", peer_pid=peer_pid, handle=pending.handle)
                continue
            effects += self._apply(pending, msg_id, status, data, now, log)
        return effects

    def _apply(self, p: Pending, msg_id: str, status: str, data: dict, now: float, log) -> list:
        reason = escape(data["reason"], 200) if isinstance(data.get("reason"), str) else ""
        drop = escape(data["drop_reason"], 64) if isinstance(data.get("drop_reason"), str) else None
        key = (p.session_id, p.pid)
        log = log.bind(handle=p.handle, pid=p.pid, session_id=p.session_id)
        log.info("poke_receipt", status=status, reason=reason, drop_reason=drop, ring=p.ring)
        effects: list = []
        hint = None
        if status == "held":
            self._block(key, "held", None)
            hint = HOLD_HINT
            # Look again at once: the transport choice now skips the socket, so a waiter (if the
            # session has one) carries the same batch; without one the mail is held for the prompt.
            effects.append(Retry(p.box, now, p.ring))
            if key not in self.warned_held:
                self.warned_held[key] = None
                while len(self.warned_held) > BLOCKS_MAX:
                    self.warned_held.popitem(last=False)
                log.warning("session_holds_doorbells", fix=HOLD_FIX)
        elif status in ("denied", "refused"):
            self._block(key, status, now + self.refused_backoff_s)
            self.pending.pop(msg_id, None)
        elif status in ("delivered", "expired"):
            self.blocks.pop(key, None)
            self.pending.pop(msg_id, None)
        elif status == "dropped":
            self.pending.pop(msg_id, None)
            if p.box not in self.retried and p.batch == self.batches.get(p.box, 0):
                # One retry, with a new ring text, after the pacing window.
                self.retried.add(p.box)
                effects.append(Retry(p.box, now + self.retry_after_s, p.ring))
        effects.append(Note(p.box, {"status": status, "reason": drop or reason[:120], "at": time.time(), "hint": hint}))
        return effects

    def _block(self, key: tuple[str, int], reason: str, until: float | None) -> None:
        self.blocks[key] = (reason, until)
        self.blocks.move_to_end(key)
        while len(self.blocks) > BLOCKS_MAX:
            self.blocks.popitem(last=False)

    # ------------------------------------------------------------ verdicts

    def blocked(self, session_id: str, pid: int, now: float) -> str | None:
        """`receipt_<status>` if this session told us it holds or refuses our doorbells, else None."""
        key = (session_id, pid)
        entry = self.blocks.get(key)
        if entry is None:
            return None
        reason, until = entry
        if until is not None and now >= until:
            del self.blocks[key]
            return None
        return f"receipt_{reason}"

    def sizes(self) -> dict:
        return {"pending": len(self.pending), "blocks": len(self.blocks), "warned": len(self.warned_held),
                "retried": len(self.retried), "batches": len(self.batches)}
