"""Faults the way real systems break: full disks, lost watcher events, huge boxes, odd names, symlinked boxes, fuzzed input."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from courier import config, hooks, mailbox
from conftest import wait_for

# CI runs a short profile; COURIER_FUZZ=long runs >= 10,000 examples per target.
FUZZ = int(os.environ.get("COURIER_FUZZ_EXAMPLES", "10000" if os.environ.get("COURIER_FUZZ") == "long" else "300"))


def test_disk_full_state_keeps_running(env, fake_session, daemon):
    """ENOSPC when writing state: logged once, the daemon keeps ringing on its in-memory state."""
    state = env.root / "full"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=64", "tmpfs", str(state)], capture_output=True).returncode:
        pytest.skip("cannot mount a tiny tmpfs here (needs root)")
    try:
        fs = fake_session("sess-full")
        box = env.claim("full-0001", fs.pid, "sess-full")
        d = daemon("--state-dir", str(state), "--min-poke-interval", "0.05s")
        try:
            with open(state / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass  # full (or out of inodes): exactly what we want
        env.drop("full-0001")
        d.wait_event("state_write_failed", reason="ENOSPC", timeout=5)
        for name in mailbox.list_box(box).queued:
            mailbox.consume(box, name)
        d.wait_event("doorbell_rearmed", handle="full-0001")
        env.drop("full-0001")
        wait_for(lambda: len(fs.lines()) == 2, what="second ring with a full disk")
        assert d.proc.poll() is None
        assert len(d.events("state_write_failed")) == 1
        assert d.stop() == 0
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)


async def test_lost_watcher_events_are_caught_by_the_rescan(tmp_path, monkeypatch):
    """Events lost (an overflow, a blind watcher): the safety rescan still rings within its period."""
    import socket
    import threading

    from courier import daemon as dmod, log

    mail = tmp_path / "m"
    mail.mkdir(mode=0o700)
    socks = tmp_path / "cc"
    socks.mkdir(mode=0o700)
    reg = tmp_path / "c" / "sessions"
    reg.mkdir(parents=True)
    sock_path = socks / f"{os.getpid()}.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_path))
    srv.listen(4)
    got = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            data = b""
            while chunk := c.recv(4096):
                data += chunk
            got.append((time.monotonic(), data))
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    from courier import registry

    (reg / f"{os.getpid()}.json").write_text(json.dumps({
        "pid": os.getpid(), "sessionId": "S", "procStart": registry.proc_start(os.getpid()),
        "pidDomain": registry.own_pid_domain(), "messagingSocketPath": str(sock_path), "peerProtocol": 1}))
    (mail / "lost-1" / "read").mkdir(parents=True)
    (mail / "lost-1" / "owner.json").write_text(json.dumps({"runtime": "claude", "pid": os.getpid(), "sessionId": "S"}))
    cfg = config.Config(mail_root=mail, claude_config_dir=tmp_path / "c", state_dir=tmp_path / "s",
                        rescan_interval_s=1.0).validated()
    log.configure("json", "error")
    d = dmod.Daemon(cfg, log.get())

    class Blind:
        """A watcher whose every event was lost (an overflow nobody reported)."""

        name = "blind"

        async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
            task_status.started({"watcher": self.name})
            await trio.sleep_forever()

        def recheck(self):
            pass

        def complete(self):
            return False  # it cannot tell what it lost

    d.watcher = Blind()
    async with trio.open_nursery() as n:
        await n.start(d.run)
        t0 = time.monotonic()
        mailbox.drop_message(mail, "lost-1", sender="x", subject="y", body="z")
        with trio.move_on_after(3):
            while not got:
                await trio.sleep(0.02)
        n.cancel_scope.cancel()
    srv.close()
    assert got, "the rescan must ring"
    assert got[0][0] - t0 <= 1.5


@pytest.mark.slow
def test_hundred_thousand_files_in_one_box(env, fake_session, daemon):
    fs = fake_session("sess-big")
    box = env.claim("big-0001", fs.pid, "sess-big")
    payload = json.dumps({"id": "x", "from": "f", "to": "big-0001", "subject": "s", "body": "b", "sentAt": 1})
    for i in range(100_000):
        with open(box / f"{1700000000000 + i}-aaaaaa.json", "w") as f:
            f.write(payload)
    t = time.monotonic()
    d = daemon()
    ready = time.monotonic() - t
    line = wait_for(fs.lines, timeout=20)[0]
    assert "100000 new messages" in line["message"]["content"]
    print(f"100,000 files: ready after {ready:.2f}s")


def test_odd_names_are_mail_and_a_symlinked_box_is_not_followed(env, fake_session, daemon):
    """Names helm delivers (undecodable bytes, newlines) are rung like any mail; a box that is a symlink is
    never followed: reported once, never rung, its owner.json never read."""
    fs = fake_session("sess-odd")
    target = env.root / "elsewhere"
    target.mkdir()
    (target / "1-aaaaaa.json").write_text("{}")
    (target / "owner.json").write_text(json.dumps({"runtime": "claude", "pid": fs.pid, "sessionId": "sess-odd"}))
    os.symlink(target, env.mail / "link-0001")
    d = daemon()
    assert d.wait_event("box_name_rejected")
    # Built aside and moved in whole, so the one ring counts both messages.
    staging = env.root / "staging"
    staging.mkdir()
    box = env.claim("odd-0001", fs.pid, "sess-odd")
    os.rename(box, staging / "odd-0001")
    aside = staging / "odd-0001"
    os.close(os.open(os.path.join(os.fsencode(aside), b"\xff\xfe-bad.json"), os.O_CREAT | os.O_WRONLY, 0o600))
    (aside / "new\nline.json").write_text("{}")
    os.rename(aside, box)
    line = wait_for(fs.lines)[0]
    assert "2 new messages" in line["message"]["content"] and "odd-0001" in line["message"]["content"]
    assert all("link-0001" not in l["message"]["content"] for l in fs.lines())
    assert d.proc.poll() is None


# ---------------------------------------------------------------- fuzzing

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=6),
    max_leaves=25,
)
# The shapes issue #12 found in the wild: nesting past any recursion limit, numbers no float holds, JSON's
# forbidden constants, lone surrogates, invalid UTF-8, huge strings, wrong types, spliced into real JSON.
POISON = st.one_of(
    st.integers(65, 120_000).map(lambda n: b"[" * n),
    st.integers(25, 500).map(lambda n: b'{"pid": ' + b"9" * n + b', "sessionId": "S", "claimedAt": 1}'),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"]).map(
        lambda c: b'{"pid": 7, "sessionId": "S", "runtime": "claude", "claimedAt": ' + c + b"}"),
    st.sampled_from([b"\\ud800", b"\\udfff", b"\\ud83d"]).map(
        lambda u: b'{"sessionId": "' + u + b'", "from": "' + u + b'", "subject": "' + u + b'"}'),
    st.binary(min_size=1, max_size=64).map(lambda b: b'{"from": "\xff' + b + b'"}'),
    st.integers(1 << 16, 2 << 20).map(lambda n: b'{"body": "' + b"a" * n + b'"}'),
    JSON.map(lambda v: json.dumps({"pid": v, "sessionId": v, "runtime": v, "from": v, "subject": v}).encode()),
)
FILE = st.one_of(POISON, st.binary(max_size=3000), JSON.map(lambda v: json.dumps(v).encode()),
                 st.fixed_dictionaries({"from": st.text().filter(lambda t: "ZQXBODY" not in t),
                                        "subject": st.text().filter(lambda t: "ZQXBODY" not in t),
                                        "body": st.text(min_size=1).map(lambda t: "ZQXBODY" + t)}).map(
                     lambda d: json.dumps(d).encode()))


@given(files=st.lists(FILE, min_size=1, max_size=4), names=st.lists(st.text(min_size=1, max_size=30), max_size=3))
@settings(max_examples=FUZZ, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_deliver_never_crashes_escapes_or_leaks(tmp_path_factory, files, names):
    """Arbitrary message bytes and names: deliver exits 0, shows only paths inside the box's read/, never a body,
    stays bounded, and loses nothing (shown = moved, the rest untouched)."""
    root = tmp_path_factory.mktemp("fz")
    env = {"HELM_MAIL_DIR": str(root / "m"), "COURIER_STATE_DIR": str(root / "s"),
           "CLAUDE_CONFIG_DIR": str(root / "c"), "HOME": str(root)}
    box = root / "m" / "fz-0001"
    (box / "read").mkdir(parents=True)
    (box / "owner.json").write_text(json.dumps({"handle": "fz-0001", "runtime": "claude", "pid": 1, "sessionId": "S"}))
    for i, raw in enumerate(files):
        (box / f"{i}-aaaaaa.json").write_bytes(raw)
    for n in names:
        try:
            (box / (n.replace("/", "_").replace("\0", "_")[:60] + ".json")).write_bytes(b"{}")
        except (OSError, ValueError):
            pass
    before = {p.name: p.read_bytes() for p in box.iterdir() if p.is_file()}
    out = io.StringIO()
    rc = hooks.main("deliver", env=env, stdin=io.StringIO(json.dumps({"session_id": "S", "prompt": "p"})), stdout=out)
    assert rc == 0
    text = out.getvalue()
    assert len(text.encode()) <= hooks.NOTICE_MAX_BYTES
    for line in text.splitlines():
        if line.startswith("    /"):
            assert line.strip().startswith(str(box / "read") + "/")
    assert "ZQXBODY" not in text, "a body reached the notice"
    after_box = {p.name: p.read_bytes() for p in box.iterdir() if p.is_file()}
    after_read = {p.name: p.read_bytes() for p in (box / "read").iterdir()}
    for name, data in before.items():
        assert after_box.get(name) == data or after_read.get(name) == data, "nothing lost or altered"


@given(owner_raw=POISON, record_raw=POISON)
@settings(max_examples=FUZZ, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_poison_bytes_in_owner_record_and_state(tmp_path_factory, owner_raw, record_raw):
    """Poisoned bytes as owner.json, as a registry record and as the wake state: resolution, the wake state
    and both hooks never raise; a poisoned owner or record is an Unreachable with a reason."""
    from courier import registry, resolve, wakecap

    root = tmp_path_factory.mktemp("fp")
    box = root / "m" / "fp-0001"
    (box / "read").mkdir(parents=True)
    (box / "owner.json").write_bytes(owner_raw)
    reg = root / "c" / "sessions"
    reg.mkdir(parents=True)
    (reg / f"{os.getpid()}.json").write_bytes(record_raw)
    (root / "s").mkdir()
    (root / "s" / "wakecap.json").write_bytes(record_raw)
    _owner, result = resolve.resolve_box(root / "m", reg, "fp-0001", registry.SessionIndex.build(reg),
                                         registry.own_pid_domain())
    assert isinstance(result, resolve.Unreachable) and result.reason
    table, problem = wakecap.load(root / "s", 3, 100.0)
    assert problem is None or table.get("session:x").value == 3.0
    env = {"HELM_MAIL_DIR": str(root / "m"), "COURIER_STATE_DIR": str(root / "s"), "CLAUDE_CONFIG_DIR": str(root / "c"),
           "HOME": str(root)}
    for verb in ("claim", "deliver"):
        payload = json.dumps({"session_id": "S", "cwd": "/w/fp", "prompt": "x", "source": "resume"})
        assert hooks.main(verb, env=env, stdin=io.StringIO(payload), stdout=io.StringIO()) == 0


@given(owner=JSON, record=JSON)
@settings(max_examples=FUZZ, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_owner_and_record_resolution(tmp_path_factory, owner, record):
    """Arbitrary owner.json and registry records: resolution never raises, and a target is only ever the owner's
    own session, at the pid of a record naming it."""
    root = tmp_path_factory.mktemp("fr")
    (root / "m" / "fr-0001").mkdir(parents=True)
    (root / "m" / "fr-0001" / "owner.json").write_text(json.dumps(owner))
    reg = root / "c" / "sessions"
    reg.mkdir(parents=True)
    pid = owner.get("pid") if isinstance(owner, dict) and isinstance(owner.get("pid"), int) and 0 < owner["pid"] < 2**22 else os.getpid()
    (reg / f"{pid}.json").write_text(json.dumps(record))
    cfg = config.Config(mail_root=root / "m", claude_config_dir=root / "c", state_dir=root / "s")
    from courier import registry, resolve

    _owner, result = resolve.resolve_box(cfg.mail_root, reg, "fr-0001", registry.SessionIndex.build(reg),
                                         registry.own_pid_domain())
    assert isinstance(result, (resolve.Target, resolve.Unreachable))
    if isinstance(result, resolve.Target):
        assert isinstance(owner, dict) and owner.get("runtime") == "claude" and owner.get("retiredAt") is None
        assert result.session_id == owner["sessionId"] == record["sessionId"]
        assert result.pid == record["pid"] == pid


@given(st.text(max_size=200))
@settings(max_examples=FUZZ, deadline=None)
def test_fuzz_doorbell_text_never_carries_input(s):
    """The doorbell is built from numbers and a validated handle only; arbitrary text cannot reach it."""
    from courier import doorbell

    if mailbox.valid_handle(s):
        text = doorbell.text(1, 1, f"/m/{s}")
        assert s in text  # the handle is the only variable text, and it is a safe slug
    else:
        with pytest.raises(ValueError):
            mailbox.box_dir(Path("/m"), s)
