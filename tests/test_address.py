"""Addressing: a handle, a path (relative, absolute, `~`, symlinked, a git worktree, case-folded) or a session-id
prefix resolves to the right boxes by one shared function; dead, retired and /clear-ed owners are never a path's match.

Live sessions here are real processes (`sleep`) with registry records written as Claude writes them, so liveness
is judged by the same code the daemon uses. `who` and `send` are checked to agree on every row.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from courier import address, cli, mailbox, registry
from courier.address import Directory, resolve_target

GIT = shutil.which("git")


class World:
    """A mail root, a registry and live processes standing in for sessions."""

    def __init__(self, env):
        self.env = env
        self.procs: list[subprocess.Popen] = []
        env.registry.mkdir(mode=0o700, exist_ok=True)
        self.w = env.root / "w"
        self.w.mkdir()

    def process(self) -> int:
        p = subprocess.Popen(["sleep", "600"])
        self.procs.append(p)
        return p.pid

    def record(self, pid: int, sid: str, socket: str | None = None) -> None:
        rec = {"pid": pid, "sessionId": sid, "procStart": registry.proc_start(pid), "cwd": "/", "status": "idle"}
        dom = registry.own_pid_domain()
        if dom:
            rec["pidDomain"] = dom
        if socket:
            rec["messagingSocketPath"] = socket
        (self.env.registry / f"{pid}.json").write_text(json.dumps(rec))

    def session(self, handle: str, sid: str, cwd, runtime: str = "claude", **extra) -> int:
        """A live session: a process, its registry record (claude) and its box."""
        pid = self.process()
        if runtime == "claude":
            self.record(pid, sid)
        self.env.claim(handle, pid, sid, runtime=runtime, cwd=str(cwd), **extra)
        return pid

    def dir(self, rel: str) -> Path:
        p = self.w / rel
        p.mkdir(parents=True, exist_ok=True)
        return p

    def directory(self, cwd=None, **kw) -> Directory:
        return Directory(self.env.mail, self.env.registry, self.env.state, cwd=str(cwd) if cwd else None, **kw)

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


@pytest.fixture
def world(env, monkeypatch):
    monkeypatch.setenv("HOME", str(env.home))
    w = World(env)
    yield w
    w.stop()


def make_worktrees(w: World) -> tuple[Path, Path]:
    """A main checkout and a linked worktree: real git if installed, else the same shape by hand."""
    repo, wt = w.w / "repo", w.w / "wt"
    repo.mkdir()
    if GIT:
        genv = dict(os.environ, HOME=str(w.env.home), GIT_CONFIG_NOSYSTEM="1")

        def run(*a):
            subprocess.run([GIT, *a], cwd=repo, env=genv, check=True, capture_output=True)

        run("init", "-q")
        run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
        run("worktree", "add", "-q", "-b", "feature", str(wt))
    else:
        (repo / ".git").mkdir()
        wt.mkdir()
        (wt / ".git").write_text(f"gitdir: {repo}/.git/worktrees/wt\n")
    assert (repo / ".git").is_dir() and (wt / ".git").is_file()
    return repo, wt


@pytest.fixture
def town(world, env):
    """The table's world: every kind of box the rules must tell apart."""
    w = world
    repo, wt = make_worktrees(w)
    (repo / "sub" / "deep").mkdir(parents=True)
    (repo / "sub" / "notes.txt").write_text("x")
    (wt / "inner").mkdir()
    plain, twin, deadd = w.dir("plain"), w.dir("twin"), w.dir("deaddir")
    w.dir("Mixed")
    os.symlink(repo, w.w / "link")  # a symlinked checkout
    real2 = w.dir("real2")
    os.symlink(real2, w.w / "sym2")  # an owner who recorded its cwd through a link
    home_proj = env.home / "proj"
    home_proj.mkdir()
    w.session("api-1111", "aaaaaa11-0000-4000-8000-000000000001", repo)
    w.session("wt-2222", "bbbbbb22-0000-4000-8000-000000000002", wt)
    plain_pid = w.session("plain-3333", "9a9a9a33-0000-4000-8000-000000000003", plain)
    w.session("twin-0001", "cccccc01-0000-4000-8000-000000000004", twin)
    w.session("twin-0002", "cccccc02-0000-4000-8000-000000000005", str(twin) + "/")
    env.claim("dead-4444", 4000004, "dddddd44-0000-4000-8000-000000000006", cwd=str(deadd))
    env.claim("ret-5555", 4000005, "eeeeee55-0000-4000-8000-000000000007", cwd=str(repo), retiredAt=5)
    env.claim("old-plain", plain_pid, "9a9a9a33-0000-4000-8000-000000000003", cwd=str(w.w / "elsewhere"),
              retiredAt=5)
    w.session("pi-7777", "pi-7777-sid", w.dir("pidir"), runtime="pi")
    w.session("mixed-8888", "a1b2c3d4-0000-4000-8000-000000000008", w.w / "Mixed")
    w.session("sym-9999", "f0f0f0f0-0000-4000-8000-000000000009", w.w / "sym2")
    w.session("home-1010", "e1e1e1e1-0000-4000-8000-000000000010", home_proj)
    (env.mail / "unowned-1").mkdir()
    return w


W = "{w}"  # replaced by the world's directory in the table
# (target, cwd relative to the world, expected rule, expected handles, expected problem)
TABLE = [
    # handles: exact name, any owner state but retired
    ("api-1111", None, "handle", ["api-1111"], None),
    ("dead-4444", None, "handle", ["dead-4444"], None),
    ("unowned-1", None, "handle", ["unowned-1"], None),
    ("pi-7777", None, "handle", ["pi-7777"], None),
    ("ret-5555", None, "handle", ["ret-5555"], "retired"),
    ("api-111", None, None, [], "no_match"),
    # absolute paths, with and without a trailing separator, through a symlinked checkout
    (f"{W}/repo", None, "cwd", ["api-1111"], None),
    (f"{W}/repo/", None, "cwd", ["api-1111"], None),
    (f"{W}/plain", None, "cwd", ["plain-3333"], None),
    (f"{W}/link", None, "cwd", ["api-1111"], None),
    (f"{W}/link/sub", None, "worktree root", ["api-1111"], None),
    (f"{W}/real2", None, "cwd", ["sym-9999"], None),
    (f"{W}/sym2", None, "cwd", ["sym-9999"], None),
    (f"{W}/repo/./sub/../", None, "cwd", ["api-1111"], None),
    # git worktrees: a subdirectory resolves to its own worktree's root, main and linked kept apart
    (f"{W}/repo/sub/deep", None, "worktree root", ["api-1111"], None),
    (f"{W}/repo/sub/notes.txt", None, "worktree root", ["api-1111"], None),
    (f"{W}/wt", None, "cwd", ["wt-2222"], None),
    (f"{W}/wt/inner", None, "worktree root", ["wt-2222"], None),
    # relative paths, from a caller's working directory
    (".", "repo/sub", "worktree root", ["api-1111"], None),
    ("..", "repo/sub", "cwd", ["api-1111"], None),
    ("../../plain", "repo/sub", "cwd", ["plain-3333"], None),
    ("./inner", "wt", "worktree root", ["wt-2222"], None),
    ("../wt", "repo", "cwd", ["wt-2222"], None),
    # ~
    ("~/proj", None, "cwd", ["home-1010"], None),
    ("~/proj/", None, "cwd", ["home-1010"], None),
    ("~/nothing", None, None, [], "no_match"),
    # several live sessions in one directory
    (f"{W}/twin", None, "cwd", ["twin-0001", "twin-0002"], None),
    # dead and retired owners are never a path's match; nor is a directory nobody works in
    (f"{W}/deaddir", None, None, [], "no_match"),
    (f"{W}/pidir", None, "cwd", ["pi-7777"], None),
    ("/nonexistent/x", None, None, [], "no_match"),
    # case: a case-sensitive file system keeps Mixed and mixed apart
    (f"{W}/mixed", None, None, [], "no_match"),
    (f"{W}/Mixed", None, "cwd", ["mixed-8888"], None),
    # session-id prefixes: >= 6 characters, live sessions only, case-insensitive
    ("aaaaaa", None, "session-id prefix", ["api-1111"], None),
    ("AAAAAA11-0000", None, "session-id prefix", ["api-1111"], None),
    ("aaaaa", None, None, [], "no_match"),
    ("cccccc", None, "session-id prefix", ["twin-0001", "twin-0002"], None),
    ("cccccc01", None, "session-id prefix", ["twin-0001"], None),
    ("dddddd44", None, None, [], "no_match"),
    ("eeeeee55", None, None, [], "no_match"),
    ("9a9a9a", None, "session-id prefix", ["plain-3333"], None),
]


def _fill(text: str | None, w: World) -> str | None:
    return None if text is None else text.replace(W, str(w.w))


@pytest.mark.parametrize("target,cwd,rule,handles,problem", TABLE, ids=[f"{t[0]}@{t[1]}" for t in TABLE])
def test_resolution_table(town, target, cwd, rule, handles, problem):
    """Each TARGET resolves by the stated rule to exactly the expected boxes (or the expected refusal)."""
    res = resolve_target(_fill(target, town), town.directory(cwd=town.w / cwd if cwd else None))
    assert (res.rule, sorted(res.handles), res.problem) == (rule, handles, problem), res


def test_refusals_say_what_was_meant(town):
    """A retired box names the live box of its session first, else of its cwd; a miss names the closest and the dead."""
    d = town.directory()
    by_sid = resolve_target("old-plain", d)
    assert by_sid.problem == "retired" and [b.handle for b in by_sid.instead] == ["plain-3333"]
    by_cwd = resolve_target("ret-5555", d)
    assert [b.handle for b in by_cwd.instead] == ["api-1111"]
    assert "api-1111" in address.problem_text(by_cwd)
    near = resolve_target("api-111", d)
    assert "api-1111" in [b.handle for b in near.candidates] and near.creatable
    gone = resolve_target(str(town.w / "deaddir"), d)
    assert [b.handle for b in gone.gone] == ["dead-4444"]
    assert "not live: dead-4444" in address.problem_text(gone)
    dead_prefix = resolve_target("dddddd", d)
    assert [b.handle for b in dead_prefix.gone] == ["dead-4444"]


def test_states_and_wakes(town):
    """who's columns: live/dead/retired/unowned, and how each can be woken now."""
    rows = {b.handle: b for b in town.directory().all()}
    assert (rows["api-1111"].state, rows["api-1111"].wake) == ("live", "prompt only")
    assert rows["api-1111"].reason == "no_socket"
    assert (rows["dead-4444"].state, rows["dead-4444"].wake) == ("dead", "none")
    assert (rows["ret-5555"].state, rows["old-plain"].state) == ("retired", "retired")
    assert (rows["pi-7777"].state, rows["pi-7777"].wake) == ("live", "self")
    assert rows["unowned-1"].state == "unowned" and rows["unowned-1"].reason == "owner_missing"


def test_waiter_is_asked_through_one_function(world, env):
    """A live session with no socket wakes by its waiter when one is parked (the waiter module is optional)."""
    world.session("w-0001", "waiter-session-1", world.dir("x"))
    asked = []
    d = world.directory(has_waiter=lambda sid: asked.append(sid) or True)
    assert d.get("w-0001").wake == "waiter" and asked == ["waiter-session-1"]
    assert address.waiter_available(None, "s") is False


def test_socket_wake_for_a_ringable_session(env, fake_session, world):
    """A live session whose record names a vetted messaging socket wakes by socket."""
    fs = fake_session("sess-sock")
    env.claim("sock-0001", fs.pid, "sess-sock", cwd=str(world.dir("sock")))
    box = world.directory().get("sock-0001")
    assert (box.state, box.wake, box.reason) == ("live", "socket", None)


def test_case_folding_where_the_file_system_folds(town):
    """On a file system that ignores case, a path matches whatever case it is typed in (and NFC = NFD)."""
    folding = town.directory(folds_case=lambda path: True)
    res = resolve_target(str(town.w / "mIXED"), folding)
    assert (res.rule, res.handles) == ("cwd", ["mixed-8888"])
    strict = town.directory(folds_case=lambda path: False)
    assert resolve_target(str(town.w / "mIXED"), strict).problem == "no_match"
    town.session("cafe-1", "cafe-session-1", town.dir("Cafe\u0301"))  # decomposed é
    res = resolve_target(str(town.w / "CAF\u00c9"), town.directory(folds_case=lambda path: True))  # composed
    assert res.handles == ["cafe-1"]


def test_fs_folds_case_probe_agrees_with_the_file_system(tmp_path):
    """The probe says what a direct experiment says: does `aB` find `Ab`?"""
    probe = tmp_path / "Ab"
    probe.mkdir()
    expected = (tmp_path / "aB").exists()
    assert address.fs_folds_case(str(probe)) is expected
    assert address.fs_folds_case(str(probe / "missing" / "deeper")) is expected  # nearest existing component
    assert address.fs_folds_case("/") is False


def test_worktree_root_without_git(world):
    """A hand-made `.git` file marks a linked worktree: its subdirectories resolve to it, not to an outer repo."""
    outer = world.dir("outer")
    (outer / ".git").mkdir()
    inner = world.dir("outer/nested-wt")
    (inner / ".git").write_text("gitdir: /elsewhere\n")
    world.dir("outer/nested-wt/src/pkg")
    assert address.worktree_root(str(inner / "src" / "pkg")) == str(inner)
    assert address.worktree_root(str(outer / "x")) == str(outer)
    world.session("outer-1", "outer-session-1", outer)
    world.session("inner-1", "inner-session-1", inner)
    res = resolve_target(str(inner / "src" / "pkg"), world.directory())
    assert (res.rule, res.handles) == ("worktree root", ["inner-1"])


def test_hostile_owner_fields_are_compared_not_trusted(world, env):
    """Owner cwds with NUL, control characters, relative paths or huge text never match, never crash, print escaped."""
    target = world.dir("t")
    for i, cwd in enumerate(["rel/t", str(target) + "\x00", str(target) + "\n", "\x1b]0;x\x07" + str(target)]):
        pid = world.process()
        world.record(pid, f"hostile-{i}")
        env.claim(f"h-{i}", pid, f"hostile-{i}", cwd=cwd)
    d = world.directory(cwd=world.w)
    assert resolve_target(str(target), d).problem == "no_match"
    assert resolve_target("t", d).problem == "no_match"  # not a path: too short for a prefix
    for b in d.all():
        row = address.render_row(b)
        assert "\x1b" not in row and "\x00" not in row and "\n" not in row


def test_invalid_targets(world):
    d = world.directory()
    for bad in ["", "   ", "a\x00b", "x\ny", "/" * 5000]:
        assert resolve_target(bad, d).problem == "invalid"


# ---------------------------------------------------------------- /clear and re-claim


def _hook_claim(env, sid: str, cwd: Path) -> subprocess.CompletedProcess:
    payload = json.dumps({"session_id": sid, "cwd": str(cwd), "hook_event_name": "SessionStart"})
    return subprocess.run([sys.executable, "-m", "courier", "hook", "claim"], check=False, input=payload, text=True,
                          env=env.vars(), capture_output=True, timeout=30)


@pytest.mark.parametrize("mail_in_ghost", [False, True], ids=["ghost-empty", "ghost-with-mail"])
def test_cleared_and_reclaimed_box_resolves_to_whoever_lives_there_now(world, env, mail_in_ghost):
    """After /clear re-mints the session id and the hook re-claims, a path resolves to the new session's box only."""
    proj = world.dir("proj")
    pid = world.process()
    world.record(pid, "11111111-aaaa-4000-8000-00000000old1")
    assert _hook_claim(env, "11111111-aaaa-4000-8000-00000000old1", proj).returncode == 0
    old = resolve_target(str(proj), world.directory())
    assert old.rule == "cwd" and len(old.matches) == 1
    ghost = old.handles[0]
    if mail_in_ghost:
        env.drop(ghost)
    world.record(pid, "22222222-bbbb-4000-8000-00000000new2")  # /clear: same process, new id
    after_clear = resolve_target(str(proj), world.directory())
    assert after_clear.problem == "no_match" and [b.handle for b in after_clear.gone] == [ghost]
    assert _hook_claim(env, "22222222-bbbb-4000-8000-00000000new2", proj).returncode == 0
    d = world.directory()
    now = resolve_target(str(proj), d)
    assert now.rule == "cwd" and len(now.matches) == 1 and now.handles != [ghost]
    assert now.matches[0].session_id.startswith("22222222")
    assert resolve_target("222222", d).handles == now.handles
    assert resolve_target("111111", d).problem == "no_match"
    g = d.get(ghost)
    if mail_in_ghost:
        assert g.state == "dead" and g.reason == "session_replaced"  # kept for its session's return
    else:
        assert g.state == "retired"  # the hook retired the empty ghost
        refused = resolve_target(ghost, d)
        assert refused.problem == "retired" and [b.handle for b in refused.instead] == now.handles


def test_overwritten_owner_resolves_to_the_new_session(world, env):
    """A box whose owner.json was re-written for the new id (older courier) is live again for the path."""
    proj = world.dir("proj2")
    pid = world.process()
    world.record(pid, "old-id-000001")
    env.claim("proj2-0001", pid, "old-id-000001", cwd=str(proj))
    world.record(pid, "new-id-000002")
    assert resolve_target(str(proj), world.directory()).problem == "no_match"
    env.claim("proj2-0001", pid, "new-id-000002", cwd=str(proj))
    res = resolve_target(str(proj), world.directory())
    assert res.handles == ["proj2-0001"]


def test_dead_owner_by_pid_reuse_is_not_live(world, env):
    """A record whose procStart no longer matches its pid (the pid was reused) is not a live session."""
    proj = world.dir("reuse")
    pid = world.process()
    world.record(pid, "reuse-session-1")
    rec = json.loads((env.registry / f"{pid}.json").read_text())
    rec["procStart"] = "1"
    (env.registry / f"{pid}.json").write_text(json.dumps(rec))
    env.claim("reuse-1", pid, "reuse-session-1", cwd=str(proj))
    b = world.directory().get("reuse-1")
    assert (b.state, b.reason) == ("dead", "pid_reused")
    assert resolve_target(str(proj), world.directory()).problem == "no_match"


# ---------------------------------------------------------------- who and send agree


def _run_cli(monkeypatch, capsys, env, cwd, *argv) -> tuple[int, str, str]:
    for k, v in env.vars().items():
        if k in ("HOME", "CLAUDE_CONFIG_DIR", "HELM_MAIL_DIR", "COURIER_STATE_DIR", "XDG_STATE_HOME"):
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(env.home / ".config"))
    for k in ("HELM_MAIL_HANDLE", "HELM_DEFAULTS_SUITE", "CLAUDE_CODE_SESSION_ID", "COURIER_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(cwd)
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_who_and_send_agree_on_every_row(town, env, monkeypatch, capsys):
    """For every table target, `who TARGET` lists exactly the boxes `send TARGET --all` writes to, by the same rule."""
    for target, cwd, rule, handles, problem in TABLE:
        target = _fill(target, town)
        here = town.w / cwd if cwd else town.w
        wcode, wout, _ = _run_cli(monkeypatch, capsys, env, here, "who", target, "--json")
        shown = json.loads(wout)
        scode, sout, serr = _run_cli(monkeypatch, capsys, env, here, "send", target, "--all", "--json", "--body", "hi")
        if problem is None:
            sent = json.loads(sout)
            assert (wcode, scode) == (0, 0), (target, serr)
            assert sorted(s["handle"] for s in sent) == sorted(r["handle"] for r in shown["sessions"]) == handles
            assert {s["rule"] for s in sent} == {shown["rule"]} == {rule}
        else:
            assert scode == 2, (target, serr)
            assert shown["problem"] == problem and sout == ""
            assert wcode == (0 if problem == "retired" else 2)


def test_every_row_of_who_is_sendable_by_its_handle(town, env, monkeypatch, capsys):
    """Each row `who` lists is addressable by its handle exactly as it says: retired rows refused, the rest written."""
    code, out, _ = _run_cli(monkeypatch, capsys, env, town.w, "who", "--json")
    rows = json.loads(out)["sessions"]
    assert code == 0 and len(rows) == len(mailbox.list_handles(env.mail)[0])
    for row in rows:
        code, out, err = _run_cli(monkeypatch, capsys, env, town.w, "send", row["handle"], "--json", "--body", "x")
        if row["state"] == "retired":
            assert code == 2 and "retired" in err
        else:
            assert code == 0 and json.loads(out)["handle"] == row["handle"], err


def test_who_text(town, env, monkeypatch, capsys):
    code, out, _ = _run_cli(monkeypatch, capsys, env, town.w, "who")
    assert code == 0 and out.splitlines()[0].startswith("HANDLE")
    assert "api-1111" in out and "prompt only" in out and "daemon NOT running" in out
    code, out, _ = _run_cli(monkeypatch, capsys, env, town.w / "repo" / "sub", "who", ".")
    assert code == 0 and "git worktree root" in out and "api-1111" in out and "plain-3333" not in out
    code, out, err = _run_cli(monkeypatch, capsys, env, town.w, "who", "zzzzzzzz")
    assert code == 2 and "zzzzzzzz" in err
