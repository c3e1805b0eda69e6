"""The wake cap's arithmetic with plain numbers (no clock), and its persistence."""

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from courier import wakecap
from courier.wakecap import Level


def test_three_quick_pokes_then_capped():
    lvl, now = wakecap.ZERO, 1000.0
    for _ in range(3):
        assert wakecap.allowed(lvl, now, 3, 600)
        lvl = wakecap.after_wake(lvl, now, 600)
    assert not wakecap.allowed(lvl, now, 3, 600)
    when = wakecap.allowed_at(lvl, now, 3, 600)
    # 3 must decay to 2 (within the tolerance): about 600 * log2(3/2) seconds.
    assert math.isclose(when - now, 600 * math.log2(3 / (2 + wakecap.TOLERANCE)), rel_tol=1e-9)
    assert wakecap.allowed(lvl, when + 1e-6, 3, 600)
    assert not wakecap.allowed(lvl, when - 1, 3, 600)
    assert 345 < when - now < 352


def test_half_life():
    assert math.isclose(wakecap.level_at(Level(4.0, 0.0), 600.0, 600.0), 2.0)
    assert wakecap.level_at(Level(4.0, 10.0), 5.0, 600.0) == 4.0  # clock going backwards never raises it


@given(
    levels=st.floats(0, 50, allow_nan=False),
    cap=st.integers(1, 20),
    half=st.floats(1, 1e5, allow_nan=False),
    dt=st.floats(0, 1e6, allow_nan=False),
)
def test_allowed_at_is_exact_and_monotone(levels, cap, half, dt):
    lvl = Level(levels, 0.0)
    when = wakecap.allowed_at(lvl, dt, cap, half)
    assert when >= dt
    assert wakecap.allowed(lvl, when * (1 + 1e-9) + 1e-9, cap, half)
    assert wakecap.level_at(lvl, dt + 1, half) <= wakecap.level_at(lvl, dt, half)


@given(st.lists(st.floats(0, 7200, allow_nan=False), max_size=200), st.integers(1, 6))
@settings(max_examples=300)
def test_level_never_exceeds_cap_whatever_the_poke_times(times, cap):
    """Whatever a ping-pong tries, pokes that pass the cap never lift the level above it."""
    lvl = wakecap.ZERO
    for t in sorted(times):
        if wakecap.allowed(lvl, t, cap, 600):
            lvl = wakecap.after_wake(lvl, t, 600)
            assert lvl.value <= cap + wakecap.TOLERANCE


def test_operator_turn_resets(tmp_path):
    lvl = Level(3.0, 100.0)
    assert wakecap.apply_operator_turn(lvl, None) is lvl
    assert wakecap.apply_operator_turn(lvl, 50.0) is lvl  # older turn: no reset
    assert wakecap.apply_operator_turn(lvl, 150.0).value == 0.0
    wakecap.record_operator_turn(tmp_path, "alice-1", now=123.0)
    assert wakecap.operator_turn_at(tmp_path, "alice-1") == 123.0
    assert wakecap.operator_turn_at(tmp_path, "nobody-1") is None
    # By session: a turn in the session counts for every box it owns.
    wakecap.record_operator_turn(tmp_path, "alice-1", "0190-aaaa", now=200.0)
    assert wakecap.operator_turn_at(tmp_path, "other-box-1", "0190-aaaa") == 200.0
    # A hostile session id never names a file.
    wakecap.record_operator_turn(tmp_path, None, "../../etc/x", now=300.0)
    assert not (tmp_path.parent / "etc").exists()
    assert wakecap.operator_turn_names(None, "../x") == []


def test_hostile_operator_turn_files_are_ignored(tmp_path):
    """A 400-digit number, NaN or a nested bomb in an operator-turn file: no turn, no crash."""
    d = tmp_path / wakecap.OPERATOR_DIR
    d.mkdir()
    for content in (b'{"at": ' + b"9" * 400 + b"}", b'{"at": NaN}', b"[" * 100000, b'{"at": 1e999}'):
        (d / "bob-1").write_bytes(content)
        assert wakecap.operator_turn_at(tmp_path, "bob-1") is None


def test_persistence_round_trip_and_missing_file(tmp_path):
    table, problem = wakecap.load(tmp_path, 3, 10.0)
    key = wakecap.session_key("0190-aaaa")
    assert problem is None and table.get(key).value == 0
    table.levels[key] = Level(2.5, 9.0)
    table.last_ring["a-1"] = 9.0
    table.ring = 41
    wakecap.save(tmp_path, table)
    again, problem = wakecap.load(tmp_path, 3, 10.0)
    assert problem is None
    assert again.get(key) == Level(2.5, 9.0) and again.ring == 41 and again.last_ring["a-1"] == 9.0
    assert oct((tmp_path / "wakecap.json").stat().st_mode & 0o777) == "0o600"


def test_per_box_state_of_version_1_is_migrated(tmp_path):
    """Levels saved per box by an older courier load as `box:` keys (merged into the session at its next look)."""
    (tmp_path / "wakecap.json").write_text(json.dumps(
        {"version": 1, "ring": 7, "default": {"level": 0, "at": 0},
         "boxes": {"a-1": {"level": 2.0, "at": 100.0, "lastRing": 100.0}}}))
    table, problem = wakecap.load(tmp_path, 3, 110.0)
    assert problem is None and table.ring == 7
    assert table.get(wakecap.box_key("a-1")) == Level(2.0, 100.0) and table.last_ring["a-1"] == 100.0
    merged = wakecap.merge(Level(1.0, 100.0), table.get(wakecap.box_key("a-1")), 100.0, 600)
    assert merged == Level(2.0, 100.0)


def test_corrupt_state_is_conservative(tmp_path):
    """A corrupt state file: every recipient starts at the cap, decaying from now (a crash loop cannot reset the brake)."""
    for content in (b"{not json", b"[]", json.dumps({"version": 1, "boxes": {"../x": {}}}).encode(), b"\xff\xfe",
                    b'{"version": 2, "ring": ' + b"9" * 400 + b"}", b"[" * 60000,
                    json.dumps({"version": 2, "recipients": {"session:../x": {"level": 1, "at": 1}}}).encode()):
        (tmp_path / "wakecap.json").write_bytes(content)
        table, problem = wakecap.load(tmp_path, 3, 500.0)
        assert problem
        assert table.get("anyone-1") == Level(3.0, 500.0)
        assert not wakecap.allowed(table.get("anyone-1"), 500.0, 3, 600)


def test_is_doorbell():
    from courier import doorbell

    assert doorbell.is_doorbell(doorbell.text(1, 2, "/m/x"))
    assert not doorbell.is_doorbell("please fix the bug")
    assert not doorbell.is_doorbell(None)


def test_decayed_levels_are_forgotten_but_never_an_operator_reset_under_a_high_default(tmp_path):
    """Found by the soak benchmark: the level table grew with every session ever woken. A level decayed to
    nothing is dropped (an unknown recipient starts at 0 anyway); under the conservative default of a corrupt
    state, nothing is dropped, since a low level (an operator's reset) says more than the default."""
    import structlog

    from courier import state

    store = state.StateStore(tmp_path, structlog.get_logger(), cap=3, half_life=600.0)
    store.table.levels = {"session:old": Level(1.0, 0.0), "session:recent": Level(2.0, 10_000.0)}
    assert store.prune(10_000.0) == 1 and set(store.table.levels) == {"session:recent"}
    store.table.default = Level(3.0, 10_000.0)
    store.table.levels["session:reset"] = Level(0.0, 10_000.0)
    assert store.prune(10_000.0) == 0 and "session:reset" in store.table.levels


@pytest.mark.parametrize("session_id", ["sess with space", "a/b", "x" * 201, "ends-in-newline\n"])
def test_a_session_id_that_cannot_name_a_key_counts_against_its_box_and_survives_a_restart(tmp_path, session_id):
    """Found in review: the daemon keyed every level `session:<id>` unchecked; one odd id (from a hostile
    record or owner.json) made the saved table fail to load, so after a restart every recipient started at the
    cap. Such a session's wakes count against its box, are capped, and the file round-trips."""
    import structlog

    from courier import state

    key = wakecap.recipient_key(session_id, "odd-1")
    assert key == wakecap.box_key("odd-1")
    assert wakecap.recipient_key("0190-good", "odd-1") == wakecap.session_key("0190-good")
    store = state.StateStore(tmp_path, structlog.get_logger(), cap=3, half_life=600.0)
    for _ in range(3):
        store.woke(key, "odd-1", store.level(key, "odd-1", session_id, 100.0), 100.0)
    assert not wakecap.allowed(store.level(key, "odd-1", session_id, 100.0), 100.0, 3, 600.0)  # kept, not popped
    store.table.levels["session:0190-good"] = Level(1.0, 100.0)
    store.table.levels[wakecap.session_key(session_id)] = Level(1.0, 100.0)  # as the old daemon wrote it
    wakecap.save(tmp_path, store.table)
    again, problem = wakecap.load(tmp_path, 3, 100.0)
    assert problem is None
    assert again.get("session:0190-good").value == 1.0
    assert again.get(key).value >= 3.0 - 1e-9  # the odd session is still capped after the restart


def test_old_operator_turns_and_hints_are_pruned_and_links_left_alone(tmp_path):
    """Found in review: one operator-turn file and one hint per session ever seen, kept forever. The daemon's
    full pass removes turns older than a day and hints older than a month; never what a link points at."""
    import os

    from courier import paths, state

    turns, hints = tmp_path / wakecap.OPERATOR_DIR, tmp_path / paths.HINT_DIR
    turns.mkdir()
    hints.mkdir()
    now = 10_000_000.0
    for d, name, age in ((turns, "s-old", 86_401), (turns, "s-new", 60), (hints, "old", 31 * 86_400),
                         (hints, "week", 7 * 86_400)):
        (d / name).write_text("{}")
        os.utime(d / name, (now - age, now - age))
    outside = tmp_path / "keep.json"
    outside.write_text("{}")
    os.utime(outside, (0, 0))
    (turns / "s-link").symlink_to(outside)
    assert state.prune_files(tmp_path, now) == 2
    assert sorted(os.listdir(turns)) == ["s-link", "s-new"] and os.listdir(hints) == ["week"]
    assert outside.exists()
    assert state.prune_files(tmp_path / "missing", now) == 0
