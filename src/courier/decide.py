"""The per-box decision, pure: given a box's state, its listing and what the world says, ring, hold or wait.

Everything courier decides about one box lives here: the outstanding wake of a
batch and its re-arm, the one re-ring of an unanswered wake, pacing per session,
the transport (the session's socket, else its waiter, else the prompt), a
receipt's verdict, and the wake cap. The caller (the dispatcher) does the I/O:
it lists the box and hands in a `World` that resolves the owner and answers the
other questions, and it carries out what is returned. No clock is read here:
`now` is the daemon's trio clock (pacing, outstanding), `wall` the wall clock
(the wake cap, which is persisted).

Trust: the listing holds names read from a directory; the target was resolved and
vetted by `resolve`. Nothing from a message reaches a decision.
Logs: one event per decision that holds mail (session_unreachable, wake_capped),
doorbell_outstanding / doorbell_rearmed / mail_seen / mail_refused about the
box's state, each only when it changes (`BoxState.last_note`).
Limits: an unanswered wake is rung once more after `outstanding_limit`, never again
until the batch is consumed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from . import registry, wakecap
from .mailbox import Listing
from .registry import SUPPORTED_PROTOCOLS
from .resolve import Target, Unreachable
from .text import escape

SOCKET = "socket"
WAITER = "waiter"
PROTOCOL_UNKNOWN = "peer_protocol_unknown"


@dataclass
class BoxState:
    """What the daemon remembers about one box between looks."""

    queued: int = 0
    batch: frozenset = frozenset()  # names queued when the outstanding wake rang
    outstanding_since: float | None = None  # trio time of that wake
    rerung: bool = False
    in_flight: bool = False
    last_note: tuple | None = None  # what we last logged about it, to log changes only
    last_reason: str | None = None  # why its mail waits for the prompt, if it does
    refused_logged: frozenset = frozenset()
    last_receipt: dict | None = None
    recipient: str | None = None  # wake-cap key of the session last resolved as its owner
    transport: str | None = None  # how the last wake travelled
    ring: int | None = None  # the number of the outstanding wake (a receipt names the ring it is about)
    failures: int = 0  # consecutive unexpected failures while handling it (box_failed)
    owner_pid: int | None = None  # from owner.json at the last look: registry changes at this pid ...
    owner_sid: str | None = None  # ... or naming this session look at the box again
    damaged: str | None = None
    seen: tuple | None = None  # (mtime_ns, inode) of the box directory at the last look, if settled


@dataclass(frozen=True)
class Policy:
    min_interval: float  # at most one wake per session per this (Claude refills one line per 2 s)
    outstanding_limit: float
    cap: int
    half_life: float
    # peerProtocol values courier has been tested against; any other value, or none, is never written to.
    supported_protocols: frozenset | None = SUPPORTED_PROTOCOLS


class Ring(NamedTuple):
    target: Target
    transport: str
    names: tuple[str, ...]
    recipient: str
    level: wakecap.Level
    socket_skipped: str | None = None  # why the socket was not used, when the waiter carries the wake


class Hold(NamedTuple):
    """Mail waits for the prompt; `retry_at` (trio time) if the decision can change by itself."""

    reason: str
    retry_at: float | None = None


class Wait(NamedTuple):
    """Nothing to do now (no mail, a wake outstanding or in flight, pacing)."""

    retry_at: float | None = None


Decision = Ring | Hold | Wait


class World(Protocol):
    def resolve(self) -> Target | Unreachable: ...
    def last_wake(self, session_id: str) -> float | None: ...
    def receipt_block(self, target: Target, now: float) -> str | None: ...
    def has_waiter(self, target: Target) -> bool: ...
    def level(self, recipient: str, target: Target, wall: float) -> wakecap.Level: ...
    def first_sight(self, session_id: str, what: str) -> bool: ...


def _note(box: BoxState, key: tuple) -> bool:
    """True if this decision differs from the last one logged for the box."""
    if box.last_note == key:
        return False
    box.last_note = key
    return True


def rearm(box: BoxState) -> None:
    """Forget the outstanding wake: the next mail rings again. The one place re-arming happens."""
    box.outstanding_since = None
    box.batch = frozenset()
    box.rerung = False
    box.last_note = None


def observe(box: BoxState, listing: Listing, now: float, policy: Policy, log) -> Wait | None:
    """Take in a fresh listing. Returns Wait if there is nothing to decide, else None."""
    new_refusals = set(listing.refused) - box.refused_logged
    if new_refusals:
        log.warning(
            "mail_refused",
            count=len(new_refusals),
            entries=[f"{escape(name, 80)} ({why})" for name, why in sorted(new_refusals)[:5]],
            reason="not a message to read (a link, a hard link, a FIFO or a directory); not rung, never opened",
        )
    box.refused_logged = frozenset(listing.refused)
    previously, box.queued = box.queued, len(listing.queued)
    if box.queued > previously:
        log.debug("mail_seen", queued=box.queued)

    if box.outstanding_since is not None:
        if not box.queued or not (box.batch & set(listing.queued)):
            # The rung batch has been delivered (into read/); the next mail rings again.
            log.info("doorbell_rearmed", queued=box.queued)
            rearm(box)
        else:
            age = now - box.outstanding_since
            if box.rerung or age < policy.outstanding_limit:
                if _note(box, ("outstanding", box.queued)):
                    log.debug("doorbell_outstanding", queued=box.queued, age_s=round(age, 3))
                return Wait(None if box.rerung else box.outstanding_since + policy.outstanding_limit)
            box.rerung = True  # one more ring for a wake nobody answered
    if not box.queued or box.in_flight:
        return Wait(None)
    return None


def choose_transport(target: Target, blocked: str | None, has_waiter: bool, policy: Policy) -> tuple[str | None, str]:
    """(transport or None, why the socket is not used). The socket when it takes the doorbell, else the waiter."""
    if target.socket_path is None:
        problem = "no_socket"
    elif policy.supported_protocols is not None and target.protocol not in policy.supported_protocols:
        problem = PROTOCOL_UNKNOWN
    elif blocked:
        problem = blocked
    else:
        return SOCKET, ""
    return (WAITER if has_waiter else None), problem


def decide(box: BoxState, listing: Listing, world: World, *, now: float, wall: float, policy: Policy, log) -> Decision:
    """One look at one box: Ring, Hold (mail waits for the prompt, logged) or Wait."""
    waiting = observe(box, listing, now, policy, log)
    if waiting is not None:
        return waiting

    target = world.resolve()
    if isinstance(target, Unreachable):
        box.last_reason = target.reason
        if _note(box, ("unreachable", target.reason, box.queued)):
            log.info("session_unreachable", reason=target.reason, pid=target.pid, session_id=target.session_id,
                     queued=box.queued, fallback="prompt")
        return Hold(target.reason)
    log = log.bind(pid=target.pid, session_id=target.session_id)

    last = world.last_wake(target.session_id)
    if last is not None and now - last < policy.min_interval:
        return Wait(last + policy.min_interval)

    transport, problem = choose_transport(target, world.receipt_block(target, now), world.has_waiter(target), policy)
    said = False
    if problem == PROTOCOL_UNKNOWN and world.first_sight(target.session_id, f"{problem}:{target.protocol!r}"):
        # Once per session, however many boxes it owns: a release speaking a protocol courier has not
        # been tested with is news for the operator, not a per-box decision.
        log.warning(PROTOCOL_UNKNOWN, reason=PROTOCOL_UNKNOWN, protocol=target.protocol, version=target.version,
                    supported=sorted(policy.supported_protocols or ()), queued=box.queued,
                    fallback=transport or "prompt", fix=registry.support(target.version, target.protocol, True)[1])
        said = True
    if transport is None:
        box.last_reason = problem
        if _note(box, ("unreachable", problem, box.queued)) and not said:
            emit = log.debug if problem == PROTOCOL_UNKNOWN else log.info  # said once for the session already
            emit("session_unreachable", reason=problem, queued=box.queued, fallback="prompt", version=target.version)
        return Hold(problem)

    # The wake cap: a brake that holds mail, never eats it; one level per recipient session.
    recipient = wakecap.recipient_key(target.session_id, target.handle)
    level = world.level(recipient, target, wall)
    if not wakecap.allowed(level, wall, policy.cap, policy.half_life):
        when = wakecap.allowed_at(level, wall, policy.cap, policy.half_life)
        box.last_reason = "wake_capped"
        if _note(box, ("capped", box.queued)):
            log.info(
                "wake_capped",
                wake_level=round(wakecap.level_at(level, wall, policy.half_life), 3),
                cap=policy.cap,
                queued=box.queued,
                allowed_at=iso(when),
                fallback="prompt",
            )
        return Hold("wake_capped", now + max(0.05, when - wall))

    box.in_flight = True
    box.recipient = recipient
    return Ring(target, transport, listing.queued, recipient, level, problem or None)


def after_ring(box: BoxState, ring: Ring, sent: bool, reason: str | None, now: float, note: tuple,
               number: int | None = None) -> None:
    """Record a ring's outcome. A sent wake makes the batch outstanding; a failed one leaves the
    mail for the prompt until the next event, registry change or rescan looks again."""
    box.in_flight = False
    box.last_note = note
    if sent:
        box.outstanding_since = now
        box.batch = frozenset(ring.names)
        box.last_reason = None
        box.transport = ring.transport
        box.ring = number
    else:
        box.last_reason = reason


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
