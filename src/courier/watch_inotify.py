"""Watch the mail roots and the session registry with inotify, read inside trio's own I/O loop.

The inotify fd is awaited with `trio.lowlevel.wait_readable`: no thread, no timer, no step, so the
process does not wake at all while nothing changes, and a drop is noticed within one read. One watch
per directory, never recursive: each mail root (boxes appear and vanish), each box (mail in and out;
never its `read/` archive, which only grows) and the registry directory (or its parent while it does
not exist yet). The watcher decides nothing: it tells a Sink which box or which registry records
changed, or that everything must be rescanned because events were lost.

Trust: directory and file names come from other processes and are hostile. A name becomes a box only
if it does not start with "." and the daemon's `is_box_name` accepts it; symlinks are never followed
into boxes (IN_ONLYDIR | IN_DONT_FOLLOW). This module opens, reads and writes no file: it only
watches, lists and stats directories (and stats registry records while polling).
Logs: watch_overflow, watch_limit_reached, watch_limit_recovered, root_replaced, root_rewatched,
root_watch_waiting, root_watch_failed, registry_watch_waiting, registry_watched, registry_watch_lost,
registry_watch_failed, box_watch_failed.
Limits: Linux only (WatcherUnavailable elsewhere; the daemon falls back to watchfiles). Past
fs.inotify.max_user_watches the boxes left uncovered are polled every `poll_interval_s` (one stat
each), so their notice latency is up to that interval until `recheck()` can add their watches. A root
that changes under a symlink produces no event and is re-armed at the next `recheck()`. Events lost
to IN_Q_OVERFLOW are recovered by a rescan plus a re-arm that costs one add_watch per box.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import trio

try:  # absent off Linux (pyproject installs it only there)
    from inotify_simple import INotify, parse_events
except ImportError:  # pragma: no cover - exercised on macOS only
    INotify = None
    parse_events = None

# inotify.h ABI values, spelled out because inotify_simple may be absent off Linux.
IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_MASK_ADD = 0x20000000
IN_ISDIR = 0x40000000

_SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT
_APPEAR = IN_CREATE | IN_MOVED_TO
_VANISH = IN_DELETE | IN_MOVED_FROM
# A root follows a symlink (an operator may point ~/.helm/mail elsewhere); boxes never do.
ROOT_MASK = _APPEAR | _VANISH | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
BOX_MASK = _APPEAR | _VANISH | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
# Claude Code rewrites <pid>.json in place, not by rename: MODIFY and CLOSE_WRITE matter.
REGISTRY_MASK = _APPEAR | _VANISH | IN_CLOSE_WRITE | IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
PARENT_MASK = _APPEAR | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR

PROC_DIR = Path("/proc/sys/fs/inotify")
SYSCTL_FILE = "/etc/sysctl.d/90-courier-inotify.conf"
_READ_SIZE = 64 * 1024  # many whole events; one event is at most 16 + NAME_MAX + 1 bytes
_POLL_CHUNK = 512  # uncovered entries stat'ed between checkpoints

# add_watch errors we forgive for one box: (reason, keep retrying at recheck).
BOX_SKIP_ERRNOS = {
    errno.ENOENT: ("gone", False),  # removed between its event and our add_watch
    errno.ENOTDIR: ("not_a_directory", False),  # a symlink (IN_DONT_FOLLOW) or replaced by a file
    errno.ELOOP: ("symlink", False),
    errno.EACCES: ("permission", True),
    errno.EPERM: ("permission", True),
}
DIR_SKIP_ERRNOS = {
    errno.ENOENT: "missing",
    errno.ENOTDIR: "not_a_directory",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
}

ROOT, BOX, REGISTRY, PARENT = "root", "box", "registry", "registry_parent"


class WatcherUnavailable(Exception):
    """inotify cannot be used at all (not Linux, inotify_init1 fails e.g. EMFILE at max_user_instances).

    Raised by run() before started(); the daemon falls back to the watchfiles backend. The message
    says how to fix it."""


class Sink(Protocol):
    def box_dirty(self, root: Path, handle: str) -> None: ...  # <root>/<handle>/ changed, appeared or vanished

    def registry_dirty(self, names: frozenset[str] | None) -> None: ...  # these sessions/ entries; None = all

    def rescan(self, reason: str) -> None: ...  # events were lost: mark every box dirty


def limits() -> dict:
    """The kernel's inotify limits (None where unreadable), for `doctor` and the limit fix."""
    out: dict[str, int | None] = {}
    for key in ("max_user_watches", "max_user_instances", "max_queued_events"):
        try:
            out[key] = int((PROC_DIR / key).read_text())
        except (OSError, ValueError):
            out[key] = None
    return out


def unavailable_reason() -> str | None:
    """Why inotify cannot be used here, or None if it may be (cheap: no syscall)."""
    if not sys.platform.startswith("linux"):
        return f"inotify is Linux-only (platform {sys.platform}); use --watcher watchfiles"
    if INotify is None:
        return "the inotify_simple package is not installed: pip install inotify_simple, or use --watcher watchfiles"
    return None


def _round_up(n: int, step: int = 1024) -> int:
    return -(-n // step) * step


def _sysctl_fix(key: str, value: int) -> dict:
    return {
        "fix": f"sudo sysctl fs.inotify.{key}={value}",
        "persist": f"echo 'fs.inotify.{key}={value}' | sudo tee {SYSCTL_FILE}",
    }


def _init_error(exc: OSError) -> WatcherUnavailable:
    code = exc.errno
    if code == errno.EMFILE:
        current = limits()["max_user_instances"] or 128
        fix = _sysctl_fix("max_user_instances", 2 * current)
        return WatcherUnavailable(
            f"inotify_init1 failed (EMFILE): this user already has fs.inotify.max_user_instances={current} "
            f"inotify instances; raise it with `{fix['fix']}` and keep it with `{fix['persist']}`"
        )
    if code == errno.ENFILE:
        return WatcherUnavailable("inotify_init1 failed (ENFILE): the system-wide open file limit (fs.file-max) is reached")
    if code == errno.ENOSYS:
        return WatcherUnavailable("inotify_init1 failed (ENOSYS): this kernel has no inotify; use --watcher watchfiles")
    name = errno.errorcode.get(code or 0, str(code))
    return WatcherUnavailable(f"inotify_init1 failed ({name}): {exc.strerror}; use --watcher watchfiles")


def _dir_sig(path: str) -> tuple[int, int] | None:
    """(st_mtime_ns, st_ino) of a directory entry without following it; None if gone."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ino)


def _registry_sig(path: str) -> dict[str, tuple[int, int, int]] | None:
    """name -> (mtime_ns, size, ino) of each record: records are rewritten in place, so the dir's mtime is not enough."""
    out = {}
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") or not name.endswith(".json"):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[name] = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        return None
    return out


class _Root:
    """One mail root and what is known about its boxes."""

    __slots__ = ("path", "spath", "wd", "ident", "mtime_ns", "boxes", "waiting_logged")

    def __init__(self, path: Path):
        self.path = path
        self.spath = os.fspath(path)
        self.wd: int | None = None
        self.ident: tuple[int, int] | None = None  # (st_dev, st_ino) when armed
        self.mtime_ns: int | None = None  # at the last listing
        self.boxes: dict[str, int | None] = {}  # box name -> wd, None while uncovered or failed
        self.waiting_logged = False


class _Pending:
    """What one batch of work will tell the sink, collapsed."""

    __slots__ = ("dirty", "names", "all_names", "rescans")

    def __init__(self) -> None:
        self.dirty: dict[tuple[_Root, str], None] = {}
        self.names: set[str] = set()
        self.all_names = False
        self.rescans: list[str] = []


class InotifyWatcher:
    name = "inotify"

    def __init__(
        self,
        roots: Sequence[Path],
        registry_dir: Path,
        sink: Sink,
        log: Any,
        *,
        is_box_name: Callable[[str], bool],
        poll_interval_s: float = 1.0,
    ):
        unique: dict[Path, None] = {}
        for root in roots:
            unique.setdefault(Path(root), None)
        self._roots = [_Root(p) for p in unique]
        self._by_path = {r.path: r for r in self._roots}
        self.registry_dir = Path(registry_dir)
        self._reg = os.fspath(self.registry_dir)
        self.sink = sink
        self.log = log
        self.is_box_name = is_box_name
        self.poll_interval_s = poll_interval_s
        self._reset()

    def _reset(self) -> None:
        self._ino = None
        self._fd: int | None = None
        self._nursery: trio.Nursery | None = None
        self._wds: dict[int, list[tuple]] = {}  # wd -> targets (kind, _Root | None, name | None)
        self._reg_wd: int | None = None
        self._parent_wd: int | None = None
        self._reg_waiting_logged = False
        self._uncovered: dict[tuple, Any] = {}  # (kind, _Root | None, name | None) -> last signature
        self._failed: set[tuple[_Root, str]] = set()  # boxes whose add_watch failed (permission): retried
        self._limit_state = "ok"  # "ok" | "pending" (hit, not logged yet) | "logged"
        self._poll_scope: trio.CancelScope | None = None
        self._pending = _Pending()
        for r in self._roots:
            r.wd = r.ident = r.mtime_ns = None
            r.boxes = {}
            r.waiting_logged = False

    # ------------------------------------------------------------ public

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Arm every watch, THEN task_status.started(self.snapshot()), then serve events until cancelled.

        The fd is closed on exit (trio.lowlevel.notify_closing first, so no task is left waiting on it)."""
        reason = unavailable_reason()
        if reason:
            raise WatcherUnavailable(reason)
        self._reset()
        try:
            self._ino = self._open()
        except OSError as exc:
            raise _init_error(exc) from exc
        self._fd = self._ino.fileno()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._watch_registry(announce=False)
                for r in self._roots:
                    self._arm_root(r, mark="none")
                # The daemon scans everything after started(): nothing to tell the sink now.
                self._pending = _Pending()
                self._finish()
                task_status.started(self.snapshot())
                await self._serve()
        finally:
            self._nursery = None
            fd, ino = self._fd, self._ino
            self._fd = self._ino = None
            trio.lowlevel.notify_closing(fd)
            ino.close()

    def recheck(self) -> None:
        """Sync and cheap; called at every safety rescan: re-arm what is not covered.

        A root deleted or replaced and now back, a root whose inode changed under its path, the
        registry dir that appeared, boxes whose watch failed or hit the watch limit. A root whose
        mtime moved since it was last listed is listed again (new boxes get watches)."""
        if self._ino is None:
            return
        self._recheck(full=False)
        self._finish()

    def snapshot(self) -> dict:
        watched = sum(1 for r in self._roots for wd in r.boxes.values() if wd is not None)
        if self._reg_wd is not None:
            registry = "watched"
        elif (REGISTRY, None, None) in self._uncovered:
            registry = "polled"
        else:
            registry = "waiting"
        return {
            "watcher": self.name,
            "watches": len(self._wds),
            "boxes_watched": watched,
            "uncovered": len(self._uncovered),
            "max_user_watches": limits()["max_user_watches"],
            "roots_watched": sum(1 for r in self._roots if r.wd is not None),
            "roots": len(self._roots),
            "registry": registry,
            "failed": len(self._failed),
            "polling": self._poll_scope is not None,
            "poll_interval_s": self.poll_interval_s,
        }

    def complete(self) -> bool:
        """True if kernel events cover every root, every box and the registry (nothing polled, nothing
        failed): then a lost event is always announced (IN_Q_OVERFLOW), and the daemon's full safety
        pass over every box can be rare."""
        return (self._reg_wd is not None and not self._uncovered and not self._failed
                and all(r.wd is not None for r in self._roots))

    def is_watched(self, root: Path, handle: str) -> bool:
        """True if <root>/<handle>/ has a live watch (event-driven, not polled)."""
        r = self._by_path.get(Path(root))
        return r is not None and r.boxes.get(handle) is not None

    def handle_events(self, events: Iterable[tuple[int, int, int, str]]) -> None:
        """Translate one read's (wd, mask, cookie, name) events, then tell the sink once.

        Public so tests can feed a synthetic IN_Q_OVERFLOW without touching global sysctls."""
        overflow = False
        wds = self._wds
        for wd, mask, _cookie, name in events:
            if mask & IN_Q_OVERFLOW:
                overflow = True
                continue
            targets = wds.get(wd)
            if not targets:
                continue  # a watch we already dropped: its late events (IN_IGNORED) are expected
            if mask & _SELF:
                self._lose_wd(wd, mask)
                continue
            for target in targets if len(targets) == 1 else tuple(targets):
                kind = target[0]
                if kind == BOX:
                    if name and name[0] != ".":  # a sender's .tmp-*; its rename is its own event
                        self._pending.dirty[(target[1], target[2])] = None
                elif kind == ROOT:
                    self._on_root_child(target[1], mask, name)
                elif kind == REGISTRY:
                    if name.endswith(".json") and name[0] != ".":
                        self._pending.names.add(name)
                elif kind == PARENT:
                    if mask & _APPEAR and mask & IN_ISDIR and name == self.registry_dir.name:
                        self._watch_registry(announce=True)
        if overflow:
            self.log.warning(
                "watch_overflow",
                max_queued_events=limits()["max_queued_events"],
                action="rescan and re-arm every watch",
            )
            self._recheck(full=True)
            self._pending.rescans.append("overflow")
            self._pending.all_names = True
        self._finish()

    # ------------------------------------------------------------ seams (tests override)

    def _open(self):
        # The fd is non-blocking: trio waits for readiness and we read until EAGAIN.
        return INotify(nonblocking=True)

    def _add_watch(self, path: str, mask: int) -> int:
        return self._ino.add_watch(path, mask)

    # ------------------------------------------------------------ serving

    async def _serve(self) -> None:
        # Not INotify.read(): it blocks in poll(2). trio's epoll says when the fd is readable, and the
        # non-blocking read then drains it until EAGAIN, so a wake never leaves events behind.
        fd = self._fd
        while True:
            await trio.lowlevel.wait_readable(fd)
            while True:
                try:
                    data = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    break
                self.handle_events(parse_events(data))
                if len(data) > _READ_SIZE // 2:
                    await trio.lowlevel.checkpoint()  # a burst: let the dispatcher run between reads

    def _finish(self) -> None:
        """End of one batch: log the limit once, tell the sink, start or stop the poller."""
        if self._limit_state == "pending":
            self._log_limit()
        elif self._limit_state == "logged" and not self._uncovered:
            self._limit_state = "ok"
            self.log.info("watch_limit_recovered", watches=len(self._wds))
        p, self._pending = self._pending, _Pending()
        for reason in dict.fromkeys(p.rescans):
            self.sink.rescan(reason)
        for r, handle in p.dirty:
            self.sink.box_dirty(r.path, handle)
        if p.all_names:
            self.sink.registry_dirty(None)
        elif p.names:
            self.sink.registry_dirty(frozenset(p.names))
        self._update_poller()

    # ------------------------------------------------------------ watches

    def _add(self, path: str, mask: int, target: tuple) -> int:
        # IN_MASK_ADD: if two targets share an inode (a registry inside a root), neither narrows the other's mask.
        wd = self._add_watch(path, mask | IN_MASK_ADD)
        targets = self._wds.get(wd)
        if targets is None:
            self._wds[wd] = [target]
        elif target not in targets:
            targets.append(target)
        return wd

    def _drop(self, wd: int | None, target: tuple, *, rm: bool) -> None:
        """Forget one target of a wd; remove the kernel watch when nothing else uses it."""
        targets = self._wds.get(wd)
        if targets is None:
            return
        if target in targets:
            targets.remove(target)
        if not targets:
            del self._wds[wd]
            if rm:
                try:
                    self._ino.rm_watch(wd)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # EINVAL: the kernel already dropped it
                        raise

    def _lose_wd(self, wd: int, mask: int) -> None:
        """The watched directory itself went away (deleted, moved, unmounted): forget every target."""
        targets = self._wds.pop(wd)
        if mask & IN_MOVE_SELF:
            # A moved directory keeps its watch; it now reports on a tree outside ours.
            try:
                self._ino.rm_watch(wd)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        for kind, r, name in targets:
            if kind == BOX:
                if r.boxes.get(name) == wd:
                    del r.boxes[name]
                    r.mtime_ns = None  # list the root at the next recheck, in case the box is still there
                self._pending.dirty[(r, name)] = None
            elif kind == ROOT:
                if r.wd == wd:
                    why = "moved" if mask & IN_MOVE_SELF else "deleted" if mask & IN_DELETE_SELF else "unwatched"
                    self._lose_root(r, why)
            elif kind == REGISTRY:
                if self._reg_wd == wd:
                    self._reg_wd = None
                    self.log.info("registry_watch_lost", path=self._reg, reason=_self_reason(mask))
                    self._pending.all_names = True
                    self._watch_registry(announce=True)
            elif kind == PARENT:
                if self._parent_wd == wd:
                    self._parent_wd = None
                    self._watch_registry(announce=True)

    # ------------------------------------------------------------ roots and boxes

    def _on_root_child(self, r: _Root, mask: int, name: str) -> None:
        if not mask & IN_ISDIR or not name or name[0] == "." or not self.is_box_name(name):
            return  # files and symlinks in the root are not boxes
        if mask & _APPEAR:
            self._arm_box(r, name)
            self._pending.dirty[(r, name)] = None  # after the watch: mail may have landed before it
        elif mask & _VANISH:
            self._forget_box(r, name)
            self._pending.dirty[(r, name)] = None  # the daemon notices the box is gone

    def _arm_box(self, r: _Root, name: str) -> bool:
        path = os.path.join(r.spath, name)
        target = (BOX, r, name)
        try:
            wd = self._add(path, BOX_MASK, target)
        except OSError as exc:
            code = exc.errno
            old = r.boxes.get(name)
            if old is not None:
                self._drop(old, target, rm=True)  # a stale watch on the directory the name used to hold
            if code == errno.ENOSPC:
                self._failed.discard((r, name))
                r.boxes[name] = None
                self._uncovered.setdefault(target, _dir_sig(path))
                self._limit_hit()
                return False
            if code not in BOX_SKIP_ERRNOS:
                raise
            reason, retry = BOX_SKIP_ERRNOS[code]
            self._uncovered.pop(target, None)
            if retry:
                r.boxes[name] = None
                self._failed.add((r, name))
            else:
                self._forget_box(r, name)
            self.log.info("box_watch_failed", root=r.spath, handle=name, reason=reason, errno=code)
            return False
        old = r.boxes.get(name)
        if old is not None and old != wd:
            self._drop(old, target, rm=True)  # the name now holds another directory
        r.boxes[name] = wd
        self._uncovered.pop(target, None)
        self._failed.discard((r, name))
        return True

    def _forget_box(self, r: _Root, name: str) -> None:
        target = (BOX, r, name)
        wd = r.boxes.pop(name, None)
        if wd is not None:
            self._drop(wd, target, rm=True)  # a box moved away keeps its watch otherwise
        self._uncovered.pop(target, None)
        self._failed.discard((r, name))

    def _arm_root(self, r: _Root, *, mark: str, readd: bool = True) -> bool:
        """Watch the root, then list it and watch its boxes (in that order: no box appears unseen).

        mark: "none" (the caller rescans anyway), "new" (boxes not known before), "all"."""
        target = (ROOT, r, None)
        try:
            wd = self._add(r.spath, ROOT_MASK, target)
        except OSError as exc:
            code = exc.errno
            if code == errno.ENOSPC:
                self._uncovered.setdefault(target, _dir_sig(r.spath))
                self._limit_hit()
                if readd:
                    self._sync_root(r, readd=True, mark=mark)  # its boxes may still fit, else they are polled
                return False
            if code not in DIR_SKIP_ERRNOS:
                raise
            if not r.waiting_logged:
                r.waiting_logged = True
                event = "root_watch_waiting" if code in (errno.ENOENT, errno.ENOTDIR) else "root_watch_failed"
                self.log.warning(event, path=r.spath, reason=DIR_SKIP_ERRNOS[code], retry="at each recheck")
            return False
        r.wd = wd
        r.waiting_logged = False
        self._uncovered.pop(target, None)
        try:
            st = os.stat(r.spath)
        except OSError:
            r.ident = None  # gone again already: its DELETE_SELF is queued
        else:
            r.ident = (st.st_dev, st.st_ino)
        self._sync_root(r, readd=readd, mark=mark)
        return True

    def _lose_root(self, r: _Root, why: str) -> None:
        """The root is gone or replaced: drop every watch under it, rescan, re-arm now if it is back."""
        self.log.warning("root_replaced", path=r.spath, reason=why, boxes=len(r.boxes))
        if r.wd is not None:
            self._drop(r.wd, (ROOT, r, None), rm=True)
        r.wd = r.ident = r.mtime_ns = None
        self._uncovered.pop((ROOT, r, None), None)
        for name in list(r.boxes):
            self._forget_box(r, name)
        self._pending.rescans.append("root_replaced")
        if os.path.isdir(r.spath) and self._arm_root(r, mark="none"):
            self.log.info("root_rewatched", path=r.spath, reason=why, boxes=len(r.boxes), when="at_once")

    def _sync_root(self, r: _Root, *, readd: bool, mark: str) -> None:
        """List the root: watch boxes not known (all of them if readd), forget boxes that vanished."""
        try:
            mtime = os.stat(r.spath).st_mtime_ns  # before listing: a change during it shows next time
            entries = list(os.scandir(r.spath))
        except OSError:
            return  # the root went away: its own events or the next recheck handle it
        present = set()
        dirty = self._pending.dirty
        for entry in entries:
            name = entry.name
            if name[0] == "." or not self.is_box_name(name):
                continue
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
            except OSError:
                continue
            present.add(name)
            known = name in r.boxes
            if not known or (readd and (BOX, r, name) not in self._uncovered):
                self._arm_box(r, name)
            if mark == "all" or (mark == "new" and not known):
                dirty[(r, name)] = None
        for name in [n for n in r.boxes if n not in present]:
            self._forget_box(r, name)
            dirty[(r, name)] = None
        r.mtime_ns = mtime

    # ------------------------------------------------------------ registry

    def _watch_registry(self, *, announce: bool) -> None:
        """Watch the registry dir or, while it does not exist, its parent for its creation."""
        if self._reg_wd is not None:
            return
        if self._arm_registry():
            if announce:
                self.log.info("registry_watched", path=self._reg)
                self._pending.all_names = True  # records written before the watch existed
            return
        if (REGISTRY, None, None) not in self._uncovered:
            self._wait_registry()

    def _arm_registry(self) -> bool:
        target = (REGISTRY, None, None)
        try:
            wd = self._add(self._reg, REGISTRY_MASK, target)
        except OSError as exc:
            code = exc.errno
            if code == errno.ENOSPC:
                self._uncovered.setdefault(target, _registry_sig(self._reg))
                self._limit_hit()
                return False
            if code not in DIR_SKIP_ERRNOS:
                raise
            if code not in (errno.ENOENT, errno.ENOTDIR) and not self._reg_waiting_logged:
                self.log.warning("registry_watch_failed", path=self._reg, reason=DIR_SKIP_ERRNOS[code])
            return False
        old = self._reg_wd
        if old is not None and old != wd:
            self._drop(old, target, rm=True)
        self._reg_wd = wd
        self._uncovered.pop(target, None)
        self._reg_waiting_logged = False
        if self._parent_wd is not None:
            self._drop(self._parent_wd, (PARENT, None, None), rm=True)
            self._parent_wd = None
        return True

    def _wait_registry(self) -> None:
        parent = os.fspath(self.registry_dir.parent)
        reason = "missing"
        if self._parent_wd is None:
            try:
                self._parent_wd = self._add(parent, PARENT_MASK, (PARENT, None, None))
            except OSError as exc:
                # No parent watch (gone, or at the watch limit): the registry is then found at a recheck.
                if exc.errno == errno.ENOSPC:
                    reason = "watch_limit"
                elif exc.errno in DIR_SKIP_ERRNOS:
                    reason = "parent_" + DIR_SKIP_ERRNOS[exc.errno]
                else:
                    raise
        if not self._reg_waiting_logged:
            self._reg_waiting_logged = True
            self.log.info(
                "registry_watch_waiting",
                path=self._reg,
                reason=reason,
                parent_watched=self._parent_wd is not None,
                retry="on its creation" if self._parent_wd is not None else "at each recheck",
            )
        if self._parent_wd is not None and os.path.isdir(self._reg) and self._arm_registry():
            # created between our two add_watch calls
            self.log.info("registry_watched", path=self._reg)
            self._pending.all_names = True

    # ------------------------------------------------------------ recheck

    def _recheck(self, *, full: bool) -> None:
        """Re-arm what is not covered. full (after an overflow): re-add every watch, since any
        event, an IN_IGNORED included, may have been lost."""
        if self._reg_wd is None:
            self._watch_registry(announce=True)
        elif full:
            self._arm_registry()
        for r in self._roots:
            if r.wd is None:
                if (ROOT, r, None) in self._uncovered:
                    self._arm_root(r, mark="new", readd=False)  # the poller has been listing it
                elif os.path.isdir(r.spath) and self._arm_root(r, mark="all"):
                    self.log.info("root_rewatched", path=r.spath, boxes=len(r.boxes), when="at_recheck")
                continue
            try:
                st = os.stat(r.spath)
            except OSError:
                ident, mtime = None, None
            else:
                ident, mtime = (st.st_dev, st.st_ino), st.st_mtime_ns
            if ident != r.ident:
                self._lose_root(r, "inode_changed")
            elif full or mtime != r.mtime_ns:
                self._sync_root(r, readd=full, mark="new")
        for target in [t for t in self._uncovered if t[0] == BOX]:
            if target not in self._uncovered:
                continue
            if self._arm_box(target[1], target[2]):
                self._pending.dirty[(target[1], target[2])] = None  # mail may have landed since the last poll
            elif target in self._uncovered:
                break  # still at the limit: the rest would fail the same way
        for r, name in list(self._failed):
            if (r, name) in self._failed and self._arm_box(r, name):
                self._pending.dirty[(r, name)] = None

    # ------------------------------------------------------------ the watch limit

    def _limit_hit(self) -> None:
        if self._limit_state == "ok":
            self._limit_state = "pending"  # logged once at the end of this batch, with the full count

    def _log_limit(self) -> None:
        self._limit_state = "logged"
        limit = limits()["max_user_watches"]
        missing = len(self._uncovered)
        # The limit is per user and shared with other programs (editors, build tools): we hit it, so this
        # user needs at least limit + missing; suggest twice that, as headroom for growth.
        needed = (limit or len(self._wds)) + missing
        suggested = _round_up(2 * needed)
        self.log.error(
            "watch_limit_reached",
            limit=limit,
            watches=len(self._wds),
            uncovered=missing,
            needed=needed,
            fallback=f"polling the uncovered boxes every {self.poll_interval_s:g} s; retried at each recheck",
            **_sysctl_fix("max_user_watches", suggested),
        )

    def _update_poller(self) -> None:
        """The poll task exists only while something is uncovered, so idle cost stays zero otherwise."""
        if self._uncovered and self._poll_scope is None and self._nursery is not None:
            scope = trio.CancelScope()
            self._poll_scope = scope
            self._nursery.start_soon(self._poll_loop, scope)
        elif not self._uncovered and self._poll_scope is not None:
            self._poll_scope.cancel()
            self._poll_scope = None

    async def _poll_loop(self, scope: trio.CancelScope) -> None:
        try:
            with scope:
                while True:
                    await trio.sleep(self.poll_interval_s)
                    await self._poll_once()
                    self._finish()
        finally:
            if self._poll_scope is scope:
                self._poll_scope = None

    async def _poll_once(self) -> None:
        """Stat each uncovered directory; what changed is dirty. Checkpoints between chunks."""
        for i, (target, old) in enumerate(list(self._uncovered.items())):
            if i and i % _POLL_CHUNK == 0:
                await trio.lowlevel.checkpoint()
            if target not in self._uncovered:
                continue  # covered or gone meanwhile
            kind, r, name = target
            if kind == BOX:
                sig = _dir_sig(os.path.join(r.spath, name))
                if sig != old:
                    self._uncovered[target] = sig
                    self._pending.dirty[(r, name)] = None
            elif kind == ROOT:
                sig = _dir_sig(r.spath)
                if sig != old:
                    self._uncovered[target] = sig
                    if sig is None or (old is not None and sig[1] != old[1]):
                        self._lose_root(r, "polled_replaced")
                    else:
                        self._sync_root(r, readd=False, mark="new")
            elif kind == REGISTRY:
                sig = _registry_sig(self._reg)
                if sig != old:
                    self._uncovered[target] = sig
                    if sig is None or old is None:
                        self._pending.all_names = True
                    else:
                        changed = {n for n in sig.keys() | old.keys() if sig.get(n) != old.get(n)}
                        self._pending.names.update(changed)


def _self_reason(mask: int) -> str:
    if mask & IN_MOVE_SELF:
        return "moved"
    if mask & IN_DELETE_SELF:
        return "deleted"
    if mask & IN_UNMOUNT:
        return "unmounted"
    return "unwatched"
