"""The inotify watcher against real directories: which box is dirty, when, and what it costs idle."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import structlog
import trio
from structlog.testing import capture_logs

from courier.watch_inotify import IN_Q_OVERFLOW, InotifyWatcher, WatcherUnavailable, limits

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux-only")

# The daemon passes its own predicate; this mirrors the helm handle grammar without importing courier.mailbox.
HANDLE_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,198}[a-z0-9])?$")
FAST = 0.3  # an event-driven notice arrives well within this; the poll interval in these tests is longer


def is_box(name: str) -> bool:
    return bool(HANDLE_RE.match(name))


class RecordingSink:
    """Records every call; remembers whether the box was watched at the moment it was marked dirty."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.watched_when_dirty: dict[tuple[Path, str], bool] = {}
        self.watcher: InotifyWatcher | None = None
        self._changed = trio.Event()

    def _note(self, call: tuple) -> None:
        self.calls.append(call)
        self._changed.set()
        self._changed = trio.Event()

    def box_dirty(self, root: Path, handle: str) -> None:
        if self.watcher is not None:
            self.watched_when_dirty[(root, handle)] = self.watcher.is_watched(root, handle)
        self._note(("box", root, handle))

    def registry_dirty(self, names) -> None:
        self._note(("registry", names))

    def rescan(self, reason: str) -> None:
        self._note(("rescan", reason))

    def boxes(self) -> list[str]:
        return [c[2] for c in self.calls if c[0] == "box"]

    def registry(self) -> list:
        return [c[1] for c in self.calls if c[0] == "registry"]

    def rescans(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "rescan"]

    async def wait(self, predicate, timeout: float = 3.0) -> float:
        """Wait until predicate(self) holds; returns the seconds it took."""
        start = time.perf_counter()
        with trio.fail_after(timeout):
            while not predicate(self):
                await self._changed.wait()
        return time.perf_counter() - start


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "mail"
    for handle in ("alice", "bob"):
        (root / handle / "read").mkdir(parents=True)
    registry = tmp_path / "claude" / "sessions"
    registry.mkdir(parents=True)
    return root, registry


@asynccontextmanager
async def running(roots, registry, cls=InotifyWatcher, **kw):
    sink = RecordingSink()
    watcher = cls(list(roots), registry, sink, structlog.get_logger(), is_box_name=is_box, **kw)
    sink.watcher = watcher
    async with trio.open_nursery() as nursery:
        snap = await nursery.start(watcher.run)
        yield watcher, sink, snap
        nursery.cancel_scope.cancel()


def drop(box: Path, name: str = "1700000000000-abc123.json") -> Path:
    """Write a message the way helm does: .tmp-* then rename."""
    tmp = box / f".tmp-{name}"
    tmp.write_text('{"subject": "hi"}')
    os.rename(tmp, box / name)
    return box / name


def events(logs, name):
    return [e for e in logs if e["event"] == name]


async def test_started_reports_snapshot(tree):
    """started() hands back a snapshot that counts the root, both boxes and the registry."""
    root, registry = tree
    async with running([root], registry) as (w, sink, snap):
        assert snap["watcher"] == "inotify"
        assert snap["boxes_watched"] == 2
        assert snap["watches"] == 4  # root, two boxes, registry; never read/
        assert snap["uncovered"] == 0 and snap["polling"] is False
        assert snap["registry"] == "watched"
        assert snap["max_user_watches"] == limits()["max_user_watches"]
        assert sink.calls == []


async def test_tmp_then_rename_marks_exactly_that_box(tree):
    """A .tmp-* write renamed into place marks that one box once; the temp file's own events are ignored."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        drop(root / "alice")
        await sink.wait(lambda s: s.boxes())
        await trio.sleep(0.1)
        assert sink.calls == [("box", root, "alice")]


async def test_temp_file_alone_is_ignored(tree):
    """A sender's .tmp-* file that is never renamed marks nothing."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        (root / "alice" / ".tmp-x").write_text("partial")
        os.unlink(root / "alice" / ".tmp-x")
        await trio.sleep(0.2)
        assert sink.calls == []


async def test_direct_write_marks_box(tree):
    """A message written straight into the box (no rename) marks it dirty."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        with open(root / "bob" / "1700000000000-def456.json", "w") as f:
            f.write("{}")
        await sink.wait(lambda s: s.boxes())
        await trio.sleep(0.1)
        assert set(sink.boxes()) == {"bob"}


async def test_consuming_into_read_marks_box(tree):
    """Mail moved into read/ marks the box (its count changed); read/ itself is never watched."""
    root, registry = tree
    path = drop(root / "alice")
    async with running([root], registry) as (w, sink, _):
        os.rename(path, root / "alice" / "read" / path.name)
        await sink.wait(lambda s: s.boxes())
        sink.calls.clear()
        (root / "alice" / "read" / "other.json").write_text("{}")
        await trio.sleep(0.2)
        assert sink.calls == []


async def test_new_box_is_watched_before_it_is_marked(tree):
    """A box created after start is watched and then marked; mail dropped right after mkdir is not missed."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        (root / "carol").mkdir()
        drop(root / "carol")  # before the watcher gets a chance to add the watch
        await sink.wait(lambda s: "carol" in s.boxes())
        assert sink.watched_when_dirty[(root, "carol")] is True
        assert w.snapshot()["boxes_watched"] == 3
        sink.calls.clear()
        drop(root / "carol", "1700000000001-aaaaaa.json")
        await sink.wait(lambda s: "carol" in s.boxes(), timeout=FAST)


async def test_box_deleted_then_recreated_is_watched_again(tree):
    """A removed box is marked (the daemon sees it gone); re-created under the same name it is watched again."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        shutil.rmtree(root / "alice")
        await sink.wait(lambda s: "alice" in s.boxes())
        assert not w.is_watched(root, "alice")
        sink.calls.clear()
        (root / "alice").mkdir()
        await sink.wait(lambda s: "alice" in s.boxes())
        assert w.is_watched(root, "alice")
        sink.calls.clear()
        drop(root / "alice")
        await sink.wait(lambda s: "alice" in s.boxes(), timeout=FAST)
        # deleted and re-created before the watcher reads either event
        shutil.rmtree(root / "bob")
        (root / "bob").mkdir()
        await sink.wait(lambda s: "bob" in s.boxes())
        await trio.sleep(0.05)
        assert w.is_watched(root, "bob")
        sink.calls.clear()
        drop(root / "bob")
        await sink.wait(lambda s: "bob" in s.boxes(), timeout=FAST)
        assert w.snapshot()["watches"] == 4


async def test_box_renamed_and_moved_away(tree, tmp_path):
    """A box renamed inside the root is watched under its new name; one moved out of the root is no longer watched."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        os.rename(root / "alice", root / "alice2")
        await sink.wait(lambda s: {"alice", "alice2"} <= set(s.boxes()))
        assert w.is_watched(root, "alice2") and not w.is_watched(root, "alice")
        sink.calls.clear()
        drop(root / "alice2")
        await sink.wait(lambda s: "alice2" in s.boxes(), timeout=FAST)
        os.rename(root / "bob", tmp_path / "bob-elsewhere")
        await sink.wait(lambda s: "bob" in s.boxes())
        sink.calls.clear()
        drop(tmp_path / "bob-elsewhere")
        await trio.sleep(0.2)
        assert sink.calls == []
        assert w.snapshot()["watches"] == 3  # root, alice2, registry


async def test_symlinked_box_is_not_watched(tree, tmp_path):
    """A symlink in the root, made before or after start, is not a box: never watched, its mail marks nothing."""
    root, registry = tree
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "linked").symlink_to(outside)
    async with running([root], registry) as (w, sink, snap):
        assert snap["boxes_watched"] == 2
        (root / "linked2").symlink_to(outside)
        await trio.sleep(0.1)
        drop(outside)
        await trio.sleep(0.2)
        assert not w.is_watched(root, "linked") and not w.is_watched(root, "linked2")
        assert sink.boxes() == []
        drop(root / "alice")
        await sink.wait(lambda s: s.boxes(), timeout=FAST)
        assert sink.boxes() == ["alice"]


async def test_names_that_are_not_boxes_are_ignored(tree):
    """Directories the predicate rejects, or whose name starts with ".", get no watch and mark nothing."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        (root / "Not_A_Handle").mkdir()
        (root / ".hidden").mkdir()
        (root / "stray-file").write_text("x")
        await trio.sleep(0.2)
        assert sink.calls == []
        assert w.snapshot()["boxes_watched"] == 2


async def test_root_deleted_and_recreated_is_rearmed_at_once(tree):
    """Root removed and re-created before the watcher reads: rescan, logged, re-armed at once with its boxes."""
    root, registry = tree
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            shutil.rmtree(root)
            (root / "alice").mkdir(parents=True)
            await sink.wait(lambda s: "root_replaced" in s.rescans())
            assert events(logs, "root_replaced")[0]["path"] == str(root)
            assert events(logs, "root_rewatched")[0]["when"] == "at_once"
            assert w.is_watched(root, "alice")
            sink.calls.clear()
            drop(root / "alice")
            await sink.wait(lambda s: "alice" in s.boxes(), timeout=FAST)
            (root / "dave").mkdir()
            await sink.wait(lambda s: "dave" in s.boxes(), timeout=FAST)
            assert w.snapshot()["watches"] == 4  # root, alice, dave, registry


async def test_root_deleted_is_rearmed_at_recheck(tree):
    """Root removed: rescan now; once it is back, recheck() re-arms it and marks its boxes."""
    root, registry = tree
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            shutil.rmtree(root)
            await sink.wait(lambda s: "root_replaced" in s.rescans())
            assert w.snapshot()["roots_watched"] == 0
            w.recheck()  # still missing: nothing to do
            assert w.snapshot()["roots_watched"] == 0
            (root / "erin").mkdir(parents=True)
            sink.calls.clear()
            w.recheck()
            assert events(logs, "root_rewatched")[-1]["when"] == "at_recheck"
            assert sink.boxes() == ["erin"] and sink.watched_when_dirty[(root, "erin")]
            sink.calls.clear()
            drop(root / "erin")
            await sink.wait(lambda s: "erin" in s.boxes(), timeout=FAST)


async def test_root_whose_inode_changed_is_rearmed_at_recheck(tmp_path):
    """A root reached through a symlink that is re-pointed gives no event; recheck() notices the inode and re-arms."""
    first, second = tmp_path / "m1", tmp_path / "m2"
    (first / "alice").mkdir(parents=True)
    (second / "alice").mkdir(parents=True)
    root = tmp_path / "mail"
    root.symlink_to(first)
    registry = tmp_path / "sessions"
    registry.mkdir()
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            tmp_link = tmp_path / "mail.new"
            tmp_link.symlink_to(second)
            os.rename(tmp_link, root)
            drop(second / "alice")
            await trio.sleep(0.1)
            assert sink.calls == []  # blind until recheck
            w.recheck()
            assert events(logs, "root_replaced")[0]["reason"] == "inode_changed"
            assert "root_replaced" in sink.rescans()
            sink.calls.clear()
            drop(second / "alice", "1700000000002-bbbbbb.json")
            await sink.wait(lambda s: "alice" in s.boxes(), timeout=FAST)
            sink.calls.clear()
            drop(first / "alice", "1700000000003-cccccc.json")  # the old tree is no longer watched
            await trio.sleep(0.2)
            assert sink.calls == []


async def test_registry_record_written_in_place(tree):
    """A registry record rewritten in place (no rename) reports its name; dot-files and non-.json are ignored."""
    root, registry = tree
    async with running([root], registry) as (w, sink, _):
        with open(registry / "4242.json", "w") as f:
            f.write('{"pid": 4242,')
            f.flush()
            f.write(' "sessionId": "s"}')
        (registry / ".4243.json.tmp").write_text("{}")
        (registry / "notes.txt").write_text("x")
        await sink.wait(lambda s: any(n and "4242.json" in n for n in s.registry()))
        await trio.sleep(0.1)
        names = set().union(*[n for n in sink.registry() if n])
        assert names == {"4242.json"}
        assert sink.boxes() == []


async def test_registry_created_after_start(tmp_path):
    """A registry dir that does not exist yet is awaited on its parent; once created it is watched and re-read whole."""
    root = tmp_path / "mail"
    root.mkdir()
    registry = tmp_path / "claude" / "sessions"
    registry.parent.mkdir()
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, snap):
            assert snap["registry"] == "waiting"
            assert events(logs, "registry_watch_waiting")[0]["parent_watched"] is True
            registry.mkdir()
            (registry / "77.json").write_text("{}")  # may land before the watch: covered by registry_dirty(None)
            await sink.wait(lambda s: None in s.registry())
            assert events(logs, "registry_watched")
            assert w.snapshot()["registry"] == "watched"
            assert w.snapshot()["watches"] == 2  # root and registry; the parent's watch is gone
            sink.calls.clear()
            (registry / "78.json").write_text("{}")
            await sink.wait(lambda s: frozenset({"78.json"}) in s.registry(), timeout=FAST)


async def test_registry_and_parent_missing_found_at_recheck(tmp_path):
    """With not even the registry's parent present, recheck() finds the registry once it exists."""
    root = tmp_path / "mail"
    root.mkdir()
    registry = tmp_path / "claude" / "sessions"
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            assert events(logs, "registry_watch_waiting")[0]["parent_watched"] is False
            registry.mkdir(parents=True)
            w.recheck()
            assert sink.registry() == [None]
            assert events(logs, "registry_watched")
            (registry / "5.json").write_text("{}")
            await sink.wait(lambda s: frozenset({"5.json"}) in s.registry(), timeout=FAST)


async def test_registry_deleted_and_recreated(tree):
    """The registry dir removed then re-created: re-read whole, watched again."""
    root, registry = tree
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            shutil.rmtree(registry)
            await sink.wait(lambda s: None in s.registry())
            assert events(logs, "registry_watch_lost")
            sink.calls.clear()
            registry.mkdir()
            await sink.wait(lambda s: None in s.registry())
            sink.calls.clear()
            (registry / "9.json").write_text("{}")
            await sink.wait(lambda s: frozenset({"9.json"}) in s.registry(), timeout=FAST)


async def test_overflow_injected_rescans_and_rearms(tree):
    """A (synthetic) IN_Q_OVERFLOW logs watch_overflow, rescans, re-reads the registry and watches boxes it missed."""
    root, registry = tree
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            (root / "frank").mkdir()  # its IN_CREATE is still unread: as if lost in the overflow
            w.handle_events([(-1, IN_Q_OVERFLOW, 0, "")])
            assert w.is_watched(root, "frank")
            assert sink.rescans() == ["overflow"]
            assert sink.registry() == [None]
            assert "frank" in sink.boxes()
            assert [e["log_level"] for e in events(logs, "watch_overflow")] == ["warning"]


async def test_overflow_real_queue(tree):
    """More events than fs.inotify.max_user_queued_events while the watcher cannot read: a real overflow is handled."""
    root, registry = tree
    queued = limits()["max_queued_events"]
    if not queued or queued > 70000:
        pytest.skip(f"max_queued_events={queued}: too many files to overflow it cheaply")
    with capture_logs() as logs:
        async with running([root], registry) as (w, sink, _):
            box = root / "alice"
            for i in range(queued // 2 + 200):  # IN_CREATE + IN_CLOSE_WRITE each; no checkpoint: nothing is read
                os.close(os.open(box / f"m{i}.json", os.O_CREAT | os.O_WRONLY, 0o600))
            await sink.wait(lambda s: "overflow" in s.rescans(), timeout=10)
            assert None in sink.registry()
            assert events(logs, "watch_overflow")
            sink.calls.clear()
            drop(root / "bob")
            await sink.wait(lambda s: "bob" in s.boxes(), timeout=FAST)

class LimitedWatcher(InotifyWatcher):
    """Fails add_watch with ENOSPC past `budget` watches, as fs.inotify.max_user_watches would."""

    budget = 10**9

    def _add_watch(self, path, mask):
        if len(self._wds) >= self.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return super()._add_watch(path, mask)


async def test_watch_limit_polls_uncovered_boxes(tmp_path):
    """At the watch limit: one watch_limit_reached with the sysctl fix, covered boxes stay event-driven,
    uncovered ones are polled, and recheck() covers them once the limit allows."""
    root = tmp_path / "mail"
    for i in range(5):
        (root / f"box-{i}").mkdir(parents=True)
    registry = tmp_path / "sessions"
    registry.mkdir()
    LimitedWatcher.budget = 4  # registry, root, two boxes
    poll = 0.6
    with capture_logs() as logs:
        async with running([root], registry, cls=LimitedWatcher, poll_interval_s=poll) as (w, sink, snap):
            assert snap["boxes_watched"] == 2 and snap["uncovered"] == 3 and snap["polling"] is True
            reached = events(logs, "watch_limit_reached")
            assert len(reached) == 1
            assert re.fullmatch(r"sudo sysctl fs\.inotify\.max_user_watches=\d+", reached[0]["fix"])
            assert "/etc/sysctl.d/" in reached[0]["persist"]
            assert reached[0]["uncovered"] == 3
            covered = [f"box-{i}" for i in range(5) if w.is_watched(root, f"box-{i}")]
            uncovered = [f"box-{i}" for i in range(5) if not w.is_watched(root, f"box-{i}")]
            assert len(covered) == 2

            drop(root / covered[0])
            took = await sink.wait(lambda s: covered[0] in s.boxes(), timeout=FAST)
            assert took < poll / 2

            await trio.sleep(0.05)
            drop(root / uncovered[0])
            took = await sink.wait(lambda s: uncovered[0] in s.boxes(), timeout=poll + 1.0)
            assert sink.watched_when_dirty[(root, uncovered[0])] is False

            (root / "box-new").mkdir()  # hits the limit again: still one log line
            await sink.wait(lambda s: "box-new" in s.boxes())
            assert not w.is_watched(root, "box-new")
            assert len(events(logs, "watch_limit_reached")) == 1

            LimitedWatcher.budget = 10**9
            sink.calls.clear()
            w.recheck()
            snap = w.snapshot()
            assert snap["uncovered"] == 0 and snap["boxes_watched"] == 6 and snap["polling"] is False
            assert set(sink.boxes()) == set(uncovered) | {"box-new"}
            assert events(logs, "watch_limit_recovered")
            sink.calls.clear()
            drop(root / uncovered[1])
            took = await sink.wait(lambda s: uncovered[1] in s.boxes(), timeout=FAST)
            assert took < poll / 2


async def test_nothing_watchable_everything_polled(tmp_path):
    """With no watch at all (limit already exhausted), root, boxes and registry records are all still noticed."""
    root = tmp_path / "mail"
    (root / "alice").mkdir(parents=True)
    registry = tmp_path / "sessions"
    registry.mkdir()
    LimitedWatcher.budget = 0
    try:
        with capture_logs() as logs:
            async with running([root], registry, cls=LimitedWatcher, poll_interval_s=0.2) as (w, sink, snap):
                assert snap["watches"] == 0 and snap["registry"] == "polled"
                assert len(events(logs, "watch_limit_reached")) == 1
                drop(root / "alice")
                await sink.wait(lambda s: "alice" in s.boxes(), timeout=1.5)
                (root / "bob").mkdir()
                await sink.wait(lambda s: "bob" in s.boxes(), timeout=1.5)
                (registry / "1.json").write_text("{}")
                await sink.wait(lambda s: frozenset({"1.json"}) in s.registry(), timeout=1.5)
    finally:
        LimitedWatcher.budget = 10**9



class DeniedWatcher(InotifyWatcher):
    """add_watch fails with EACCES for the paths in `denied`, as for a box this user cannot read."""

    denied: set[str] = set()

    def _add_watch(self, path, mask):
        if path in self.denied:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return super()._add_watch(path, mask)


async def test_box_watch_failure_is_logged_and_retried_at_recheck(tree):
    """A box whose add_watch fails (EACCES) is logged box_watch_failed, the others work, and recheck() retries it."""
    root, registry = tree
    DeniedWatcher.denied = {str(root / "bob")}
    try:
        with capture_logs() as logs:
            async with running([root], registry, cls=DeniedWatcher) as (w, sink, snap):
                assert snap["failed"] == 1 and not w.is_watched(root, "bob")
                failed = events(logs, "box_watch_failed")
                assert [(e["handle"], e["reason"]) for e in failed] == [("bob", "permission")]
                drop(root / "alice")
                await sink.wait(lambda s: "alice" in s.boxes(), timeout=FAST)
                DeniedWatcher.denied = set()
                sink.calls.clear()
                w.recheck()
                assert w.is_watched(root, "bob") and w.snapshot()["failed"] == 0
                assert sink.boxes() == ["bob"]
    finally:
        DeniedWatcher.denied = set()


async def test_two_roots_report_their_own_root(tmp_path):
    """With two mail roots holding the same handle, a drop is reported against the root it landed in."""
    first, second = tmp_path / "one", tmp_path / "two"
    (first / "alice").mkdir(parents=True)
    (second / "alice").mkdir(parents=True)
    (tmp_path / "sessions").mkdir()
    async with running([first, second], tmp_path / "sessions") as (w, sink, snap):
        assert snap["roots_watched"] == 2 and snap["boxes_watched"] == 2
        drop(second / "alice")
        await sink.wait(lambda s: s.boxes(), timeout=FAST)
        await trio.sleep(0.05)
        assert sink.calls == [("box", second, "alice")]

async def test_started_only_after_watches_are_armed(tree):
    """A file dropped right after nursery.start(w.run) returns is always seen."""
    root, registry = tree
    for i in range(10):
        async with running([root], registry) as (w, sink, _):
            drop(root / "alice", f"17000000000{i:02d}-abcdef.json")
            await sink.wait(lambda s: "alice" in s.boxes(), timeout=2)


async def test_cancellation_closes_the_fd(tree):
    """Cancelling run() closes the inotify fd: no descriptor leaks across start/stop."""
    root, registry = tree
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        async with running([root], registry):
            assert len(os.listdir("/proc/self/fd")) == before + 1
    assert len(os.listdir("/proc/self/fd")) == before


class NoInstances(InotifyWatcher):
    def _open(self):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


async def test_instance_limit_is_watcher_unavailable(tree):
    """inotify_init1 failing with EMFILE raises WatcherUnavailable before started(), naming the sysctl fix."""
    root, registry = tree
    w = NoInstances([root], registry, RecordingSink(), structlog.get_logger(), is_box_name=is_box)
    async with trio.open_nursery() as nursery:
        # nursery.start re-raises the task's own exception, as the daemon will see it
        with pytest.raises(WatcherUnavailable, match=r"sysctl fs\.inotify\.max_user_instances=\d+"):
            await nursery.start(w.run)


def test_limits_reads_proc():
    """limits() reports the three kernel limits as integers."""
    got = limits()
    assert set(got) == {"max_user_watches", "max_user_instances", "max_queued_events"}
    assert all(isinstance(v, int) and v > 0 for v in got.values())


IDLE_CHILD = r"""
import sys
from pathlib import Path

import structlog
import trio

from courier.watch_inotify import InotifyWatcher

class Sink:
    def box_dirty(self, root, handle): print("DIRTY", handle, flush=True)
    def registry_dirty(self, names): pass
    def rescan(self, reason): pass

async def main():
    base = Path(sys.argv[1])
    root = base / "mail"
    for i in range(200):
        (root / f"box-{i}" / "read").mkdir(parents=True)
    (base / "claude" / "sessions").mkdir(parents=True)
    w = InotifyWatcher([root], base / "claude" / "sessions", Sink(), structlog.get_logger(), is_box_name=str.isascii)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        print("READY", flush=True)
        await trio.sleep(float(sys.argv[2]))
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def context_switches(pid: int) -> int:
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def test_idle_watcher_does_not_wake(tmp_path):
    """In its own process, a watcher over 200 boxes left idle for 2 s barely context-switches (a 10 ms step would ~200)."""
    env = dict(
        os.environ,
        HOME=str(tmp_path),
        CLAUDE_CONFIG_DIR=str(tmp_path / "claude"),
        HELM_MAIL_DIR=str(tmp_path / "mail"),
        XDG_RUNTIME_DIR=str(tmp_path),
        COURIER_STATE_DIR=str(tmp_path / "state"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE_CHILD, str(tmp_path), "30"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(0.3)  # let start-up settle
        first = context_switches(proc.pid)
        time.sleep(2.0)
        idle = context_switches(proc.pid) - first
        print(f"\nidle context switches over 2 s (200 boxes): {idle}")
        assert idle < 20
        drop(tmp_path / "mail" / "box-7")  # and it is alive, not merely asleep
        assert proc.stdout.readline().strip() == "DIRTY box-7"
    finally:
        proc.kill()
        proc.wait(timeout=10)
