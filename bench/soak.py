"""Soak (#12 item 9): ~1,000,000 messages through 1,000 boxes while 100 fake sessions come and go.

    .venv/bin/python bench/soak.py [--messages 1000000] [--max-seconds 1800] [--boxes 1000] [--sessions 100]
                                   [--churn-every 5] [--churn 5] [--sample-every 5] [--max-queued 3000] [--plain]
                                   [--json-out F] [--samples-out F]

Everything is a real process. courier runs `courier run --min-poke-interval 0 --wake-cap
1000 --wake-half-life 10s` (no pacing; a brake no session reaches at these rates, 1,000 being
the config's maximum), through bench/soak_daemon.py, which adds a thread that writes the sizes
of the daemon's own tables (--plain runs `python -m courier run` instead). The fake sessions are
forked by a small host process (this file, `--host`): each binds `<pid>.sock`, writes its
registry record exactly as Claude does, and on every doorbell line tells the driver which
box it names (a datagram) — the driver then plays the prompt hook and moves that box's
mail into read/ (link, then unlink, as `courier hook deliver` does), so the box re-arms.
Sessions answer receipts by temperament: none (60 %), `delivered` (25 %), `dropped` on
every other line (10 %: the retry carries the mail), `held` (5 %: blocked for good; an
"operator" sweep consumes mail that waited 20 s, as a person typing a prompt would, and
records the operator turn). 80 % of sessions put their socket in the shared
`$XDG_RUNTIME_DIR/cc-socks`, 20 % in a directory of their own (receipt listeners: one per
directory, capped).

Every `--churn-every` seconds `--churn` sessions end, half cleanly (SIGTERM: record and
socket removed), half by SIGKILL (record and socket stay; removed 30 s later, as Claude's
next start would), and as many new sessions (new ids, new pids) claim their boxes: each
box's owner.json is rewritten to name the new session (at once for a clean end, 2 s later
for a crash, so mail lands in boxes with a dead owner meanwhile).

The driver drops as fast as the daemon keeps up: the convention's `.tmp-*` then rename,
into random boxes, while fewer than --max-queued messages wait; names are
`<millis>-<per-box counter, 6 hex>.json`, so the end can prove 0 lost: every counter
0..n-1 of every box is in the box or its read/. Every --sample-every seconds: the daemon's
VmRSS, open descriptors (/proc/<pid>/fd), threads, status.json (stats, boxes listed),
wakecap.json (recipients, lastRing), its log (events by name), the registry, and the
sizes file. Growth after warm-up = mean of the last 10 % of samples / mean of the 10 %
that follow the warm-up (--warmup-frac of the run) - 1.

Trust: benchmark-only; private HOME, CLAUDE_CONFIG_DIR, HELM_MAIL_DIR, XDG_RUNTIME_DIR and
COURIER_STATE_DIR; every child stopped by its pid (the host kills its children by pid).
Logs: courier's JSON log in the world (<tmp>/courier.log); progress lines on stderr; the
result as one JSON object on stdout (and appended to --json-out).
Limits: the fake sessions consume at once (a real one takes seconds), which is the point:
it keeps rings coming. Linux only (/proc, inotify).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "tests"))
import bench  # noqa: E402
from fakesession import kill_all, read_connection, send_receipt, write_record  # noqa: E402

NAME_RE = re.compile(r"^([0-9]{13})-([0-9a-f]{6})\.json$")
MODES = [("none", 60), ("delivered", 25), ("dropped", 10), ("held", 5)]
OWN_DIR_PCT = 20
STALE_CLEANUP_S = 30.0
CRASH_CLAIM_DELAY_S = 2.0
OPERATOR_AFTER_S = 20.0
EVENTS = ("poke_sent", "poke_failed", "poke_receipt", "poke_delivered", "box_failed", "box_gone", "wake_capped",
          "session_holds_doorbells", "receipt_listener_closed", "receipt_listener_failed", "stale_listener_removed",
          "watch_overflow", "rescan_done", "state_write_failed", "peer_reply_ignored", "receipt_rejected",
          "receipt_connection_failed", "watch_failed", "poke_held")


# ================================================================ the session host (a separate process)


def session_child(sid: str, sockdir: str, registry: str, mode: str, notify_path: str) -> None:
    pid = os.getpid()
    path = os.path.join(sockdir, f"{pid}.sock")
    record = os.path.join(registry, f"{pid}.json")

    def leave(*_):
        for p in (record, path):
            try:
                os.unlink(p)
            except OSError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(256)
    write_record(registry, pid, sid, path, cwd="/soak")
    note = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    seen = 0
    while True:
        conn, _ = sock.accept()
        for line in read_connection(conn, 5.0):
            try:
                box = line["message"]["content"].split("mailbox ", 1)[1].split("/ .", 1)[0]
            except (KeyError, IndexError, TypeError, AttributeError):
                continue
            seen += 1
            wake = True
            receipt = None
            if mode == "delivered":
                receipt = "delivered"
            elif mode == "dropped" and seen % 2 == 1:
                receipt, wake = "dropped", False
            elif mode == "held":
                receipt, wake = "held", False
            if receipt:
                try:
                    send_receipt(line, receipt)
                except OSError:
                    pass
            if wake:
                try:
                    note.sendto(box.encode(), notify_path)
                except OSError:
                    pass  # the driver's queue is full: its operator sweep will find the mail


def host_main() -> int:
    """Read commands on stdin: `spawn SID SOCKDIR MODE` -> `pid`; `term PID`; `kill PID`; `quit`."""
    registry, notify_path = sys.argv[2], sys.argv[3]
    kids: set[int] = set()
    def stop(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        for raw in sys.stdin:
            cmd = raw.split()
            if not cmd:
                continue
            if cmd[0] == "spawn":
                sid, sockdir, mode = cmd[1], cmd[2], cmd[3]
                pid = os.fork()
                if pid == 0:
                    try:
                        devnull = os.open(os.devnull, os.O_RDWR)
                        os.dup2(devnull, 0)
                        os.dup2(devnull, 1)
                        signal.signal(signal.SIGTERM, signal.SIG_DFL)
                        session_child(sid, sockdir, registry, mode, notify_path)
                    finally:
                        os._exit(0)
                kids.add(pid)
                deadline = time.time() + 10
                while not os.path.exists(os.path.join(registry, f"{pid}.json")) and time.time() < deadline:
                    time.sleep(0.002)
                print(pid, flush=True)
            elif cmd[0] in ("term", "kill"):
                pid = int(cmd[1])
                if pid in kids:
                    os.kill(pid, signal.SIGTERM if cmd[0] == "term" else signal.SIGKILL)
                    os.waitpid(pid, 0)
                    kids.discard(pid)
                print("ok", flush=True)
            elif cmd[0] == "quit":
                break
    finally:
        kill_all(kids)
    return 0


# ================================================================ the driver


class Host:
    def __init__(self, w: bench.World, notify_path: str):
        self.p = subprocess.Popen([sys.executable, __file__, "--host", str(w.claude / "sessions"), notify_path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=w.env)
        w.procs.append(self.p)

    def ask(self, line: str) -> str:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.w = bench.World()
        self.notify_path = str(self.w.root / "notify.sock")
        self.note = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.note.bind(self.notify_path)
        self.note.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.note.setblocking(False)
        self.host = Host(self.w, self.notify_path)
        self.handles = [f"s-{i:04d}" for i in range(args.boxes)]
        self.dropped = [0] * args.boxes
        self.queued = [0] * args.boxes  # messages the driver put in and has not moved out
        self.waiting_since: list[float | None] = [None] * args.boxes
        self.owner_of = [0] * args.boxes  # box index -> session slot
        self.sessions: list[dict] = []  # slot -> {sid, pid, mode, sockdir}
        self.gen = 0
        self.total_dropped = self.total_consumed = self.by_doorbell = self.by_operator = 0
        self.doorbells = 0
        self.ended = {"term": 0, "kill": 0}
        self.stale: list[tuple[float, int, str]] = []  # (when, pid, sockdir): records to clean after a crash
        self.pending_claims: list[tuple[float, int]] = []  # (when, slot)
        self.samples: list[dict] = []
        self.log_pos = 0
        self.events = {e: 0 for e in EVENTS}
        self.log_partial = b""
        self.tmp_seq = 0

    # ------------------------------------------------------------ sessions

    def spawn(self, slot: int) -> dict:
        self.gen += 1
        sid = f"soak-{self.gen:06d}-{random.getrandbits(32):08x}"
        mode = self.rng.choices([m for m, _ in MODES], [wt for _, wt in MODES])[0]
        if self.rng.randrange(100) < OWN_DIR_PCT:
            sockdir = self.w.runtime / f"own-{self.gen:06d}" / "cc-socks"
            sockdir.mkdir(parents=True, mode=0o700)
            os.chmod(sockdir.parent, 0o700)
        else:
            sockdir = self.w.socks
        pid = int(self.host.ask(f"spawn {sid} {sockdir} {mode}"))
        s = {"sid": sid, "pid": pid, "mode": mode, "sockdir": str(sockdir), "born": time.time()}
        if slot < len(self.sessions):
            self.sessions[slot] = s
        else:
            self.sessions.append(s)
        return s

    def claim(self, slot: int) -> None:
        """Every box of this slot now names the slot's session (what its SessionStart hook would write)."""
        s = self.sessions[slot]
        for b in range(slot, self.args.boxes, self.args.sessions):
            box = self.w.mail / self.handles[b]
            owner = {"handle": self.handles[b], "runtime": "claude", "pid": s["pid"], "sessionId": s["sid"],
                     "cwd": "/soak", "claimedAt": int(time.time() * 1000)}
            tmp = box / f".owner-{os.getpid()}.tmp"
            tmp.write_text(json.dumps(owner))
            os.rename(tmp, box / "owner.json")

    def churn(self, now: float) -> None:
        for slot in self.rng.sample(range(self.args.sessions), self.args.churn):
            if any(c[1] == slot for c in self.pending_claims):
                continue
            old = self.sessions[slot]
            how = "term" if self.rng.random() < 0.5 else "kill"
            if how == "term":  # a clean end: the new session claims at once, then the old one leaves
                self.spawn(slot)
                self.claim(slot)
                self.host.ask(f"term {old['pid']}")
            else:  # a crash: the owner is dead for a while before a new session claims the boxes
                self.host.ask(f"kill {old['pid']}")
                self.stale.append((now + STALE_CLEANUP_S, old["pid"], old["sockdir"]))
                self.spawn(slot)
                self.pending_claims.append((now + CRASH_CLAIM_DELAY_S, slot))
            self.ended[how] += 1

    def housekeeping(self, now: float) -> None:
        due = [c for c in self.pending_claims if c[0] <= now]
        self.pending_claims = [c for c in self.pending_claims if c[0] > now]
        for _, slot in due:
            self.claim(slot)
        keep = []
        for when, pid, sockdir in self.stale:
            if when > now:
                keep.append((when, pid, sockdir))
                continue
            for p in (self.w.claude / "sessions" / f"{pid}.json", Path(sockdir) / f"{pid}.sock"):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        self.stale = keep

    # ------------------------------------------------------------ mail

    def drop(self, b: int) -> None:
        box = self.w.mail / self.handles[b]
        now_ms = int(time.time() * 1000)
        name = f"{now_ms}-{self.dropped[b]:06x}.json"
        self.tmp_seq += 1
        tmp = box / f".tmp-{os.getpid()}-{self.tmp_seq}"
        msg = json.dumps({"id": name[:-5], "from": "soak", "to": self.handles[b], "subject": f"m{self.dropped[b]}",
                          "body": "soak", "sentAt": now_ms})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, msg.encode())
        finally:
            os.close(fd)
        os.rename(tmp, box / name)
        self.dropped[b] += 1
        self.total_dropped += 1
        self.queued[b] += 1
        if self.waiting_since[b] is None:
            self.waiting_since[b] = time.time()

    def consume(self, b: int) -> int:
        """What `courier hook deliver` does to the mail: link into read/, then unlink."""
        box = self.w.mail / self.handles[b]
        moved = 0
        box_fd = os.open(box, os.O_RDONLY | os.O_DIRECTORY)
        try:
            read_fd = os.open("read", os.O_RDONLY | os.O_DIRECTORY, dir_fd=box_fd)
            try:
                for name in os.listdir(box_fd):
                    if not NAME_RE.match(name):
                        continue
                    try:
                        os.link(name, name, src_dir_fd=box_fd, dst_dir_fd=read_fd)
                    except FileExistsError:
                        pass  # linked by an earlier consume that did not get to unlink
                    except FileNotFoundError:
                        continue
                    os.unlink(name, dir_fd=box_fd)
                    moved += 1
            finally:
                os.close(read_fd)
        finally:
            os.close(box_fd)
        self.queued[b] -= moved
        self.total_consumed += moved
        if self.queued[b] == 0:
            self.waiting_since[b] = None
        return moved

    def operator_turn(self, b: int) -> None:
        s = self.sessions[self.owner_of[b]]
        d = self.w.state / "operator-turns"
        d.mkdir(parents=True, exist_ok=True)
        for name in (f"s-{s['sid']}",):  # one file a prompt, as the hook writes it
            tmp = d / f".{name}.tmp"
            tmp.write_text(json.dumps({"at": time.time()}))
            os.rename(tmp, d / name)

    def doorbells_in(self) -> int:
        n = 0
        while True:
            try:
                data = self.note.recv(4096)
            except BlockingIOError:
                return n
            name = os.path.basename(data.decode(errors="replace").rstrip("/"))
            b = self.index.get(name)
            if b is None:
                continue
            n += 1
            self.doorbells += 1
            self.by_doorbell += self.consume(b)

    def operator_sweep(self, now: float, older_than: float) -> None:
        for b, since in enumerate(self.waiting_since):
            if since is not None and now - since >= older_than:
                self.operator_turn(b)
                self.by_operator += self.consume(b)

    # ------------------------------------------------------------ observing the daemon

    def read_log(self) -> None:
        log = self.w.root / "courier.log"
        try:
            with open(log, "rb") as f:
                f.seek(self.log_pos)
                chunk = f.read()
        except OSError:
            return
        self.log_pos += len(chunk)
        data = self.log_partial + chunk
        lines = data.split(b"\n")
        self.log_partial = lines.pop()
        for raw in lines:
            i = raw.find(b'"event": "')
            if i < 0:
                continue
            j = raw.find(b'"', i + 10)
            ev = raw[i + 10:j].decode(errors="replace")
            if ev in self.events:
                self.events[ev] += 1
            else:
                self.events[ev] = 1

    def sample(self, t0: float) -> dict:
        pid = self.daemon.pid
        cur, hwm = bench.rss(pid)
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            threads = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            fds = threads = -1
        self.read_log()
        st = {}
        try:
            st = json.loads((self.w.state / "status.json").read_text())
        except (OSError, ValueError):
            pass
        wc = {}
        try:
            raw = (self.w.state / "wakecap.json").read_bytes()
            wc = json.loads(raw)
            wc_bytes = len(raw)
        except (OSError, ValueError):
            wc_bytes = None
        sizes = {}
        if self.sizes_path and self.sizes_path.exists():
            with open(self.sizes_path, "rb") as f:
                try:
                    f.seek(-4096, os.SEEK_END)
                except OSError:
                    pass
                tail = f.read().splitlines()
            for raw in reversed(tail):
                try:
                    sizes = json.loads(raw)
                    break
                except ValueError:
                    continue
        try:
            log_bytes = os.path.getsize(self.w.root / "courier.log")
        except OSError:
            log_bytes = None
        row = {"t": round(time.monotonic() - t0, 1), "rss_mb": round(cur, 2), "hwm_mb": round(hwm, 2), "fds": fds,
               "threads": threads, "dropped": self.total_dropped, "consumed": self.total_consumed,
               "queued": self.total_dropped - self.total_consumed, "doorbells": self.doorbells,
               "status_boxes": len(st.get("boxes", {})), "stats": st.get("stats"),
               "wake_recipients": len(wc.get("recipients", {})) if wc else None,
               "wake_last_ring": len(wc.get("lastRing", {})) if wc else None, "wakecap_bytes": wc_bytes,
               "registry_records": sum(1 for n in os.listdir(self.w.claude / "sessions") if n.endswith(".json")),
               "log_bytes": log_bytes, "sizes": {k: v for k, v in sizes.items() if k != "t"},
               "load": bench.load()}
        self.samples.append(row)
        return row

    # ------------------------------------------------------------ the run

    def start(self) -> None:
        a = self.args
        for h in self.handles:
            (self.w.mail / h / "read").mkdir(parents=True)
        self.index = {h: i for i, h in enumerate(self.handles)}
        for slot in range(a.sessions):
            self.spawn(slot)
        for b in range(a.boxes):
            self.owner_of[b] = b % a.sessions
        for slot in range(a.sessions):
            self.claim(slot)
        time.sleep(1.5)  # boxes settled (the rescan's racy-mtime rule)
        flags = ["--min-poke-interval", "0", "--wake-cap", "1000", "--wake-half-life", "10s"]
        log = self.w.root / "courier.log"
        if a.plain:
            self.sizes_path = None
            self.daemon = self.w.courier(*flags, log=log)
        else:
            self.sizes_path = self.w.root / "sizes.jsonl"
            env = dict(self.w.env)
            with open(log, "w") as err:
                self.daemon = subprocess.Popen([sys.executable, str(BENCH / "soak_daemon.py"), str(self.sizes_path),
                                                str(a.sample_every), *flags], env=env, stdout=subprocess.DEVNULL,
                                               stderr=err)
            self.w.procs.append(self.daemon)
        self.ready = self.w.ready_event(log)[1]

    def run(self) -> dict:
        a = self.args
        t0 = time.monotonic()
        l0 = bench.load()
        next_churn = t0 + a.churn_every
        next_sample = t0
        next_sweep = t0 + 10.0
        next_progress = t0 + 60.0
        while self.total_dropped < a.messages and time.monotonic() - t0 < a.max_seconds:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"courier exited {self.daemon.returncode}")
            now = time.monotonic()
            if now >= next_sample:
                self.sample(t0)
                next_sample += a.sample_every
            if now >= next_churn:
                self.churn(time.time())
                next_churn += a.churn_every
            if now >= next_sweep:
                self.operator_sweep(time.time(), OPERATOR_AFTER_S)
                next_sweep += 10.0
            if now >= next_progress:
                r = self.samples[-1]
                print(f"soak t={r['t']}s dropped={self.total_dropped} queued={r['queued']} rss={r['rss_mb']}MB "
                      f"fds={r['fds']} load={r['load']}", file=sys.stderr, flush=True)
                next_progress += 60.0
            self.housekeeping(time.time())
            room = a.max_queued - (self.total_dropped - self.total_consumed)
            if room > 0:
                for _ in range(min(room, a.chunk, a.messages - self.total_dropped)):
                    self.drop(self.rng.randrange(a.boxes))
            else:
                select.select([self.note], [], [], 0.02)
            self.doorbells_in()
        drop_s = time.monotonic() - t0
        # Drain: the daemon rings what is left; whatever a held or dead session keeps, the operator takes.
        deadline = time.monotonic() + 60
        while self.total_dropped > self.total_consumed and time.monotonic() < deadline:
            select.select([self.note], [], [], 0.05)
            self.doorbells_in()
            self.housekeeping(time.time())
            self.operator_sweep(time.time(), OPERATOR_AFTER_S)
        left_after_drain = self.total_dropped - self.total_consumed
        self.sample(t0)
        final = self.samples[-1]
        verdict = self.verify()
        return {"drop_phase_s": round(drop_s, 1), "load_before": l0, "left_queued_after_drain": left_after_drain,
                "final": final, **verdict}

    def verify(self) -> dict:
        """Every counter 0..n-1 of every box is in the box or its read/; nothing twice."""
        lost = dup = extra = in_box = in_read = 0
        lost_examples = []
        for b, h in enumerate(self.handles):
            box = self.w.mail / h
            seen: dict[int, int] = {}
            for where in (box, box / "read"):
                for name in os.listdir(where):
                    m = NAME_RE.match(name)
                    if not m:
                        continue
                    c = int(m.group(2), 16)
                    seen[c] = seen.get(c, 0) + 1
                    if where == box:
                        in_box += 1
                    else:
                        in_read += 1
            for c in range(self.dropped[b]):
                n = seen.pop(c, 0)
                if n == 0:
                    lost += 1
                    if len(lost_examples) < 5:
                        lost_examples.append(f"{h}#{c}")
                elif n > 1:
                    dup += n - 1
            extra += sum(seen.values())
        return {"verified_dropped": sum(self.dropped), "lost": lost, "lost_examples": lost_examples,
                "duplicates": dup, "unexpected": extra, "in_boxes": in_box, "in_read": in_read}

    def close(self) -> None:
        try:
            self.host.ask("quit")
        except (OSError, ValueError):
            pass
        self.note.close()
        self.w.close()


def growth(samples: list[dict], key, warmup_frac: float) -> dict:
    vals = [(s["t"], key(s)) for s in samples if key(s) is not None]
    if len(vals) < 10:
        return {}
    start = int(len(vals) * warmup_frac)
    post = vals[start:]
    n = max(1, len(post) // 10)
    first = statistics.mean(v for _, v in post[:n])
    last = statistics.mean(v for _, v in post[-n:])
    return {"warmup_end_t": post[0][0], "after_warmup": round(first, 2), "end": round(last, 2),
            "growth_pct": round(100 * (last - first) / first, 2) if first else None,
            "min_after": min(v for _, v in post), "max_after": max(v for _, v in post),
            "max_overall": max(v for _, v in vals)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--host":
        return host_main()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    ap.add_argument("--boxes", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--churn-every", type=float, default=5.0)
    ap.add_argument("--churn", type=int, default=5)
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--max-queued", type=int, default=3000, help="drop only while fewer than this wait")
    ap.add_argument("--chunk", type=int, default=100, help="drops between looks at the doorbells")
    ap.add_argument("--warmup-frac", type=float, default=1 / 3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plain", action="store_true", help="python -m courier run, without the sizes thread")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--samples-out", default=None, help="write every sample here (JSON lines)")
    args = ap.parse_args()
    s = Soak(args)
    try:
        s.start()
        r = s.run()
    finally:
        s.close()
    samples = s.samples
    m = bench.machine()
    sz = lambda k: (lambda row: row["sizes"].get(k))  # noqa: E731
    result = {
        "test": "soak", "commit": m["commit"], "src_modified": m["src_modified"], "argv": sys.argv[1:],
        "watcher": s.ready.get("watcher"), "boxes": args.boxes, "sessions": args.sessions,
        "sessions_started": s.gen, "sessions_ended": s.ended, **r,
        "messages_per_s": round(r["verified_dropped"] / r["drop_phase_s"], 1) if r["drop_phase_s"] else None,
        "consumed_by_doorbell": s.by_doorbell, "consumed_by_operator": s.by_operator, "doorbells": s.doorbells,
        "events": s.events, "load_after": bench.load(), "samples": len(samples),
        "growth": {
            "rss_mb": growth(samples, lambda x: x["rss_mb"], args.warmup_frac),
            "fds": growth(samples, lambda x: x["fds"], args.warmup_frac),
            "threads": growth(samples, lambda x: x["threads"], args.warmup_frac),
            "wake_recipients": growth(samples, lambda x: x["wake_recipients"], args.warmup_frac),
            "wakecap_bytes": growth(samples, lambda x: x["wakecap_bytes"], args.warmup_frac),
            "status_boxes": growth(samples, lambda x: x["status_boxes"], args.warmup_frac),
            "registry_records": growth(samples, lambda x: x["registry_records"], args.warmup_frac),
            **{k: growth(samples, sz(k), args.warmup_frac) for k in (
                "blocks_allocated", "boxes", "timers", "last_wake", "sighted", "session_index", "receipts_pending",
                "receipts_blocks", "receipts_warned_held", "receipts_retried", "listeners", "listener_failed_dirs",
                "peer_line_buckets", "wake_levels", "wake_last_ring", "bad_turns_logged", "watch_wds",
                "watch_boxes", "poke_tasks", "receipt_tasks", "receipt_conns", "skipped_logged", "waiters_index")},
        },
    }
    if args.samples_out:
        with open(args.samples_out, "w") as f:
            for row in samples:
                f.write(json.dumps(row) + "\n")
    print(json.dumps(result, indent=1))
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 1 if r["lost"] or r["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
