"""`courier send` and `courier.send`: the convention written exactly, bodies bounded, several matches and retired
boxes refused, the secret backstop both ways through the CLI (never echoing a secret), and an end-to-end send by
path into a live fake session that gets rung by a running daemon.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from test_address import World, _run_cli
from test_secretscan import CONTEXTS, ORDINARY, SHAPES

import courier
from courier import api, secretscan

NAME_RE = re.compile(r"^[0-9]{13}-[0-9a-f]{6}\.json$")


def courier_cli(env, *args, input=None, cwd=None, extra=None):
    e = env.vars()
    e.update(extra or {})
    return subprocess.run([sys.executable, "-m", "courier", *args], check=False, env=e, capture_output=True, text=True,
                          input=input, timeout=60, cwd=cwd)


@pytest.fixture
def world(env, monkeypatch):
    monkeypatch.setenv("HOME", str(env.home))
    w = World(env)
    yield w
    w.stop()


def queued(env, handle: str) -> list[Path]:
    return sorted(p for p in (env.mail / handle).iterdir() if p.name.endswith(".json") and p.name != "owner.json")


# ---------------------------------------------------------------- the convention


def test_send_writes_exactly_the_convention(env, world):
    """One `<millis>-<6hex>.json`, mode 0600, {id, from, to, subject, body, sentAt}, id = name, no temp left."""
    world.session("conv-0001", "conv-session-1", world.dir("conv"))
    p = courier_cli(env, "send", "conv-0001", "--from", "me-1", "--subject", "hi there", "--body", "line1\nline2 é")
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.strip())
    assert path.parent == env.mail / "conv-0001" and NAME_RE.match(path.name)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    msg = json.loads(path.read_text())
    assert list(msg) == ["id", "from", "to", "subject", "body", "sentAt"]
    assert msg["id"] == path.name[:-5] and msg["to"] == "conv-0001" and msg["from"] == "me-1"
    assert (msg["subject"], msg["body"]) == ("hi there", "line1\nline2 é")
    assert msg["sentAt"] == int(path.name.split("-")[0])
    assert not [n for n in os.listdir(path.parent) if n.startswith(".tmp")]
    assert "conv-0001 is a handle" in p.stderr and "live" in p.stderr


def test_json_output_and_all(env, world):
    """--json prints {path, id, handle, rule}; several matches are refused, --all writes one file (own id) to each."""
    twin = world.dir("twin")
    world.session("tw-0001", "twin-session-1", twin)
    world.session("tw-0002", "twin-session-2", twin)
    p = courier_cli(env, "send", str(twin), "--body", "x")
    assert p.returncode == 2 and "tw-0001" in p.stderr and "tw-0002" in p.stderr and "--all" in p.stderr
    assert not queued(env, "tw-0001") and not queued(env, "tw-0002")
    p = courier_cli(env, "send", "./twin", "--all", "--json", "--body", "x", cwd=world.w)
    sent = json.loads(p.stdout)
    assert p.returncode == 0 and [s["handle"] for s in sent] == ["tw-0001", "tw-0002"]
    assert {s["rule"] for s in sent} == {"cwd"} and len({s["id"] for s in sent}) == 2
    for s in sent:
        assert set(s) == {"path", "id", "handle", "rule"}
        assert json.loads(Path(s["path"]).read_text())["id"] == s["id"]
    one = json.loads(courier_cli(env, "send", "tw-0001", "--json", "--body", "x").stdout)
    assert isinstance(one, dict) and one["rule"] == "handle"


def test_retired_box_is_refused_naming_the_live_box(env, world):
    """A retired box: exit 2, nothing written, and the live box of the same session (else the same cwd) is named."""
    proj = world.dir("proj")
    pid = world.session("proj-new1", "new-session-0001", proj)
    env.claim("proj-old1", 4000009, "old-session-0001", cwd=str(proj), retiredAt=5)
    env.claim("proj-same", pid, "new-session-0001", cwd="/elsewhere", retiredAt=5)
    p = courier_cli(env, "send", "proj-old1", "--body", "x")
    assert p.returncode == 2 and "retired" in p.stderr and "proj-new1" in p.stderr
    p = courier_cli(env, "send", "proj-same", "--body", "x")
    assert p.returncode == 2 and "proj-new1" in p.stderr
    env.claim("lonely-1", 4000010, "lonely-session", cwd="/nowhere", retiredAt=5)
    p = courier_cli(env, "send", "lonely-1", "--body", "x")
    assert p.returncode == 2 and "instead" not in p.stderr
    assert not queued(env, "proj-old1") and not queued(env, "lonely-1")


def test_no_match_names_the_closest_and_create_makes_a_box(env, world):
    world.session("api-3f2a", "3f2a9c00-0000-4000-8000-000000000001", world.dir("api"))
    p = courier_cli(env, "send", "api-3f2b", "--body", "x")
    assert p.returncode == 2 and "api-3f2a" in p.stderr and "--create" in p.stderr
    p = courier_cli(env, "send", "api-3f2b", "--body", "x", "--create", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["rule"] == "new box"
    assert (env.mail / "api-3f2b" / "read").is_dir()
    p = courier_cli(env, "send", "3F2A9C", "--body", "x", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["handle"] == "api-3f2a"


def test_body_sources_and_bounds(env, world):
    """--body-file, stdin and `--body-file -` give the body; a FIFO or directory is refused; too large exits 1."""
    world.session("body-0001", "body-session-1", world.dir("b"))
    f = env.root / "body.txt"
    f.write_text("from a file")
    for args, stdin, expected in [
        (["--body-file", str(f)], None, "from a file"),
        ([], "from stdin", "from stdin"),
        (["--body-file", "-"], "dash stdin", "dash stdin"),
    ]:
        p = courier_cli(env, "send", "body-0001", *args, input=stdin)
        assert p.returncode == 0, p.stderr
        assert json.loads(Path(p.stdout.strip()).read_text())["body"] == expected
    fifo = env.root / "fifo"
    os.mkfifo(fifo)
    assert courier_cli(env, "send", "body-0001", "--body-file", str(fifo)).returncode == 2
    assert courier_cli(env, "send", "body-0001", "--body-file", str(env.root)).returncode == 2
    p = courier_cli(env, "send", "body-0001", input="x" * (2 << 20))
    assert p.returncode == 1 and "larger" in p.stderr
    p = courier_cli(env, "send", "body-0001", "--subject", "two\nlines", "--body", "x")
    assert p.returncode == 2 and "one line" in p.stderr
    assert len(queued(env, "body-0001")) == 3


def test_symlinked_box_is_refused(env, world):
    """A box planted as a symlink is addressable by name but never written through."""
    elsewhere = env.root / "elsewhere"
    (elsewhere / "read").mkdir(parents=True)
    os.symlink(elsewhere, env.mail / "link-0001")
    p = courier_cli(env, "send", "link-0001", "--body", "x")
    assert p.returncode == 1 and "symlink" in p.stderr
    assert os.listdir(elsewhere) == ["read"]


def test_non_utf8_argument_exits_2(env, world):
    world.session("utf-0001", "utf-session-1", world.dir("u"))
    e = env.vars()
    p = subprocess.run([sys.executable, "-m", "courier", "send", b"utf-\xff", "--body", "x"], check=False, env=e,
                       capture_output=True, timeout=60)
    assert p.returncode == 2 and b"UTF-8" in p.stderr


def test_sender_defaults_to_this_sessions_box(env, world):
    """Without --from or $HELM_MAIL_HANDLE, a Claude session signs with its own box's handle."""
    world.session("to-0001", "to-session-1", world.dir("to"))
    world.session("me-0001", "me-session-1", world.dir("me"))
    p = courier_cli(env, "send", "to-0001", "--body", "x", extra={"CLAUDE_CODE_SESSION_ID": "me-session-1"})
    assert json.loads(Path(p.stdout.strip()).read_text())["from"] == "me-0001"
    p = courier_cli(env, "send", "to-0001", "--body", "x", extra={"HELM_MAIL_HANDLE": "pinned-1"})
    assert json.loads(Path(p.stdout.strip()).read_text())["from"] == "pinned-1"


# ---------------------------------------------------------------- the secret backstop, through the CLI


@pytest.mark.parametrize("case", SHAPES + CONTEXTS, ids=lambda c: c.name)
def test_secret_refused_with_shape_and_line_never_echoed(case, env, world, monkeypatch, capsys):
    """Every fake credential: exit 3, nothing written, each finding named by shape and line, no secret part printed."""
    env.claim("sec-0001", 4000001, "sec-session-1", cwd="/w")
    body = env.root / "body.txt"
    body.write_text(case.text)
    code, out, err = _run_cli(monkeypatch, capsys, env, world.w, "send", "sec-0001", "--body-file", str(body))
    assert code == 3
    assert not queued(env, "sec-0001")
    for kind, line in case.expected:
        assert f"body line {line}: looks like {secretscan.LABELS[kind]} ({kind})" in err
    for part in case.material:
        assert part not in out and part not in err
    code, out, err = _run_cli(monkeypatch, capsys, env, world.w, "send", "sec-0001", "--body-file", str(body),
                              "--allow-secret")
    assert code == 0 and json.loads(Path(out.strip()).read_text())["body"] == case.text


@pytest.mark.parametrize("name", sorted(ORDINARY))
def test_ordinary_text_is_sent(name, env, world, monkeypatch, capsys):
    """Hashes, UUIDs, code, logs, a data URI's header: sent unchanged, nothing refused."""
    env.claim("ord-0001", 4000001, "ord-session-1", cwd="/w")
    body = env.root / "body.txt"
    body.write_text(ORDINARY[name])
    code, out, err = _run_cli(monkeypatch, capsys, env, world.w, "send", "ord-0001", "--body-file", str(body))
    assert code == 0, err
    assert json.loads(Path(out.strip()).read_text())["body"] == ORDINARY[name]


def test_secret_in_subject_through_a_real_process(env, world):
    """The subject is scanned too; the real CLI exits 3 and prints the field and line, not the value."""
    env.claim("sub-0001", 4000001, "sub-session-1", cwd="/w")
    case = next(c for c in SHAPES if any(k == "github_token" for k, _ in c.expected))
    token = next(part for part in case.material if len(part) >= 30)
    secret = "ghp_" + token[:36]
    p = courier_cli(env, "send", "sub-0001", "--subject", f"use {secret}", "--body", "hello")
    assert p.returncode == 3 and "subject line 1: looks like a GitHub token (github_token)" in p.stderr
    assert token[:36] not in p.stdout + p.stderr and not queued(env, "sub-0001")
    help_text = courier_cli(env, "send", "--help").stdout
    assert "backstop for accidental pastes, not a control" in help_text and "transcript" in help_text


# ---------------------------------------------------------------- the Python API


def test_python_api_same_checks_typed_errors_no_prints(env, world, monkeypatch, capsys):
    for k in ("HOME", "CLAUDE_CONFIG_DIR", "HELM_MAIL_DIR", "COURIER_STATE_DIR"):
        monkeypatch.setenv(k, env.vars()[k])
    monkeypatch.setenv("XDG_CONFIG_HOME", str(env.home / ".config"))
    monkeypatch.delenv("HELM_MAIL_HANDLE", raising=False)
    proj = world.dir("proj")
    world.session("py-0001", "py-session-0001", proj)
    world.session("py-0002", "py-session-0002", proj)
    env.claim("py-old", 4000003, "py-session-old", cwd=str(proj), retiredAt=5)
    sent = courier.send("py-0001", "subj", "body", sender="bot-1")
    assert len(sent) == 1 and sent[0].handle == "py-0001" and sent[0].rule == "handle"
    msg = json.loads(sent[0].path.read_text())
    assert (msg["from"], msg["id"]) == ("bot-1", sent[0].id)
    with pytest.raises(api.Ambiguous) as amb:
        courier.send(str(proj), "s", "b", sender="bot-1")
    assert amb.value.matches == ("py-0001", "py-0002") and amb.value.code == 2
    both = courier.send("./proj", "s", "b", sender="bot-1", all=True, cwd=str(world.w))
    assert [s.handle for s in both] == ["py-0001", "py-0002"] and len({s.path for s in both}) == 2
    with pytest.raises(api.Retired) as ret:
        courier.send("py-old", "s", "b", sender="bot-1")
    assert set(ret.value.instead) == {"py-0001", "py-0002"}
    with pytest.raises(api.NoMatch) as nm:
        courier.send("py-0003", "s", "b", sender="bot-1")
    assert "py-0001" in nm.value.candidates and nm.value.creatable
    fake = next(c for c in SHAPES if any(k == "anthropic_key" for k, _ in c.expected))
    with pytest.raises(api.SecretFound) as sec:
        courier.send("py-0001", "s", fake.text, sender="bot-1")
    assert sec.value.code == 3 and {f.kind for f in sec.value.findings} >= {"anthropic_key"}
    assert all(part not in str(sec.value) + repr(sec.value.findings) for part in fake.material)
    assert courier.send("py-0001", "s", fake.text, sender="bot-1", allow_secret=True)
    with pytest.raises(api.Invalid):
        courier.send("py-0001", "two\nlines", "b", sender="bot-1")
    with pytest.raises(api.Invalid):
        courier.send("py-0001", "s", b"bytes", sender="bot-1")
    assert issubclass(api.SecretFound, api.SendError) and issubclass(api.NoMatch, api.SendError)
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_package_import_stays_light():
    """`import courier` (every prompt hook does) imports no sending code; `courier.send` loads it on first use."""
    code = ("import sys, courier; assert 'courier.api' not in sys.modules and 'courier.secretscan' not in sys.modules;"
            " f = courier.send; assert f is sys.modules['courier.api'].send; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "ok", p.stderr
    with pytest.raises(AttributeError):
        courier.no_such_thing  # noqa: B018


# ---------------------------------------------------------------- end to end


def test_send_by_path_rings_the_live_session(env, fake_session, daemon, world):
    """`courier send <relative path>` into the directory a live fake session works in: written, rung once, bodyless."""
    proj = world.dir("e2e-proj")
    fs = fake_session("sess-e2e")
    env.claim("e2e-0001", fs.pid, "sess-e2e", cwd=str(proj))
    d = daemon()
    who = json.loads(courier_cli(env, "who", "./e2e-proj", "--json", cwd=world.w).stdout)
    assert [(r["handle"], r["wake"]) for r in who["sessions"]] == [("e2e-0001", "socket")]
    p = courier_cli(env, "send", "./e2e-proj", "--subject", "S-e2e", "--body", "BODY-e2e-71c", "--json", cwd=world.w)
    assert p.returncode == 0, p.stderr
    sent = json.loads(p.stdout)
    assert (sent["handle"], sent["rule"]) == ("e2e-0001", "cwd")
    assert "wakes by socket" in p.stderr
    lines = wait_for(fs.lines, timeout=10, what="the doorbell")
    d.wait_event("poke_sent", handle="e2e-0001")
    assert len(lines) == 1 and "BODY-e2e-71c" not in json.dumps(lines[0])
    assert Path(sent["path"]).exists()
