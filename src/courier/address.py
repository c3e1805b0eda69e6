"""Addresses for sessions: a handle, a directory (or its git worktree root), or a session-id prefix -> boxes.

`resolve_target(target, directory)` is the one definition of what a TARGET names,
shared by `courier send`, `courier who` and the Python API (two copies of a key
function drift while both ends look healthy). Rules, tried in this order:

1. handle: a box of exactly that name (any owner state; a retired box is reported
   as `retired`, with the live box of the same session, else of the same cwd);
2. path (contains "/" or starts with "." or "~"): the live, unretired boxes whose
   owner's cwd is that directory ("cwd"), else is its git worktree root ("worktree
   root"); both sides normalised: `~` expanded, made absolute, symlinks resolved,
   no trailing separator, and case-folded (NFC, casefold) where the file system
   looks names up without regard to case;
3. session-id prefix of at least 6 characters: the live, unretired boxes whose
   owner's sessionId starts with it (case-insensitively).

"live": for a `claude` owner, a registry record naming the owner's sessionId whose
process Claude's own rule judges alive (so a /clear-ed and re-claimed box resolves
to whoever holds it now, and a ghost of the old id does not); for other runtimes
(pi), the owner's pid is alive. Several matches are returned as they are: `send`
refuses them without --all, `who` lists them.

Trust: owner.json (cwd, sessionId, runtime) and registry records are hostile input
from any same-user process. They are compared and stat'ed, never opened for
writing, and no path to write is built from them (a box is written by its own
validated directory name). Strings from them are escaped (`text.escape`) wherever
they are shown to a person. git is never run: a worktree root is the nearest
ancestor holding a `.git` entry (a directory: a main checkout; a file: a linked
worktree or submodule).
Logs: nothing; `courier who` prints.
Limits: liveness is judged at one instant and may change before mail is read. Case
folding is detected per path by looking up the case-swapped name of one existing
component, so a file system that folds only some characters is compared as fully
folding. An owner cwd that no longer exists is compared by its text after resolving
whatever part of it still exists.
"""

from __future__ import annotations

import difflib
import os
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import mailbox, registry, resolve
from .resolve import Target, Unreachable
from .text import escape

MIN_PREFIX = 6
MAX_TARGET = 4096
MAX_DEPTH = 256  # directory levels walked up to find a .git entry

RULE_HANDLE = "handle"
RULE_CWD = "cwd"
RULE_WORKTREE = "worktree root"
RULE_PREFIX = "session-id prefix"
RULE_NEW = "new box"  # `send --create` only: a valid handle that has no box yet

LIVE, DEAD, RETIRED, UNOWNED = "live", "dead", "retired", "unowned"
WAKE_SOCKET = "socket"  # courier's daemon rings the session's messaging socket
WAKE_WAITER = "waiter"  # a courier waiter inside the session wakes it
WAKE_PROMPT = "prompt only"  # shown at the session's next prompt, nothing wakes it
WAKE_SELF = "self"  # pi watches its own box
WAKE_NONE = "none"  # nobody lives there now


@dataclass(frozen=True)
class Box:
    """One box as an address: who owns it, whether they live, how they can be woken, what waits."""

    handle: str
    runtime: str | None
    pid: int | None
    session_id: str | None
    cwd: str | None
    state: str  # live, dead, retired, unowned (owner.json missing or unusable)
    reason: str | None  # why not live, or why a live session cannot be rung
    wake: str
    queued: int

    @property
    def live(self) -> bool:
        return self.state == LIVE

    def as_json(self) -> dict:
        return {
            "handle": self.handle,
            "runtime": self.runtime,
            "pid": self.pid,
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "state": self.state,
            "live": self.live,
            "reason": self.reason,
            "wake": self.wake,
            "queued": self.queued,
        }


@dataclass(frozen=True)
class Resolution:
    target: str
    rule: str | None = None
    matches: tuple[Box, ...] = ()
    where: str | None = None  # for a path: the normalised directory it was compared as
    problem: str | None = None  # None, "invalid", "no_match" or "retired"
    detail: str | None = None  # for "invalid": why, in words
    candidates: tuple[Box, ...] = ()  # for "no_match": the closest live boxes
    gone: tuple[Box, ...] = ()  # boxes that would have matched but nobody lives there now
    instead: tuple[Box, ...] = ()  # for "retired": live boxes of its session, else of its cwd
    creatable: bool = False  # a valid handle with no box (`send --create` may make one)

    @property
    def handles(self) -> list[str]:
        return [b.handle for b in self.matches]


# ---------------------------------------------------------------- waking


def waiter_available(state_dir: Path | None, session_id: str) -> bool:
    """Whether a courier waiter is parked in this session (courier.waiters, when that module exists)."""
    if state_dir is None:
        return False
    try:
        from . import waiters  # built separately; absent means no session has a waiter
    except ImportError:
        return False
    try:
        return bool(waiters.has_waiter(state_dir, session_id))
    except (OSError, ValueError, TypeError, AttributeError):
        return False


# ---------------------------------------------------------------- paths


def is_path(target: str) -> bool:
    return "/" in target or target.startswith((".", "~"))


def fs_folds_case(path: str) -> bool:
    """Whether the file system holding `path` looks names up without regard to case.

    Probes the nearest existing component whose name has cased letters: if its
    case-swapped twin is the same file, lookups fold case. Nothing to probe -> False.
    """
    p = path
    for _ in range(MAX_DEPTH):
        parent, name = os.path.split(p)
        if not name or parent == p:
            return False
        swapped = name.swapcase()
        if swapped != name:
            try:
                st = os.lstat(p)
            except (OSError, ValueError):
                p = parent
                continue
            try:
                return os.path.samestat(st, os.lstat(os.path.join(parent, swapped)))
            except (OSError, ValueError):
                return False
        p = parent
    return False


def worktree_root(real: str) -> str | None:
    """The nearest ancestor of `real` (itself included) holding a `.git` entry, or None."""
    p = real
    for _ in range(MAX_DEPTH):
        try:
            os.lstat(os.path.join(p, ".git"))
            return p
        except (OSError, ValueError):
            pass
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    return None


def real_dir(path: str) -> str | None:
    """realpath, and the parent when it names an existing non-directory; None for unusable text."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):  # NUL in the text; a loop is returned as is by realpath
        return None
    if os.path.exists(real) and not os.path.isdir(real):
        real = os.path.dirname(real)
    return real.rstrip(os.sep) or os.sep


class _Keys:
    """Normalised path keys, with the case probe cached per directory."""

    def __init__(self, folds_case: Callable[[str], bool]):
        self.folds_case = folds_case
        self._folds: dict[str, bool] = {}

    def key(self, real: str) -> str:
        folds = self._folds.get(real)
        if folds is None:
            folds = self._folds[real] = bool(self.folds_case(real))
        return unicodedata.normalize("NFC", real).casefold() if folds else real


# ---------------------------------------------------------------- the directory of boxes


class Directory:
    """The boxes under one mail root as addresses; each owner read and judged at most once."""

    def __init__(
        self,
        mail_root: Path,
        registry_dir: Path,
        state_dir: Path | None = None,
        *,
        cwd: str | None = None,
        folds_case: Callable[[str], bool] | None = None,
        has_waiter: Callable[[str], bool] | None = None,
    ):
        self.mail_root = Path(mail_root)
        self.registry_dir = Path(registry_dir)
        self.state_dir = state_dir
        self.cwd = cwd
        self._keys = _Keys(folds_case or fs_folds_case)
        self._has_waiter = has_waiter or (lambda sid: waiter_available(state_dir, sid))
        self._index: registry.SessionIndex | None = None
        self._owners: dict[str, mailbox.Owner | str] = {}
        self._boxes: dict[str, Box | None] = {}
        self._handles: list[str] | None = None
        self._own_domain = registry.own_pid_domain()

    @classmethod
    def from_config(cls, cfg, **kw) -> Directory:
        return cls(cfg.mail_root, cfg.registry_dir, cfg.state_dir, **kw)

    # -- reading

    def handles(self) -> list[str]:
        if self._handles is None:
            try:
                self._handles, _skipped = mailbox.list_handles(self.mail_root)
            except OSError:
                self._handles = []
        return self._handles

    def owner(self, handle: str) -> mailbox.Owner | str:
        if handle not in self._owners:
            self._owners[handle] = resolve.read_owner_or_reason(self.mail_root, handle)
        return self._owners[handle]

    def index(self) -> registry.SessionIndex:
        if self._index is None:
            self._index = registry.SessionIndex.build(self.registry_dir)
        return self._index

    def get(self, handle: str) -> Box | None:
        """The box of this exact handle, or None if there is no such box (a symlink counts, as damaged)."""
        if handle in self._boxes:
            return self._boxes[handle]
        box = None
        if mailbox.valid_handle(handle) and os.path.lexists(self.mail_root / handle):
            box = self._judge(handle)
        self._boxes[handle] = box
        return box

    def all(self) -> list[Box]:
        return [b for b in (self.get(h) for h in self.handles()) if b is not None]

    def handle_of_session(self, session_id: str) -> str | None:
        """The unretired box this session claimed (owners only; no liveness needed)."""
        for handle in self.handles():
            owner = self.owner(handle)
            if isinstance(owner, mailbox.Owner) and owner.session_id == session_id and owner.retired_at is None:
                return handle
        return None

    def _judge(self, handle: str) -> Box:
        try:
            queued = len(mailbox.list_box(self.mail_root / handle).queued)
        except (OSError, mailbox.Damaged):
            queued = 0
        owner = self.owner(handle)
        if isinstance(owner, str):
            return Box(handle, None, None, None, None, UNOWNED, owner, WAKE_NONE, queued)
        state, reason, wake = self._liveness(handle, owner)
        return Box(handle, owner.runtime, owner.pid, owner.session_id, owner.cwd, state, reason, wake, queued)

    def _liveness(self, handle: str, owner: mailbox.Owner) -> tuple[str, str | None, str]:
        if owner.retired_at is not None:
            return RETIRED, "retired", WAKE_NONE
        pid, sid = owner.pid, owner.session_id
        if owner.runtime != "claude":
            # pi (and any other runtime) is judged by its pid, as helm's reap does.
            if pid is not None and registry.pid_exists(pid):
                return LIVE, None, WAKE_SELF if owner.runtime == "pi" else WAKE_PROMPT
            return DEAD, "pid_dead", WAKE_NONE
        records, problems = registry.candidate_records(self.registry_dir, self.index().names_for(sid, pid))
        starts = {r.pid: registry.live_start_of(r.pid) for r in records}
        if sid is None:
            live = pid is not None and registry.pid_exists(pid)  # helm keeps an id-less owner while its pid lives
        else:
            live = any(r.session_id == sid and registry.liveness_problem(r, starts.get(r.pid), self._own_domain)
                       is None for r in records)
        result = resolve.resolve(handle, owner, records, starts, self._own_domain)
        if not live:
            reason = result.reason if isinstance(result, Unreachable) else "pid_dead"
            if reason == "no_record" and pid in problems:
                reason = problems[pid]
            return DEAD, reason, WAKE_NONE
        if isinstance(result, Target):
            reason = "no_socket" if result.socket_path is None else registry.vet_socket(result.socket_path)
            if reason is None:
                return LIVE, None, WAKE_SOCKET
        else:
            reason = result.reason
        if sid and self._has_waiter(sid):
            return LIVE, reason, WAKE_WAITER
        return LIVE, reason, WAKE_PROMPT

    # -- paths

    def path_where(self, target: str) -> str | None:
        """The directory a path target names, absolute and with symlinks resolved (not yet case-folded)."""
        expanded = os.path.expanduser(target)
        if not os.path.isabs(expanded):
            expanded = os.path.join(self.cwd or os.getcwd(), expanded)
        return real_dir(expanded)

    def cwd_key(self, box: Box) -> str | None:
        if not box.cwd or not os.path.isabs(box.cwd):
            return None
        real = real_dir(box.cwd)
        return None if real is None else self._keys.key(real)


# ---------------------------------------------------------------- the one resolution


def target_problem(target: object) -> str | None:
    if not isinstance(target, str) or not target.strip():
        return "the target is empty"
    if len(target) > MAX_TARGET:
        return f"the target is longer than {MAX_TARGET} characters"
    if any(c in target for c in "\x00\n\r"):
        return "the target contains a NUL or a line break"
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        return "the target is not valid UTF-8"
    return None


def resolve_target(target: str, directory: Directory) -> Resolution:
    """What TARGET names, by the first rule that matches (see the module docstring)."""
    problem = target_problem(target)
    if problem:
        return Resolution(str(target)[:80], problem="invalid", detail=problem)
    if mailbox.valid_handle(target):
        box = directory.get(target)
        if box is not None:
            if box.state == RETIRED:
                return Resolution(target, RULE_HANDLE, (box,), problem="retired", instead=_instead(box, directory))
            return Resolution(target, RULE_HANDLE, (box,))
    if is_path(target):
        return _by_path(target, directory)
    gone: tuple[Box, ...] = ()
    if len(target) >= MIN_PREFIX:
        low = target.lower()
        hits = [b for b in directory.all() if b.session_id and b.session_id.lower().startswith(low)]
        live = tuple(b for b in hits if b.live)
        if live:
            return Resolution(target, RULE_PREFIX, live)
        gone = tuple(hits)
    return Resolution(target, problem="no_match", gone=gone, candidates=_closest(target, directory),
                      creatable=mailbox.valid_handle(target))


def _by_path(target: str, directory: Directory) -> Resolution:
    where = directory.path_where(target)
    if where is None:
        return Resolution(target, problem="invalid", detail="the path cannot be resolved")
    keys = directory._keys
    want = keys.key(where)
    root = worktree_root(where)
    root_key = keys.key(root) if root is not None else None
    boxes = [(b, directory.cwd_key(b)) for b in directory.all()]
    for rule, key in ((RULE_CWD, want), (RULE_WORKTREE, root_key)):
        if key is None or (rule == RULE_WORKTREE and key == want):
            continue
        live = tuple(b for b, k in boxes if k == key and b.live)
        if live:
            return Resolution(target, rule, live, where=where if rule == RULE_CWD else root)
    gone = tuple(b for b, k in boxes if k is not None and k in (want, root_key) and not b.live)
    live_keys = {k: b for b, k in boxes if k is not None and b.live}
    near = difflib.get_close_matches(want, list(live_keys), n=5, cutoff=0.6)
    return Resolution(target, where=where, problem="no_match", gone=gone,
                      candidates=tuple(live_keys[k] for k in near))


def _closest(target: str, directory: Directory) -> tuple[Box, ...]:
    """Live boxes whose handle, or session id of the same length, is close to the target."""
    boxes = [b for b in directory.all() if b.state != RETIRED]
    by_handle = {b.handle: b for b in boxes}
    out = [by_handle[h] for h in difflib.get_close_matches(target, list(by_handle), n=5, cutoff=0.6)]
    low = target.lower()
    heads = {b.session_id[: len(low)].lower(): b for b in boxes if b.live and b.session_id}
    for h in difflib.get_close_matches(low, list(heads), n=3, cutoff=0.6):
        if heads[h] not in out:
            out.append(heads[h])
    return tuple(out[:5])


def _instead(box: Box, directory: Directory) -> tuple[Box, ...]:
    """Where a retired box's addressee lives now: the live box of its session, else of its cwd."""
    others = [b for b in directory.all() if b.live and b.handle != box.handle]
    same = tuple(b for b in others if box.session_id and b.session_id == box.session_id)
    if same:
        return same
    key = directory.cwd_key(box)
    return tuple(b for b in others if key is not None and directory.cwd_key(b) == key)


# ---------------------------------------------------------------- words for people


def _q(value: str | None, limit: int = 120) -> str:
    return escape(value, limit) if value else "-"


def _names(boxes, limit: int = 8) -> str:
    names = [b.handle for b in boxes][:limit]
    more = len(boxes) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def explain(res: Resolution) -> str:
    """One line: which rule matched and what it matched."""
    target = escape(res.target, 120)
    if res.rule == RULE_HANDLE:
        return f"{target!s} is a handle"
    if res.rule == RULE_NEW:
        return f"{target} has no box; creating one (--create)"
    if res.rule in (RULE_CWD, RULE_WORKTREE):
        what = "working directory" if res.rule == RULE_CWD else "git worktree root"
        return f"{target} matched by path: the {what} {_q(res.where)} of {_names(res.matches)}"
    if res.rule == RULE_PREFIX:
        return f"{target} matched by session-id prefix: {_names(res.matches)}"
    return f"{target} matched nothing"


def state_note(box: Box) -> str:
    if box.state == LIVE:
        return f"live, wakes by {box.wake}"
    if box.state == DEAD:
        return f"its owner is not live ({box.reason}); the mail waits for that session to resume"
    if box.state == UNOWNED:
        return f"nobody has claimed it ({box.reason}); the mail waits for whoever claims it"
    return "retired"


def problem_text(res: Resolution) -> str:
    """The refusal for a resolution that names nothing sendable, with what might have been meant."""
    target = escape(res.target, 120)
    if res.problem == "invalid":
        return f"{target}: {res.detail}"
    if res.problem == "retired":
        text = f"{target} is retired: that session is gone and will not read this"
        if res.instead:
            text += f"; it lives on as {_names(res.instead)} (send there instead)"
        return text
    lines = []
    if res.where is not None:
        lines.append(f"no live session works in {_q(res.where)} or its git worktree root")
    elif len(res.target) >= MIN_PREFIX and not is_path(res.target):
        lines.append(f"no box named {target} and no live session whose id starts with {target}")
    else:
        lines.append(f"no box named {target} (a session-id prefix needs at least {MIN_PREFIX} characters)")
    for b in res.gone[:8]:
        lines.append(f"  not live: {b.handle} ({b.state}{', ' + b.reason if b.reason and b.reason != b.state else ''})")
    if res.candidates:
        lines.append("closest:")
        for b in res.candidates:
            lines.append(f"  {b.handle}  session {_q(b.session_id, 12)}  cwd {_q(b.cwd)}")
    if res.creatable:
        lines.append("check with `courier who`, or pass --create to queue mail for a new box of that name")
    else:
        lines.append("check with `courier who`")
    return "\n".join(lines)


def ambiguous_text(res: Resolution) -> str:
    lines = [f"{explain(res)}: {len(res.matches)} sessions; name one by handle, or pass --all to send to each"]
    lines += [f"  {b.handle}  session {_q(b.session_id, 12)}  cwd {_q(b.cwd)}" for b in res.matches]
    return "\n".join(lines)


# ---------------------------------------------------------------- courier who


HEADER = f"{'HANDLE':<28} {'RUNTIME':<7} {'STATE':<8} {'WAKE':<11} {'QUEUED':>6} {'SESSION':<10} CWD"


def render_row(b: Box) -> str:
    return (f"{b.handle[:28]:<28} {escape(b.runtime or '-', 7)[:7]:<7} {b.state:<8} {b.wake:<11} {b.queued:>6} "
            f"{escape(b.session_id or '-', 8)[:8]:<10} {_q(b.cwd, 100)}")


def cmd_who(args) -> int:
    import json

    from . import lockfile

    cfg = args.cfg
    directory = Directory.from_config(cfg)
    daemon_pid = lockfile.holder(cfg.state_dir)
    daemon = {"running": daemon_pid is not None, "pid": daemon_pid}
    target = getattr(args, "target", None)
    if target is None:
        boxes = directory.all()
        if args.json:
            print(json.dumps({"daemon": daemon, "sessions": [b.as_json() for b in boxes]}, indent=2))
            return 0
        print(HEADER)
        for b in boxes:
            print(render_row(b))
        live = sum(1 for b in boxes if b.live)
        state = f"running (pid {daemon_pid})" if daemon_pid else "NOT running: no socket will be rung"
        print(f"{len(boxes)} boxes, {live} live; daemon {state}")
        return 0
    res = resolve_target(target, directory)
    failed = res.problem in ("invalid", "no_match")
    if args.json:
        print(json.dumps({
            "daemon": daemon, "target": res.target, "rule": res.rule, "where": res.where, "problem": res.problem,
            "sessions": [b.as_json() for b in res.matches],
            "candidates": [b.handle for b in res.candidates], "instead": [b.handle for b in res.instead],
        }, indent=2))
    else:
        if failed:
            print(f"courier: {problem_text(res)}", file=sys.stderr)
        else:
            print(explain(res))
            print(HEADER)
            for b in res.matches:
                print(render_row(b))
            if res.problem == "retired":
                print(problem_text(res))
    return 2 if failed else 0
