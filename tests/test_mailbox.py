"""The convention on disk: names, handles, derivation, drops, consumes, hostile files."""

from pathlib import Path
import os
import stat

import pytest
from hypothesis import given, settings, strategies as st

from courier import mailbox, safeio


def test_handle_shape():
    for good in ("alice-1234", "a", "proj-x-ab12cd34", "0-0"):
        assert mailbox.valid_handle(good)
    assert mailbox.valid_handle("x" * 255)  # helm has no limit but the filesystem's 255-byte name
    for bad in ("", ".", "..", "../x", "a/b", "-a", "a-", "A-1", "a b", "a\nb", "x" * 256, "é-1", "a_b"):
        assert not mailbox.valid_handle(bad), bad
    with pytest.raises(ValueError):
        mailbox.box_dir(__import__("pathlib").Path("/m"), "../etc")


def test_message_names_are_what_helm_delivers():
    """Every non-hidden *.json but owner.json is mail (helm's rule); only separators and hidden names are not."""
    for good in ("1796027099603-10c291.json", "note.v2.json", "Hello World.json", "_x.json", "résumé.json",
                 "-x.json", "a\n.json", "\udcff-bad.json"):
        assert mailbox.valid_message_name(good), good
    for bad in ("owner.json", ".tmp-1.json", "../x.json", "x.json.tmp", "a/b.json", "x" * 251 + ".json"):
        assert not mailbox.valid_message_name(bad), bad


@given(st.text(max_size=300))
@settings(max_examples=2000)
def test_only_safe_shapes_become_paths(name):
    """Whatever text arrives as a handle, a path is built only from the safe shape, inside the root."""
    from pathlib import Path

    root = Path("/mail/root")
    if mailbox.valid_handle(name):
        p = Path(mailbox.box_dir(root, name))
        assert p.parent == root and "/" not in name and not name.startswith(".")
    else:
        with pytest.raises(ValueError):
            mailbox.box_dir(root, name)


def test_slug_and_tail():
    assert mailbox.slug("My Project!") == "my-project"
    assert mailbox.slug("///") == "agent"
    assert mailbox.tail("0190abcd-1111-2222-3333-444455556666", 4) == "6666"


def test_derive_handle_widens_around_holders_then_takes_the_pid_rung():
    sid = "0190abcd-1111-2222-3333-4444aabbccdd"
    held = {"repo-ccdd", "repo-bbccdd"}

    def derive(**kw):
        return mailbox.derive_handle("/src/Repo", sid, lambda h: h in held, pid=42, **kw)

    assert derive() == ("repo-aabbccdd", None)
    held.add("repo-aabbccdd")
    assert derive() == ("repo-" + mailbox.slug(sid), None)
    held.add("repo-" + mailbox.slug(sid))
    assert derive() == ("repo-" + mailbox.slug(sid) + "-42", None)  # helm #262: never the held rung again
    held.add("repo-" + mailbox.slug(sid) + "-42")
    with pytest.raises(LookupError):  # the caller adds randomness; nothing is ever overwritten
        derive()
    assert mailbox.derive_handle("/src/Repo", sid, lambda h: False, pid=1) == ("repo-ccdd", None)


def test_pinned_reserved_and_held_pins_fall_back_to_the_ladder():
    free = lambda h: False  # noqa: E731
    assert mailbox.derive_handle("/x", "s-1234", free, pid=1, pinned="My Agent") == ("my-agent", None)
    assert mailbox.derive_handle("/x", "s-1234", free, pid=1, pinned="Operator") == ("x-1234", "pin_reserved")
    assert mailbox.derive_handle("/x", "s-1234", lambda h: h == "my-agent", pid=1, pinned="My Agent") == (
        "x-1234", "pin_held")
    assert mailbox.derive_handle("/x", "s-1234", free, pid=1, pinned="!!!") == ("agent", None)


def test_long_folder_names_match_helm_until_the_filesystem_limit():
    sid = "019fc78b-f108-7c69-b602-1d44f7639531"
    assert len(mailbox.ladder("/w/" + "a" * 150, sid, 1)[0]) == 155  # helm: 150 + "-" + 4
    assert len(mailbox.ladder("/w/" + "a" * 199, sid, 1)[0]) == 204
    long = mailbox.ladder("/w/" + "a" * 400, sid, 1)
    assert all(len(h) <= 255 and h.endswith(t) for h, t in zip(long, ("9531", "639531", "f7639531")))


def test_drop_is_atomic_private_and_conventional(tmp_path):
    box = tmp_path / "bob-1"
    box.mkdir()
    p = Path(mailbox.drop_message(tmp_path, "bob-1", sender="alice", subject="s", body="b", now_ms=1700000000000))
    assert p.parent == box and mailbox.valid_message_name(p.name)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    data = safeio.read_json_object(p, 1 << 20)
    assert data == {"id": p.stem, "from": "alice", "to": "bob-1", "subject": "s", "body": "b", "sentAt": 1700000000000}
    assert [n for n in os.listdir(box) if n.startswith(".tmp")] == []


def test_consume_never_overwrites_an_archived_message(tmp_path):
    box = tmp_path / "b-1"
    (box / "read").mkdir(parents=True)
    (box / "read" / "1-aaaaaa.json").write_text("OLD")
    (box / "1-aaaaaa.json").write_text("NEW")
    dst = mailbox.consume(box, "1-aaaaaa.json")
    assert dst is not None
    dst = Path(dst)
    assert dst.name != "1-aaaaaa.json"
    assert (box / "read" / "1-aaaaaa.json").read_text() == "OLD"
    assert dst.read_text() == "NEW"
    assert not (box / "1-aaaaaa.json").exists()
    assert mailbox.consume(box, "1-aaaaaa.json") is None  # already gone: lost the race, not an error


def test_consume_finishes_a_half_done_consume(tmp_path):
    box = tmp_path / "b-1"
    (box / "read").mkdir(parents=True)
    (box / "1-bbbbbb.json").write_text("X")
    os.link(box / "1-bbbbbb.json", box / "read" / "1-bbbbbb.json")  # a crash between link and unlink
    assert mailbox.consume(box, "1-bbbbbb.json") == str(box / "read" / "1-bbbbbb.json")
    assert not (box / "1-bbbbbb.json").exists()


def test_listing_skips_hostile_entries(tmp_path):
    box = tmp_path / "b-1"
    (box / "read").mkdir(parents=True)
    (box / "1-aaaaaa.json").write_text("{}")
    (box / ".tmp-x").write_text("{}")
    (box / "owner.json").write_text("{}")
    os.mkfifo(box / "fifo.json")
    os.symlink("/etc/passwd", box / "pw.json")
    (box / "dir.json").mkdir()
    (box / "bad\nname.json").write_text("{}")
    (box / "notes.txt").write_text("x")
    os.link(box / "1-aaaaaa.json", tmp_path / "elsewhere.json")  # a hard link to a file outside
    (box / "2-bbbbbb.json").write_text("{}")
    listing = mailbox.list_box(box)
    assert listing.queued == ("2-bbbbbb.json", "bad\nname.json")
    assert dict(listing.refused) == {"fifo.json": "not_regular", "pw.json": "symlink", "dir.json": "directory",
                                     "1-aaaaaa.json": "hard_linked"}


def test_box_symlink_is_not_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "1-aaaaaa.json").write_text("{}")
    os.symlink(real, tmp_path / "link-1")
    with pytest.raises(OSError):
        mailbox.list_box(tmp_path / "link-1")
    handles, skipped = mailbox.list_handles(tmp_path)
    assert "link-1" not in handles and "link-1" in skipped


def test_read_bounded_refuses_fifo_symlink_and_big(tmp_path):
    os.mkfifo(tmp_path / "f.json")
    with pytest.raises(safeio.Unsafe) as e:
        safeio.read_bounded(tmp_path / "f.json", 100)
    assert e.value.reason == "not_regular"
    os.symlink("/etc/passwd", tmp_path / "l.json")
    with pytest.raises(safeio.Unsafe) as e:
        safeio.read_bounded(tmp_path / "l.json", 100)
    assert e.value.reason == "symlink"
    (tmp_path / "big.json").write_bytes(b"x" * 101)
    with pytest.raises(safeio.Unsafe) as e:
        safeio.read_bounded(tmp_path / "big.json", 100)
    assert e.value.reason == "too_large"


@given(st.binary(max_size=2000))
@settings(max_examples=500, deadline=None)
def test_owner_parsing_never_crashes(tmp_path_factory, raw):
    d = tmp_path_factory.mktemp("o")
    (d / "owner.json").write_bytes(raw)
    try:
        o = mailbox.read_owner(d)
    except safeio.Unsafe:
        return
    assert o.pid is None or (isinstance(o.pid, int) and o.pid > 0)
