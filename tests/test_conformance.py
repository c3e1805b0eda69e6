"""courier's hooks as a drop-in for helm's: one row per behaviour of research/helm-conformance.md.

Each row states what helm does (read from Wirasm/helm at the commits the research names) and what
courier does; the test asserts courier's. Where courier deliberately differs, the row says why.
Then mixed fleets: boxes claimed by one side and read by the other, mail written the way helm's
skill, helm's app and pi write it, with no message stranded, shown to the wrong session, or lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import wait_for


def hook(env, verb, payload, extra=None):
    e = env.vars()
    e.update(extra or {})
    p = subprocess.run([sys.executable, "-m", "courier", "hook", verb],
                       input=payload if isinstance(payload, bytes) else json.dumps(payload).encode(),
                       env=e, capture_output=True, timeout=60)
    return p


def claim(env, sid, cwd="/w/proj", extra=None, source="startup"):
    p = hook(env, "claim", {"session_id": sid, "cwd": cwd, "source": source}, extra)
    assert p.returncode == 0, p.stderr
    return p


def deliver(env, sid, extra=None, prompt="what's new?"):
    p = hook(env, "deliver", {"session_id": sid, "prompt": prompt}, extra)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    return p.stdout.decode("utf-8", "replace")


def box_of(env, sid) -> str | None:
    for box in env.mail.iterdir():
        try:
            if json.loads((box / "owner.json").read_text()).get("sessionId") == sid:
                return box.name
        except (OSError, ValueError):
            continue
    return None


def owner(env, handle) -> dict:
    return json.loads((env.mail / handle / "owner.json").read_text())


def helm_owner(env, handle, pid, sid, runtime="claude", cwd="/w/proj", **extra) -> Path:
    """owner.json exactly as helm's hook (or pi) writes it: pretty, two spaces, a newline, this key order."""
    box = env.mail / handle
    (box / "read").mkdir(parents=True, exist_ok=True)
    data = {"handle": handle, "runtime": runtime, "pid": pid, "sessionId": sid, "cwd": cwd, "claimedAt": 1786028945735}
    data.update(extra)
    (box / "owner.json").write_text(json.dumps(data, indent=2) + "\n")
    return box


def queued(env, handle) -> list[str]:
    return sorted(n for n in os.listdir(env.mail / handle) if n.endswith(".json") and n != "owner.json"
                  and not n.startswith("."))


@dataclass
class Row:
    id: str
    helm: str
    courier: str
    why: str  # empty where courier does what helm does
    check: Callable


ROWS: list[Row] = []


def row(id: str, helm: str, courier: str, why: str = ""):
    def register(fn):
        ROWS.append(Row(id, helm, courier, why, fn))
        return fn

    return register


# ---------------------------------------------------------------- rows


@row("1-exhausted-ladder", "every rung held: <where>-<full>-<hook pid>; never overwrites a rung holder",
     "the same -<pid> rung, itself checked; random hex if that is held too; no owner.json is ever overwritten",
     "helm's last rung is unchecked")
def _(env, fake_session):
    sid = "019fc78b-f108-7c69-b602-1d44f7639531"
    squatter = fake_session("pi-squatter")
    for tail in ("9531", "639531", "f7639531", sid):
        helm_owner(env, f"proj-{tail}", squatter.pid, f"pi-{tail}", runtime="pi")
    before = {h: owner(env, h) for h in os.listdir(env.mail)}
    claim(env, sid)
    assert {h: owner(env, h) for h in before} == before, "no squatter's owner.json changed"
    mine = box_of(env, sid)
    assert mine and mine.startswith(f"proj-{sid}-") and mine not in before


@row("2-clear-ghost", "a live pid holds its box (widen past a /clear ghost); the ghost is retired after the claim "
     "only if its queue is empty", "the same")
def _(env, fake_session):
    ghost_process = fake_session("after-clear-0000-9531")  # the same process now runs another session
    helm_owner(env, "proj-9531", ghost_process.pid, "before-clear-0000-9531")
    helm_owner(env, "proj-639531", ghost_process.pid, "before-clear-1111-639531")  # a second ghost, with mail
    env.drop("proj-639531")
    claim(env, "new-0000-9531")
    assert box_of(env, "new-0000-9531") not in ("proj-9531", "proj-639531")
    assert owner(env, "proj-9531")["sessionId"] == "before-clear-0000-9531" and "retiredAt" in owner(env, "proj-9531")
    assert "retiredAt" not in owner(env, "proj-639531"), "a ghost with mail waits for its own session"


@row("3-reserved-pin", "HELM_MAIL_HANDLE=operator is refused and ignored: the derived handle is claimed",
     "the same, and logged (hook_pin_refused)")
def _(env, fake_session):
    claim(env, "s-op-0000-abcd", extra={"HELM_MAIL_HANDLE": "Operator"})
    assert not (env.mail / "operator").exists()
    assert box_of(env, "s-op-0000-abcd") == "proj-abcd"
    log = (env.state / "hooks.log").read_text()
    assert "hook_pin_refused" in log


@row("4-file-names", "every non-hidden *.json but owner.json is mail, any characters",
     "the same set; names rendered escaped; non-regular entries listed as refused and moved aside unopened",
     "helm's raw names can forge notice lines and its read of a FIFO hangs")
def _(env, fake_session):
    claim(env, "s-names-0000-abcd")
    box = env.mail / "proj-abcd"
    names = ["note.v2.json", "Hello World.json", "_x.json", "résumé.json", "evil\nline.json"]
    for n in names:
        (box / n).write_text(json.dumps({"from": "f", "subject": f"s-{len(n)}"}))
    out = deliver(env, "s-names-0000-abcd")
    for n in names[:4]:
        assert str(box / "read" / n) in out
    assert "evil\\nline.json  (name shown escaped)" in out and "\nline.json" not in out
    assert queued(env, "proj-abcd") == [] and sorted(os.listdir(box / "read")) == sorted(names)


@row("5-ownerless-box", "a box without owner.json is free: claim adopts it at its rung; its mail is delivered",
     "the same (mail sent with `courier send --create`, or before the recipient's first claim)")
def _(env, fake_session):
    (env.mail / "proj-abcd").mkdir()
    env.drop("proj-abcd", subject="waiting-for-you")
    claim(env, "s-adopt-0000-abcd")
    assert box_of(env, "s-adopt-0000-abcd") == "proj-abcd"
    assert "waiting-for-you" in deliver(env, "s-adopt-0000-abcd")


@row("6a-long-folder", "no truncation: a 150-character folder gives a 155-character handle, 199 gives 204",
     "the same (handles up to the filesystem's 255 bytes)")
def _(env, fake_session):
    for length in (150, 199):
        sid = f"s-long-{length}-0000-abcd"
        claim(env, sid, cwd="/w/" + "a" * length)
        assert len(box_of(env, sid)) == length + 5


@row("6b-too-long", "a handle over 255 bytes: mkdir fails silently, the session has no box",
     "the folder part is shortened so the handle fits, the id tail kept, hook_handle_truncated logged",
     "helm cannot address such a session at all")
def _(env, fake_session):
    claim(env, "s-huge-0000-abcd", cwd="/w/" + "b" * 300)
    handle = box_of(env, "s-huge-0000-abcd")
    assert handle and len(handle) <= 255 and handle.endswith("-abcd")
    assert "hook_handle_truncated" in (env.state / "hooks.log").read_text()


@row("6c-long-session-id", "any session id length works; the whole id is stored",
     "the same (bounded by the payload, not the id)")
def _(env, fake_session):
    sid = "x" * 300 + "-abcd"
    claim(env, sid)
    assert owner(env, box_of(env, sid))["sessionId"] == sid


@row("6d-empty-cwd", "an empty or missing cwd is the hook process's own directory",
     "the same")
def _(env, fake_session):
    e = env.vars()
    workdir = env.root / "Work Dir"
    workdir.mkdir()
    p = subprocess.run([sys.executable, "-m", "courier", "hook", "claim"], cwd=workdir, env=e, capture_output=True,
                       input=json.dumps({"session_id": "s-cwd-0000-abcd", "cwd": "", "source": "startup"}).encode())
    assert p.returncode == 0
    assert box_of(env, "s-cwd-0000-abcd") == "work-dir-abcd"


@row("7a-operator-notes", "notes from 'operator' carry the operator's authority (three sentences, #257)",
     "the same sentences; plus one line that `from` is written by its sender")
def _(env, fake_session):
    claim(env, "s-op7-0000-abcd")
    env.drop("proj-abcd", sender="operator")
    out = deliver(env, "s-op7-0000-abcd")
    assert "they are the operator's own words, not another agent's, and carry their authority." in out
    env.drop("proj-abcd", sender="operator")
    env.drop("proj-abcd", sender="agent-1")
    out = deliver(env, "s-op7-0000-abcd")
    assert 'the ones from "operator" are the operator\'s own words and carry their authority;' in out
    env.drop("proj-abcd", sender="agent-1")
    out = deliver(env, "s-op7-0000-abcd")
    assert "they are another agent's words, not the operator's, and should be read as such." in out
    assert "carry their authority" not in out


@row("7b-reply-hint", "'You are <handle>.' and a path template; no command",
     "'You are <handle>.' and `courier send <their handle> --from <handle> …`, the handle from disk only",
     "a reply signed with $USER reaches no mailbox")
def _(env, fake_session):
    claim(env, "s-rep-0000-abcd")
    env.drop("proj-abcd", sender="$(rm -rf ~)")
    out = deliver(env, "s-rep-0000-abcd")
    assert "You are proj-abcd." in out and "--from proj-abcd" in out
    assert "courier send <their handle>" in out and "courier send $(" not in out


@row("8-retired-box", "helm's app and pi refuse to send to a retired box; the skill snippet does not check",
     "refused with exit 2, naming the live box of the same session or cwd")
def _(env, fake_session):
    helm_owner(env, "gone-abcd", 1, "s-gone", retiredAt=5)
    p = subprocess.run([sys.executable, "-m", "courier", "send", "gone-abcd", "--body", "x"], env=env.vars(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "retired" in p.stderr and queued(env, "gone-abcd") == []


@row("9a-mail-off", "HELM_MAIL_OFF: any non-empty value turns mail off, even ' ' or '0'", "the same")
def _(env, fake_session):
    for value in (" ", "0", "1"):
        p = hook(env, "claim", {"session_id": "s-off", "cwd": "/w/p", "source": "startup"}, {"HELM_MAIL_OFF": value})
        assert p.returncode == 0 and p.stdout == b""
    assert box_of(env, "s-off") is None


@row("9b-tilde", "HELM_MAIL_DIR='~/x': helm's app expands it; helm's hook and pi resolve it against the cwd",
     "expanded to $HOME/x (as helm's app); doctor warns that the hook and pi disagree",
     "one root for every tool that expands it; the disagreement is helm's own")
def _(env, fake_session):
    extra = {"HELM_MAIL_DIR": "~/tilde-root"}
    claim(env, "s-tilde-0000-abcd", extra=extra)
    assert (env.home / "tilde-root" / "proj-abcd" / "owner.json").exists()
    p = subprocess.run([sys.executable, "-m", "courier", "doctor"], env=dict(env.vars(), **extra), capture_output=True,
                       text=True, timeout=60)
    assert "HELM_MAIL_DIR starts with '~'" in p.stdout


@row("10-registry-names", "any sessions/*.json names a session; no procStart is needed",
     "<pid>.json and <pid>-<suffix>.json whose record names that pid; without procStart judged by the pid "
     "(weaker evidence, logged), with it compared", "helm has no guard against a reused pid")
def _(env, fake_session):
    fs = fake_session("s-reg-0000-abcd")
    rec = json.loads((env.registry / f"{fs.pid}.json").read_text())
    (env.registry / f"{fs.pid}.json").unlink()
    del rec["procStart"]
    (env.registry / f"{fs.pid}-s-reg-0000-abcd.json").write_text(json.dumps(rec))
    claim(env, "s-reg-0000-abcd")
    o = owner(env, "proj-abcd")
    assert o["pid"] == fs.pid and "pidIsProvisional" not in o


@row("11-pi-retired-unread", "pi retires its own box at shutdown even with mail queued",
     "never rung (pi wakes itself); status shows 'retired, N unread'")
def _(env, fake_session):
    helm_owner(env, "pi-abcd", 1, "pi-session", runtime="pi", retiredAt=5)
    env.drop("pi-abcd")
    p = subprocess.run([sys.executable, "-m", "courier", "status"], env=env.vars(), capture_output=True, text=True,
                       timeout=60)
    assert "retired, 1 unread" in p.stdout


@row("A1-find-by-session", "a session finds its own box by sessionId first, retired ones included, from any cwd",
     "the same")
def _(env, fake_session):
    claim(env, "s-back-0000-abcd", cwd="/w/first")
    o = owner(env, "first-abcd")
    o["retiredAt"] = 5
    (env.mail / "first-abcd" / "owner.json").write_text(json.dumps(o, indent=2) + "\n")
    (env.mail / "first-abcd" / "read" / "1-aaaaaa.json").write_text("{}")
    claim(env, "s-back-0000-abcd", cwd="/w/elsewhere", source="resume")
    assert box_of(env, "s-back-0000-abcd") == "first-abcd" and "retiredAt" not in owner(env, "first-abcd")
    assert (env.mail / "first-abcd" / "read" / "1-aaaaaa.json").exists()


@row("A2-owner-bytes", "owner.json: pretty, two spaces, a newline, keys handle, runtime, pid, sessionId, cwd, "
     "claimedAt, mode 0600", "byte-identical bar claimedAt (directories 0700 where helm has the umask's 0755)")
def _(env, fake_session):
    fs = fake_session("s-bytes-0000-abcd")
    claim(env, "s-bytes-0000-abcd")
    path = env.mail / "proj-abcd" / "owner.json"
    data = json.loads(path.read_text())
    assert list(data) == ["handle", "runtime", "pid", "sessionId", "cwd", "claimedAt"]
    assert path.read_text() == json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    assert data["pid"] == fs.pid and (path.stat().st_mode & 0o777) == 0o600


@row("A3-provisional", "no registry row: pidIsProvisional, repaired at the next prompt; a correct record untouched",
     "the same")
def _(env, fake_session):
    claim(env, "s-prov-0000-abcd")
    assert owner(env, "proj-abcd")["pidIsProvisional"] is True
    fs = fake_session("s-prov-0000-abcd")
    deliver(env, "s-prov-0000-abcd")
    repaired = (env.mail / "proj-abcd" / "owner.json").read_bytes()
    assert json.loads(repaired)["pid"] == fs.pid and b"pidIsProvisional" not in repaired
    deliver(env, "s-prov-0000-abcd")
    assert (env.mail / "proj-abcd" / "owner.json").read_bytes() == repaired, "a repair, not a heartbeat"


@row("A4-retire", "a gone owner's empty box is retired: every field kept, retiredAt appended; never deleted",
     "the same, for every runtime (helm's N1)")
def _(env, fake_session):
    dead = fake_session("s-dead")
    pid = dead.pid
    dead.kill()
    helm_owner(env, "dead-claude", pid, "s-dead")
    helm_owner(env, "dead-pi", pid, "pi-dead", runtime="pi")
    claim(env, "s-me-0000-abcd")
    for h in ("dead-claude", "dead-pi"):
        o = owner(env, h)
        assert "retiredAt" in o and list(o)[:6] == ["handle", "runtime", "pid", "sessionId", "cwd", "claimedAt"]
        assert (env.mail / h / "read").is_dir()


@row("A5-collision", "a name already in read/: the rename replaces the archived message (lost)",
     "both kept; the notice points at the message just delivered (N9)", "nothing is lost, read/ included")
def _(env, fake_session):
    claim(env, "s-col-0000-abcd")
    box = env.mail / "proj-abcd"
    (box / "read" / "1-aaaaaa.json").write_text("OLD")
    (box / "1-aaaaaa.json").write_text(json.dumps({"from": "x", "subject": "NEW"}))
    out = deliver(env, "s-col-0000-abcd")
    assert (box / "read" / "1-aaaaaa.json").read_text() == "OLD"
    shown = [line.strip() for line in out.splitlines() if line.startswith("    /")][0]
    assert shown != str(box / "read" / "1-aaaaaa.json") and "NEW" in Path(shown).read_text()


@row("A10-show-then-consume", "consumes, then prints (a crash in between loses the display)",
     "prints, then consumes (a crash costs a duplicate display)", "a silent loss is worse than a repeat")
def _(env, fake_session):
    claim(env, "s-order-0000-abcd")
    m = env.drop("proj-abcd")

    class Boom(Exception):
        pass

    # Consume happens only after the notice was written: a failing writer leaves the mail queued.
    from courier import hooks

    class FailingOut:
        def write(self, _):
            raise Boom

        def flush(self):
            pass

    e = env.vars()
    rc = hooks.main("deliver", env=e, stdin=__import__("io").StringIO(
        json.dumps({"session_id": "s-order-0000-abcd", "prompt": "x"})), stdout=FailingOut())
    assert rc == 0 and m.exists()


@row("N2-no-session-id", "a claude owner without sessionId is alive while its pid lives", "the same")
def _(env, fake_session):
    fs = fake_session("s-other-session")
    box = env.mail / "nosid-0001"
    (box / "read").mkdir(parents=True)
    (box / "owner.json").write_text(json.dumps({"handle": "nosid-0001", "runtime": "claude", "pid": fs.pid}))
    claim(env, "s-n2-0000-abcd")
    assert "retiredAt" not in json.loads((box / "owner.json").read_text())


@row("N4-pin-held", "a pinned handle is claimed without a holder check: a second live session overwrites the first",
     "a pin held by another live session falls back to the derived handle (hook_pin_held)",
     "never overwrite a live owner")
def _(env, fake_session):
    first = fake_session("s-pin-first")
    helm_owner(env, "bot", first.pid, "s-pin-first")
    claim(env, "s-pin-second-abcd", extra={"HELM_MAIL_HANDLE": "bot"})
    assert owner(env, "bot")["sessionId"] == "s-pin-first"
    assert box_of(env, "s-pin-second-abcd") == "proj-abcd"


@row("N5-mail-keeps-a-box", "a dead or retired owner's box is free even with mail queued: the newcomer is shown it",
     "a box of another session with mail waiting is held (the ladder widens)",
     "that mail is for its addressee, who may resume")
def _(env, fake_session):
    helm_owner(env, "proj-abcd", 4_000_000, "s-dead-old", retiredAt=5)
    env.drop("proj-abcd", subject="not-for-you")
    claim(env, "s-new-0000-abcd")
    mine = box_of(env, "s-new-0000-abcd")
    assert mine != "proj-abcd"
    assert "not-for-you" not in deliver(env, "s-new-0000-abcd")
    assert len(queued(env, "proj-abcd")) == 1


@row("N6-unreadable-owner", "an unreadable owner.json is free: overwritten", "held: not ours to take",
     "we cannot tell whose it is")
def _(env, fake_session):
    (env.mail / "proj-abcd").mkdir()
    (env.mail / "proj-abcd" / "owner.json").write_text("{not json")
    claim(env, "s-n6-0000-abcd")
    assert box_of(env, "s-n6-0000-abcd") != "proj-abcd"
    assert (env.mail / "proj-abcd" / "owner.json").read_text() == "{not json"


@row("N7-unparseable", "an unparseable message is moved into read/ and never shown",
     "shown as unreadable (its path), then moved", "a message nobody hears of is lost")
def _(env, fake_session):
    claim(env, "s-n7-0000-abcd")
    (env.mail / "proj-abcd" / "1-aaaaaa.json").write_text("{broken")
    out = deliver(env, "s-n7-0000-abcd")
    assert "unreadable message: malformed_json" in out and "1-aaaaaa.json" in out


@row("N10-no-read-dir", "a box without read/ can never be drained", "read/ is created",
     "mail stranded for good is lost mail")
def _(env, fake_session):
    claim(env, "s-n10-0000-abcd")
    os.rmdir(env.mail / "proj-abcd" / "read")
    env.drop("proj-abcd", subject="drained")
    assert "drained" in deliver(env, "s-n10-0000-abcd")
    assert queued(env, "proj-abcd") == []


@row("N11-null-payload", "a payload of `null` exits 1 with a stack trace", "exit 0, nothing done",
     "a hook must never fail the prompt (helm's own stated contract)")
def _(env, fake_session):
    for verb in ("claim", "deliver"):
        p = hook(env, verb, b"null")
        assert p.returncode == 0 and p.stderr == b""


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_conformance(r: Row, env, fake_session):
    assert r.helm and r.courier  # every row states both sides
    r.check(env, fake_session)


# ---------------------------------------------------------------- mixed fleets


def write_like_skill(box: Path, sender: str, subject: str, body: str) -> str:
    """helm's skill snippet: Python json.dump defaults (", " separators, ASCII escapes, no newline) into
    .tmp-$ID (no .json), umask mode, then mv; sentAt in whole seconds times 1000."""
    mid = f"{int(time.time())}000-{os.urandom(3).hex()}"
    tmp = box / f".tmp-{mid}"
    with open(tmp, "w") as f:
        json.dump({"id": mid, "from": sender, "to": box.name, "subject": subject, "body": body,
                   "sentAt": int(mid.split("-")[0])}, f)
    os.rename(tmp, box / f"{mid}.json")
    return f"{mid}.json"


def write_like_app(box: Path, subject: str, body: str) -> str:
    """helm's app (Mailbox.deliver): compact JSON, `/` escaped, no newline, .tmp-<id> at 0600, then a move."""
    mid = f"{int(time.time() * 1000)}-{os.urandom(3).hex()}"
    data = json.dumps({"id": mid, "from": "operator", "to": box.name, "subject": subject, "body": body,
                       "sentAt": int(time.time() * 1000)}, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")
    tmp = box / f".tmp-{mid}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data.encode())
    os.close(fd)
    os.rename(tmp, box / f"{mid}.json")
    return f"{mid}.json"


def write_like_pi(box: Path, sender: str, subject: str, body: str) -> str:
    """pi's send(): JSON.stringify(m, null, 2) + newline, .tmp-<12 hex> at 0600, then rename."""
    mid = f"{int(time.time() * 1000)}-{os.urandom(3).hex()}"
    tmp = box / f".tmp-{os.urandom(6).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (json.dumps({"id": mid, "from": sender, "to": box.name, "subject": subject, "body": body,
                              "sentAt": int(time.time() * 1000)}, indent=2, ensure_ascii=False) + "\n").encode())
    os.close(fd)
    os.rename(tmp, box / f"{mid}.json")
    return f"{mid}.json"


def helm_deliver(box: Path) -> list[str]:
    """What helm's deliver does to a box: every non-hidden *.json but owner.json, sorted, renamed into read/."""
    taken = []
    for name in sorted(os.listdir(box)):
        if name.endswith(".json") and name != "owner.json" and not name.startswith("."):
            os.rename(box / name, box / "read" / name)
            taken.append(name)
    return taken


def test_every_sender_format_is_rung_and_delivered_by_courier(env, fake_session, daemon):
    """Mail written as helm's skill, helm's app and pi write it, into a box helm's hook claimed (a registry row
    named <pid>-<suffix>.json without procStart): rung by the daemon, shown by courier's hook, nothing lost."""
    sid = "s-mixed-0000-abcd"
    fs = fake_session(sid)
    rec = json.loads((env.registry / f"{fs.pid}.json").read_text())
    (env.registry / f"{fs.pid}.json").unlink()
    rec.pop("procStart")
    (env.registry / f"{fs.pid}-{sid}.json").write_text(json.dumps(rec))
    box = helm_owner(env, "proj-abcd", fs.pid, sid)
    d = daemon("--min-poke-interval", "0.05s")
    names = [write_like_skill(box, "agent-skill", "via skill", "BODY-1"),
             write_like_app(box, "via app: a/b", "BODY-2"),
             write_like_pi(box, "agent-pi", "via pi", "BODY-3")]
    wait_for(fs.lines, what="the doorbell")
    # the fake records the line when it reads EOF; the daemon logs poke_sent just after
    assert d.wait_event("poke_sent", handle="proj-abcd")[0]["weak_liveness"] is True
    out = deliver(env, sid)
    for subject in ("via skill", "via app: a/b", "via pi"):
        assert subject in out
    assert "BODY" not in out
    assert sorted(os.listdir(box / "read")) == sorted(names)


def test_a_box_claimed_by_courier_is_read_by_helm_and_back(env, fake_session):
    """courier claims, `courier send` writes, helm's deliver (its rule, simulated) takes it; helm's hook claims the
    next box, pi writes into it, courier's deliver takes it. Each message reaches its addressee exactly once."""
    a = fake_session("s-side-a-0000-aaaa")
    claim(env, "s-side-a-0000-aaaa", cwd="/w/a")
    p = subprocess.run([sys.executable, "-m", "courier", "send", "a-aaaa", "--from", "b-bbbb", "--subject", "to-a",
                        "--body", "x"], env=env.vars(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert helm_deliver(env.mail / "a-aaaa") == [Path(p.stdout.strip()).name]
    b = fake_session("s-side-b-0000-bbbb")
    box_b = helm_owner(env, "b-bbbb", b.pid, "s-side-b-0000-bbbb", cwd="/w/b")
    name = write_like_pi(box_b, "a-aaaa", "to-b", "y")
    out = deliver(env, "s-side-b-0000-bbbb")
    assert "to-b" in out and "to-a" not in out
    assert os.listdir(box_b / "read") == [name] and queued(env, "b-bbbb") == []
    assert a.lines() == [] and b.lines() == []  # no daemon ran: hooks alone move mail


def test_one_daemon_serves_every_suite_root(env, fake_session, daemon):
    """helm keeps a mail root per suite; with no --mail-dir and no HELM_MAIL_DIR, one courier serves them all, and
    status groups its rows by root."""
    helm_dir = env.home / ".helm"
    for name in ("mail", "mail-drive"):
        (helm_dir / name).mkdir(parents=True, mode=0o700)
    one, two = fake_session("s-suite-one"), fake_session("s-suite-two")
    for root, fs, handle in ((helm_dir / "mail", one, "one-0001"), (helm_dir / "mail-drive", two, "two-0001")):
        box = root / handle
        (box / "read").mkdir(parents=True)
        (box / "owner.json").write_text(json.dumps({"handle": handle, "runtime": "claude", "pid": fs.pid,
                                                    "sessionId": fs.session_id}))
    d = daemon(env_extra={"HELM_MAIL_DIR": ""})
    from courier import mailbox

    mailbox.drop_message(helm_dir / "mail", "one-0001", sender="x", subject="y", body="z")
    mailbox.drop_message(helm_dir / "mail-drive", "two-0001", sender="x", subject="y", body="z")
    wait_for(one.lines, what="ring in the default root")
    wait_for(two.lines, what="ring in the suite root")
    d.wait_event("poke_sent", count=2)  # logged just after the fake has read the line
    sent = {e["handle"]: e for e in d.events("poke_sent")}
    assert sent["two-0001"]["root"] == str(helm_dir / "mail-drive")
    p = subprocess.run([sys.executable, "-m", "courier", "status"], env=dict(env.vars(), HELM_MAIL_DIR=""),
                       capture_output=True, text=True, timeout=60)
    assert f"# {helm_dir / 'mail'}" in p.stdout and f"# {helm_dir / 'mail-drive'}" in p.stdout
