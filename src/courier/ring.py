"""Carry out a Ring decision: stamp it, send it by its transport, count the wake, log what happened.

Transports: `socket` (the session's messaging socket, through `poke`) and `waiter`
(the session's own Stop-hook waiter, through `waiters`). Whichever carries it, a
wake is counted once against the recipient's wake cap.

Trust: the line and the waiter's signal are built from courier's own values only
(doorbell.compose); no message byte reaches either.
Logs: poke_sent, poke_failed, poke_delivered (inferred: the session turned busy).
Limits: a sent wake is a hand-off, never a delivery; the box re-arms when its mail
is consumed.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import trio

from . import decide, doorbell, mailbox, registry
from .poke import poke
from .state import StateStore

INFER_AFTER_S = 3.0


class Outcome(NamedTuple):
    sent: bool
    reason: str | None
    ring: int


class Ringer:
    def __init__(self, store: StateStore, log, *, registry_dir, poke_timeout: float,
                 receipts=None, receipt_server=None, waiters=None, nursery=None):
        self.store = store
        self.log = log
        self.registry_dir = registry_dir
        self.poke_timeout = poke_timeout
        self.receipts = receipts
        self.receipt_server = receipt_server
        self.waiters = waiters
        self.nursery = nursery  # for the short "did it turn busy?" look after a poke
        self.stats = {"pokes": 0, "fallbacks": 0, "capped": 0}

    async def ring(self, box_id, decision: decide.Ring, log) -> Outcome:
        root, handle = box_id
        target = decision.target
        number = self.store.next_ring()
        box_path = str(mailbox.box_dir(root, handle))
        msg_id = doorbell.new_msg_id()
        if decision.transport == decide.WAITER:
            result = await self.waiters.wake(target.session_id, ring=number, queued=len(decision.names),
                                             box=box_path, timeout=self.poke_timeout, pid=target.pid)
        else:
            from_addr = self.receipt_server.address_for(target.socket_path) if self.receipt_server else None
            line = doorbell.compose(ring=number, queued=len(decision.names), box=box_path,
                                    session_id=target.session_id, msg_id=msg_id, from_addr=from_addr)
            if self.receipts is not None:
                # Before the write: Claude sends a held receipt as soon as it has read the line,
                # often before our poke has seen EOF (measured: 0.5-2 ms after the write).
                self.receipts.track(msg_id, box_id, handle, target.session_id, target.pid, number,
                                    trio.current_time())
            result = await poke(target.socket_path, line, expected_pid=target.pid, timeout=self.poke_timeout)
            if not result.sent and self.receipts is not None:
                self.receipts.untrack(msg_id)
        if not result.sent:
            self.stats["fallbacks"] += 1
            log.info(
                "poke_failed",
                ring=number,
                transport=decision.transport,
                reason=result.reason,
                errno=result.errno,
                socket=target.socket_path if decision.transport == decide.SOCKET else None,
                latency_ms=round(result.latency_ms, 3),
                fallback="prompt",
            )
            return Outcome(False, result.reason, number)
        wall = time.time()
        level = self.store.woke(decision.recipient, handle, decision.level, wall)
        self.stats["pokes"] += 1
        if self.receipts is not None and decision.transport == decide.SOCKET and self.nursery is not None:
            self.nursery.start_soon(self._infer, msg_id, target, handle, number)
        log.info(
            "poke_sent",
            ring=number,
            transport=decision.transport,
            queued=len(decision.names),
            latency_ms=round(result.latency_ms, 3),
            write_ms=round(result.write_ms, 3) if result.write_ms is not None else None,
            wake_level=round(level.value, 3),
            note=result.reason,
            msg_id=msg_id if decision.transport == decide.SOCKET else None,
            socket_skipped=decision.socket_skipped,
            weak_liveness=True if target.weak else None,
        )
        return Outcome(True, None, number)

    async def _infer(self, msg_id: str, target, handle: str, number: int) -> None:
        """No receipt within a few seconds and the session turned busy: delivered (inferred)."""
        await trio.sleep(INFER_AFTER_S)
        if self.receipts is None or msg_id not in self.receipts.pending:
            return  # a receipt came: it said what happened
        if self.receipts.blocked(target.session_id, target.pid, trio.current_time()):
            return  # held: a turn now is the waiter's wake or the person's, not this doorbell's
        try:
            rec = registry.read_record_once(self.registry_dir, f"{target.pid}.json")
        except (OSError, registry.BadRecord):
            return
        if rec.session_id == target.session_id and rec.status == "busy":
            self.log.info("poke_delivered", handle=handle, pid=target.pid, session_id=target.session_id,
                          ring=number, inferred=True)
