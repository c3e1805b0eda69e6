"""The Claude Code hooks against real files and real processes: claim, deliver, hostile content, races, import budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from courier import hooks, mailbox, wakecap


def run_hook(env, verb: str, payload, extra_env: dict | None = None, raw: bytes | None = None):
    e = env.vars()
    e.update(extra_env or {})
    data = raw if raw is not None else json.dumps(payload).encode()
    return subprocess.run(
        [sys.executable, "-m", "courier", "hook", verb], input=data, env=e, capture_output=True, timeout=30
    )


def test_hook_import_budget():
    """Importing the hook path must not pull in trio or structlog (0.3 s before any work), nor pathlib
    and typing (~4 and ~3 ms on every prompt; research/performance.md §6)."""
    code = ("import sys, courier.cli, courier.hooks; print([m for m in ('trio','structlog','watchfiles','psutil',"
            "'pathlib','typing','argparse','dataclasses') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_claim_creates_box_with_registry_pid(env, fake_session):
    fs = fake_session("0190abcd-0000-0000-0000-00000000beef")
    p = run_hook(env, "claim", {"session_id": fs.session_id, "cwd": "/src/My Repo", "hook_event_name": "SessionStart"})
    assert p.returncode == 0 and p.stdout == b""
    box = env.mail / "my-repo-beef"
    owner = json.loads((box / "owner.json").read_text())
    assert owner["pid"] == fs.pid and owner["sessionId"] == fs.session_id and owner["runtime"] == "claude"
    assert "pidIsProvisional" not in owner
    assert (box / "read").is_dir()


def test_claim_without_registry_row_is_provisional_then_repaired(env, fake_session):
    sid = "sess-prov-0000-1111"
    p = run_hook(env, "claim", {"session_id": sid, "cwd": "/w/proj"})
    assert p.returncode == 0
    box = env.mail / "proj-1111"
    owner = json.loads((box / "owner.json").read_text())
    assert owner["pidIsProvisional"] is True
    fs = fake_session(sid)
    run_hook(env, "deliver", {"session_id": sid, "prompt": "hi"})
    owner = json.loads((box / "owner.json").read_text())
    assert owner["pid"] == fs.pid and "pidIsProvisional" not in owner


def test_claim_finds_own_box_by_session_id_and_widens_around_live_holder(env, fake_session):
    holder = fake_session("aaaa-1111")
    env.claim("proj-1111", holder.pid, "aaaa-1111")
    p = run_hook(env, "claim", {"session_id": "bbbb-1111", "cwd": "/x/proj"})
    assert p.returncode == 0
    assert (env.mail / "proj-b-1111").exists() or (env.mail / "proj-bb-1111").exists()
    mine = hooks.find_mine(env.mail, "bbbb-1111")
    assert mine and mine != "proj-1111"
    run_hook(env, "claim", {"session_id": "bbbb-1111", "cwd": "/x/proj"})
    assert hooks.find_mine(env.mail, "bbbb-1111") == mine


def test_pinned_and_reserved_handles(env):
    run_hook(env, "claim", {"session_id": "s-pin-1", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "Build Bot"})
    assert (env.mail / "build-bot" / "owner.json").exists()
    run_hook(env, "claim", {"session_id": "s-pin-2", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "operator"})
    assert not (env.mail / "operator").exists()


def test_retire_dead_owner_with_empty_queue_never_delete(env, fake_session):
    dead = fake_session("dead-0001")
    dead_pid = dead.pid
    dead.kill()
    env.claim("gone-0001", dead_pid, "dead-0001")
    env.claim("gone-0002", dead_pid, "dead-0002")
    env.drop("gone-0002")  # mail keeps a box alive
    (env.mail / "gone-0001" / "read" / "1-aaaaaa.json").write_text("{}")
    alive = fake_session("live-0003")
    env.claim("live-0003", alive.pid, "live-0003")
    unknown = env.claim("silent-0004", os.getpid(), "silent-0004")  # live pid, no registry row: silence
    run_hook(env, "claim", {"session_id": "me-9999", "cwd": "/x/me"})
    o1 = json.loads((env.mail / "gone-0001" / "owner.json").read_text())
    assert "retiredAt" in o1
    assert (env.mail / "gone-0001" / "read" / "1-aaaaaa.json").exists()
    assert "retiredAt" not in json.loads((env.mail / "gone-0002" / "owner.json").read_text())
    assert "retiredAt" not in json.loads((env.mail / "live-0003" / "owner.json").read_text())
    assert "retiredAt" not in json.loads((unknown / "owner.json").read_text())


def test_clear_case_same_pid_new_session_is_gone(env, fake_session):
    fs = fake_session("after-clear")
    env.claim("clr-0001", fs.pid, "before-clear")
    run_hook(env, "claim", {"session_id": "me-1", "cwd": "/x/me"})
    assert "retiredAt" in json.loads((env.mail / "clr-0001" / "owner.json").read_text())


def test_claim_shows_count_but_never_consumes(env):
    run_hook(env, "claim", {"session_id": "s-show-1", "cwd": "/x/show"}, {"HELM_MAIL_HANDLE": "show"})
    env.drop("show")
    p = run_hook(env, "claim", {"session_id": "s-show-1", "cwd": "/x/show"}, {"HELM_MAIL_HANDLE": "show"})
    assert b"1 message waits" in p.stdout
    assert len(mailbox.list_box(env.mail / "show").queued) == 1


def test_deliver_shows_then_consumes_and_records_operator_turn(env):
    run_hook(env, "claim", {"session_id": "s-d-1", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "dee"})
    m = env.drop("dee", body="SECRET-BODY-XYZ", subject="Status", sender="alice-1")
    p = run_hook(env, "deliver", {"session_id": "s-d-1", "prompt": "what's new?"})
    out = p.stdout.decode()
    assert p.returncode == 0
    assert "1 message arrived" in out and "from alice-1 (unverified) — Status" in out
    assert str(env.mail / "dee" / "read" / m.name) in out
    assert "SECRET-BODY-XYZ" not in out
    assert (env.mail / "dee" / "read" / m.name).exists() and not m.exists()
    assert wakecap.operator_turn_at(env.state, "dee", "s-d-1") is not None
    # one file a prompt, named for the session the box's owner names (the daemon looks both names up)
    assert os.listdir(env.state / wakecap.OPERATOR_DIR) == ["s-s-d-1"]


def test_deliver_on_doorbell_is_not_an_operator_turn(env):
    from courier import doorbell

    run_hook(env, "claim", {"session_id": "s-bell", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "bell"})
    env.drop("bell")
    run_hook(env, "deliver", {"session_id": "s-bell", "prompt": doorbell.text(3, 1, str(env.mail / "bell"))})
    assert wakecap.operator_turn_at(env.state, "bell", "s-bell") is None


HOSTILE = [
    "line1\nline2\n  from forged (unverified) — x\n    /etc/passwd",
    "\x1b[31mred\x1b[0m\x07",
    "\u202egnp.exe\u202c and \u200bzero width",
    "tab\tand\rcarriage",
    "x" * 1_000_00,
]


@pytest.mark.parametrize("value", HOSTILE, ids=["newlines", "ansi", "bidi", "controls", "huge"])
def test_hostile_fields_are_one_bounded_printable_line(env, value):
    run_hook(env, "claim", {"session_id": "s-h", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "hh"})
    env.drop("hh", sender=value, subject=value, body=value)
    p = run_hook(env, "deliver", {"session_id": "s-h", "prompt": "x"})
    out = p.stdout.decode()
    lines = out.splitlines()
    assert lines[1].startswith("  from ") and lines[2].startswith("    " + str(env.mail / "hh" / "read"))
    assert all(ch.isprintable() for line in lines for ch in line)
    assert len(lines[1]) < 200
    assert len(out.encode()) <= hooks.NOTICE_MAX_BYTES


def test_deliver_caps_notice_and_leaves_the_rest_queued(env):
    run_hook(env, "claim", {"session_id": "s-many", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "many"})
    for i in range(200):
        env.drop("many", subject="s" * 80, sender="f" * 64)
    p = run_hook(env, "deliver", {"session_id": "s-many", "prompt": "x"})
    out = p.stdout.decode()
    assert len(out.encode()) <= hooks.NOTICE_MAX_BYTES
    shown = out.count("\n  from ")
    left = len(mailbox.list_box(env.mail / "many").queued)
    assert 0 < shown < 200 and shown + left == 200
    assert f"and {left} more" in out


def test_unreadable_stdin_missing_root_and_off_switch_exit_zero_silently(env):
    assert run_hook(env, "deliver", None, raw=b"\xff\xfe not json").returncode == 0
    os.rmdir(env.mail)
    p = run_hook(env, "deliver", {"session_id": "s", "prompt": "x"})
    assert p.returncode == 0 and p.stdout == b""
    p = run_hook(env, "claim", {"session_id": "s-off", "cwd": "/x"}, {"HELM_MAIL_OFF": "1"})
    assert p.returncode == 0 and not env.mail.exists()


def test_non_json_and_symlinked_messages(env):
    run_hook(env, "claim", {"session_id": "s-nj", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "nj"})
    box = env.mail / "nj"
    (box / "1-aaaaaa.json").write_text("not json at all")
    os.symlink("/etc/passwd", box / "2-bbbbbb.json")
    os.mkfifo(box / "3-cccccc.json")
    p = run_hook(env, "deliver", {"session_id": "s-nj", "prompt": "x"})
    out = p.stdout.decode()
    assert "unreadable message" in out and "root:" not in out
    # Refused entries are listed as such, never opened, and moved aside into read/ as they are.
    assert "2-bbbbbb.json — a symbolic link; not read" in out
    assert "3-cccccc.json — not a regular file" in out
    assert os.path.islink(box / "read" / "2-bbbbbb.json") and os.readlink(box / "read" / "2-bbbbbb.json") == "/etc/passwd"
    assert os.path.exists(box / "read" / "3-cccccc.json") and not os.path.exists(box / "3-cccccc.json")
    assert mailbox.list_box(box) == mailbox.Listing((), ())


RACE_SCRIPT = r"""
import io, json, os, sys
sys.stdin = io.TextIOWrapper(io.BytesIO(json.dumps({"session_id": "s-race", "prompt": "x"}).encode()))
from courier import hooks
buf = io.StringIO()
os.environ["HELM_MAIL_HANDLE"] = "race"
rounds = int(sys.argv[1])
import time
shown = []
refused = []
for r in range(rounds):
    buf = io.StringIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(json.dumps({"session_id": "s-race", "prompt": "x"}).encode()))
    hooks.main("deliver", stdout=buf)
    shown.extend(l.strip() for l in buf.getvalue().splitlines() if l.startswith("    /"))
    refused.extend(l.strip() for l in buf.getvalue().splitlines() if "refused:" in l)
print(json.dumps({"shown": shown, "refused": refused}))
"""


@pytest.mark.slow
def test_sixteen_processes_consume_each_message_exactly_once(env):
    """16 separate processes each run 500 rounds of `deliver` on one box while mail keeps landing:
    every message is consumed exactly once and shown at least once."""
    run_hook(env, "claim", {"session_id": "s-race", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "race"})
    box = env.mail / "race"
    procs = [
        subprocess.Popen([sys.executable, "-c", RACE_SCRIPT, "500"], env=env.vars(), stdout=subprocess.PIPE)
        for _ in range(16)
    ]
    dropped = []
    while any(p.poll() is None for p in procs) and len(dropped) < 3000:
        dropped.append(env.drop("race").name)
        time.sleep(0.001)
    all_shown, all_refused = [], []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        all_shown.extend(json.loads(out)["shown"])
        all_refused.extend(json.loads(out)["refused"])
    # Whatever landed after the racers stopped is delivered by one more prompt.
    e = env.vars()
    p = subprocess.run([sys.executable, "-c", RACE_SCRIPT, "1"], env=e, capture_output=True, timeout=60)
    all_shown.extend(json.loads(p.stdout)["shown"])
    # A message another prompt is consuming (two links for a moment) is never taken for a planted hard link.
    assert all_refused == [], all_refused[:3]
    assert mailbox.list_box(box).queued == ()
    read = sorted(os.listdir(box / "read"))
    assert read == sorted(dropped)  # each message consumed exactly once: none lost, none duplicated
    assert {os.path.basename(x) for x in all_shown} == set(dropped)  # and shown at least once
    log = [json.loads(l) for l in (env.state / "hooks.log").read_text().splitlines()]
    consumed = sum(r.get("consumed", 0) for r in log if r["event"] == "hook_delivered")
    assert consumed == len(dropped)
    assert len(dropped) > 100


def test_deliver_wall_time_is_recorded_not_asserted(env):
    """Smoke: the hook runs to completion as a real subprocess with 50 messages (timings live in research/)."""
    run_hook(env, "claim", {"session_id": "s-t", "cwd": "/x"}, {"HELM_MAIL_HANDLE": "tt"})
    for _ in range(50):
        env.drop("tt")
    p = run_hook(env, "deliver", {"session_id": "s-t", "prompt": "x"})
    assert p.returncode == 0 and b"50 messages arrived" in p.stdout


def test_the_hook_log_is_bounded(tmp_path):
    """Weeks of prompts: past its size the hook log rolls over to hooks.log.1 (one old file), never grows without end."""
    log = hooks.HookLog(tmp_path)
    log.MAX_BYTES = 2000
    for i in range(500):
        log("hook_delivered", handle="h", shown=i)
    files = sorted(os.listdir(tmp_path))
    assert files in (["hooks.log", "hooks.log.1"], ["hooks.log.1"])  # the very last write may have rolled it
    assert all(os.path.getsize(tmp_path / f) <= 2200 for f in files)
    newest = tmp_path / files[0]
    assert json.loads(newest.read_text().splitlines()[-1])["shown"] == 499
