"""The convention on disk: names, handles, derivation, drops, consumes, hostile files."""

import os
import stat

import pytest
from hypothesis import given, settings, strategies as st

from courier import mailbox, safeio


def test_handle_shape():
    for good in ("alice-1234", "a", "proj-x-ab12cd34", "0-0"):
        assert mailbox.valid_handle(good)
    for bad in ("", ".", "..", "../x", "a/b", "-a", "a-", "A-1", "a b", "a\nb", "x" * 201, "é-1", "a_b"):
        assert not mailbox.valid_handle(bad), bad
    with pytest.raises(ValueError):
        mailbox.box_dir(__import__("pathlib").Path("/m"), "../etc")


def test_message_name_shape():
    assert mailbox.valid_message_name("1796027099603-10c291.json")
    for bad in ("owner.json", ".tmp-1.json", "a\n.json", "../x.json", "x.json.tmp", "-x.json", "a b.json", "a/b.json"):
        assert not mailbox.valid_message_name(bad), bad


@given(st.text(max_size=300))
@settings(max_examples=2000)
def test_only_safe_shapes_become_paths(name):
    """Whatever text arrives as a handle, a path is built only from the safe shape, inside the root."""
    from pathlib import Path

    root = Path("/mail/root")
    if mailbox.valid_handle(name):
        p = mailbox.box_dir(root, name)
        assert p.parent == root and "/" not in name and not name.startswith(".")
    else:
        with pytest.raises(ValueError):
            mailbox.box_dir(root, name)


def test_slug_and_tail():
    assert mailbox.slug("My Project!") == "my-project"
    assert mailbox.slug("///") == "agent"
    assert mailbox.tail("0190abcd-1111-2222-3333-444455556666", 4) == "6666"


def test_derive_handle_widens_around_live_holders(tmp_path):
    sid = "0190abcd-1111-2222-3333-4444aabbccdd"
    held = {"repo-ccdd", "repo-bbccdd"}
    assert mailbox.derive_handle(tmp_path, "/src/Repo", sid, lambda h: h in held) == "repo-aabbccdd"
    held.add("repo-aabbccdd")
    assert mailbox.derive_handle(tmp_path, "/src/Repo", sid, lambda h: h in held) == "repo-" + mailbox.slug(sid)
    assert mailbox.derive_handle(tmp_path, "/src/Repo", sid, lambda h: False) == "repo-ccdd"


def test_pinned_and_reserved(tmp_path):
    assert mailbox.derive_handle(tmp_path, "/x", "s-1234", lambda h: False, pinned="My Agent") == "my-agent"
    assert mailbox.derive_handle(tmp_path, "/x", "s-1234", lambda h: False, pinned="Operator") is None


def test_drop_is_atomic_private_and_conventional(tmp_path):
    box = tmp_path / "bob-1"
    box.mkdir()
    p = mailbox.drop_message(tmp_path, "bob-1", sender="alice", subject="s", body="b", now_ms=1700000000000)
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
    assert dst is not None and dst.name != "1-aaaaaa.json"
    assert (box / "read" / "1-aaaaaa.json").read_text() == "OLD"
    assert dst.read_text() == "NEW"
    assert not (box / "1-aaaaaa.json").exists()
    assert mailbox.consume(box, "1-aaaaaa.json") is None  # already gone: lost the race, not an error


def test_consume_finishes_a_half_done_consume(tmp_path):
    box = tmp_path / "b-1"
    (box / "read").mkdir(parents=True)
    (box / "1-bbbbbb.json").write_text("X")
    os.link(box / "1-bbbbbb.json", box / "read" / "1-bbbbbb.json")  # a crash between link and unlink
    assert mailbox.consume(box, "1-bbbbbb.json") == box / "read" / "1-bbbbbb.json"
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
    listing = mailbox.list_box(box)
    assert listing.queued == ("1-aaaaaa.json",)
    assert set(listing.rejected) == {"fifo.json", "pw.json", "dir.json", "bad\nname.json"}


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
