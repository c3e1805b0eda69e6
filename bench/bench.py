"""courier benchmarks: notice latency against a raw inotify floor, burst, idle cost per thread, memory, hook cost.

    .venv/bin/python bench/bench.py [--quick] [--only latency,burst,idle,rss,cold,hook] [--repeat N] [--json-out F]

Every process is real. courier runs as `python -m courier run`; the fake sessions
are tests/fleet.py (one forked process per session, a real socket, a real registry
record, every received line appended with its arrival time); the floor is
bench/floor_inotify.py (inotify read in trio's loop, one line per event to a socket
resolved before the run). Every drop follows the convention: write `.tmp-*`, then
rename to `<millis>-<6hex>.json`. Everything lives in a private temporary HOME;
nothing touches ~/.claude or ~/.helm. Every child is stopped by its pid.

Watchers (kinds): `floor`, `courier` (the default backend, which must report
`watcher: inotify` on Linux), `wf-20/10` and `wf-1/1` (courier with --watcher
watchfiles at debounce/step 20/10 ms and 1/1 ms). By default the latency test runs
`floor` and `courier` paired (at the same time, each over its own world, drops taking
turns) and the watchfiles kinds one after another for reference; --quick runs all four
one after another on 50 boxes.

Correctness failures (a drop never rung, a box never rung in the burst, a message
lost) exit non-zero; timings never do. Each result is one JSON line on stdout
(and appended to --json-out), with the load average before and after.

Trust: benchmark-only; messages are the bench's own; paths come from its own temporary dirs.
Logs: courier's JSON log per world (<tmp>/courier.log, read for readiness and rescans); results on stdout.
Limits: 2-core machines shared with other work make tails noisy: compare watchers paired (--paired)
and read the load average recorded with every row. Linux only (/proc, inotify).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
PY = sys.executable

KINDS = {
    "floor": None,
    "courier": [],  # the default: --watcher auto, which is inotify on Linux
    "wf-20/10": ["--watcher", "watchfiles", "--debounce-ms", "20", "--step-ms", "10"],
    "wf-1/1": ["--watcher", "watchfiles", "--debounce-ms", "1", "--step-ms", "1"],
}
# Rings as fast as the bench drops: no per-session pacing, and a cap no run reaches
# (the fleet shares each session among many boxes; the wake cap is per session).
UNPACED = ["--min-poke-interval", "0", "--wake-cap", "1000"]


# ---------------------------------------------------------------- the world


class World:
    """A private HOME with a mail root, a Claude config dir, a state dir; the processes started in it."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="crb-", dir="/tmp"))
        self.mail = self.root / "m"
        self.claude = self.root / "c"
        self.state = self.root / "s"
        self.runtime = self.root / "r"
        self.socks = self.runtime / "cc-socks"
        self.mail.mkdir(mode=0o700)
        (self.claude / "sessions").mkdir(parents=True, mode=0o700)
        self.runtime.mkdir(mode=0o700)
        self.socks.mkdir(mode=0o700)
        self.env = dict(os.environ, HOME=str(self.root), CLAUDE_CONFIG_DIR=str(self.claude), HELM_MAIL_DIR=str(self.mail),
                        XDG_RUNTIME_DIR=str(self.runtime), COURIER_STATE_DIR=str(self.state),
                        XDG_CONFIG_HOME=str(self.root / "xdg-config"), XDG_STATE_HOME=str(self.root / "xdg-state"),
                        PYTHONUNBUFFERED="1")
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "COURIER_CONFIG", "HELM_MAIL_HANDLE", "HELM_DEFAULTS_SUITE"):
            self.env.pop(k, None)
        self.procs: list[subprocess.Popen] = []

    def claim(self, handle: str, pid: int, sid: str) -> Path:
        box = self.mail / handle
        (box / "read").mkdir(parents=True, exist_ok=True)
        (box / "owner.json").write_text(json.dumps({"handle": handle, "runtime": "claude", "pid": pid, "sessionId": sid}))
        return box

    def courier(self, *args, log: Path | None = None, env_extra=None) -> subprocess.Popen:
        env = dict(self.env, **(env_extra or {}))
        with open(log or self.root / "courier.log", "w") as err:
            p = subprocess.Popen([PY, "-m", "courier", "run", *args], env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.procs.append(p)
        return p

    def wait_ready(self, log: Path, timeout=120.0) -> float:
        return self.ready_event(log, timeout)[0]

    def ready_event(self, log: Path, timeout=120.0) -> tuple[float, dict]:
        """(monotonic time it was seen, the daemon_ready record)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists():
                for raw in log.read_text().splitlines():
                    if '"daemon_ready"' in raw:
                        return time.monotonic(), json.loads(raw)
            if self.procs and self.procs[-1].poll() is not None:
                break
            time.sleep(0.005)
        raise RuntimeError(f"courier not ready: {log.read_text()[-2000:] if log.exists() else 'no log'}")

    def fleet(self, n: int) -> tuple[list[int], Path]:
        """n fake sessions (tests/fleet.py): their pids, and the directory their received lines go to."""
        out = self.root / "fleet"
        p = subprocess.Popen([PY, str(REPO / "tests" / "fleet.py"), "--sessions", str(n), "--socket-dir", str(self.socks),
                              "--registry", str(self.claude / "sessions"), "--out", str(out)],
                             stdout=subprocess.PIPE, env=self.env, text=True)
        self.procs.append(p)
        info = json.loads(p.stdout.readline())
        return info["pids"], out

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------- mail, by the convention (self-contained)


def drop(box: Path, seq: int, body: str = "b") -> tuple[float, float]:
    """Write `.tmp-*` then rename it into the box. Returns (wall time before the write, before the rename)."""
    now_ms = int(time.time() * 1000)
    name = f"{now_ms}-{random.getrandbits(24):06x}.json"
    tmp = box / f".tmp-{os.getpid()}-{seq}"
    msg = json.dumps({"id": name[:-5], "from": "bench", "to": box.name, "subject": f"s{seq}", "body": body,
                      "sentAt": now_ms})
    t_write = time.time()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, msg.encode())
    finally:
        os.close(fd)
    t_rename = time.time()
    os.rename(tmp, box / name)
    return t_write, t_rename


def drop_message(root: Path, handle: str, *, sender: str = "bench", subject: str = "s", body: str = "b") -> None:
    """The same drop for callers that have a root and a handle (pingpong)."""
    drop(root / handle, random.getrandbits(32), body)


def queued(box: Path) -> int:
    """Messages waiting in a box: plain `*.json` names other than owner.json."""
    try:
        return sum(1 for n in os.listdir(box) if n.endswith(".json") and not n.startswith(".") and n != "owner.json")
    except FileNotFoundError:
        return 0


def fleet_rings(out: Path) -> dict[str, list[float]]:
    """box name -> arrival times (wall) of every doorbell line the fleet received for it."""
    rings: dict[str, list[float]] = {}
    for f in out.glob("*.jsonl"):
        for raw in f.read_text().splitlines():
            try:
                rec = json.loads(raw)
                box = rec["line"]["message"]["content"].split("mailbox ", 1)[1].split("/ .", 1)[0]
            except (ValueError, KeyError, IndexError):
                continue  # a partial last line being written right now
            rings.setdefault(Path(box).name, []).append(rec["at"])
    return rings


# ---------------------------------------------------------------- /proc


def threads(pid: int) -> dict[int, dict]:
    """Per thread: name, on-CPU ns (schedstat), context switches (voluntary + nonvoluntary), utime+stime ticks."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            comm = open(f"{base}/comm").read().strip()
            cpu_ns = int(open(f"{base}/schedstat").read().split()[0])
            vol = nonvol = 0
            for line in open(f"{base}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    vol = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    nonvol = int(line.split()[1])
            raw = open(f"{base}/stat").read()
            fields = raw[raw.rindex(")") + 2 :].split()
            ticks = int(fields[11]) + int(fields[12])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between listdir and read
        out[int(tid)] = {"comm": comm, "cpu_ns": cpu_ns, "vol": vol, "nonvol": nonvol, "ticks": ticks}
    return out


def process_ticks(pid: int) -> int:
    """utime+stime of the whole process, exited threads included."""
    raw = open(f"/proc/{pid}/stat").read()
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def rss(pid: int) -> tuple[float, float]:
    cur = hwm = 0.0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            cur = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return cur, hwm


def thread_delta(a: dict, b: dict, seconds: float) -> list[dict]:
    rows = []
    for tid, t1 in sorted(b.items()):
        t0 = a.get(tid, {"cpu_ns": 0, "vol": 0, "nonvol": 0, "ticks": 0})
        sw = (t1["vol"] - t0["vol"]) + (t1["nonvol"] - t0["nonvol"])
        cpu = (t1["cpu_ns"] - t0["cpu_ns"]) / 1e9
        rows.append({"tid": tid, "comm": t1["comm"], "new": tid not in a, "switches": sw, "per_s": sw / seconds,
                     "voluntary": t1["vol"] - t0["vol"], "nonvoluntary": t1["nonvol"] - t0["nonvol"],
                     "cpu_s": round(cpu, 6), "cpu_pct": 100 * cpu / seconds})
    return rows


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# ---------------------------------------------------------------- watchers


def start_watcher(w: World, kind: str, owners: dict[str, int], extra: list[str] | None = None) -> tuple[subprocess.Popen, dict]:
    """Start one watcher kind over w.mail; return it once armed, with what it said at readiness."""
    if kind == "floor":
        mapping = {h: str(w.socks / f"{pid}.sock") for h, pid in owners.items()}
        map_path = w.root / "floor-map.json"
        map_path.write_text(json.dumps(mapping))
        p = subprocess.Popen([PY, str(BENCH / "floor_inotify.py"), str(w.mail), str(map_path)], env=w.env,
                             stdout=subprocess.PIPE, text=True)
        w.procs.append(p)
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("floor did not start")
        return p, {"watcher": "raw-inotify"}
    log = w.root / "courier.log"
    p = w.courier(*UNPACED, *KINDS[kind], *(extra or []), log=log)
    _, ready = w.ready_event(log)
    return p, ready


def setup_boxes(w: World, boxes: int, sessions: int) -> tuple[list[str], dict[str, int], Path]:
    pids, out = w.fleet(sessions)
    handles = [f"b-{i:05d}" for i in range(boxes)]
    owners = {}
    for i, h in enumerate(handles):
        owners[h] = pids[i % sessions]
        w.claim(h, pids[i % sessions], f"fleet-{i % sessions}")
    return handles, owners, out


# ---------------------------------------------------------------- latency


def latency_run(kind: str, boxes: int, drops: int, spacing_ms: float, sessions: int, seed: int) -> dict:
    """Drops into distinct boxes, `spacing_ms` (±25 %) apart; latency = line arrival - just before the rename."""
    w = World()
    l0 = load()
    try:
        handles, owners, out = setup_boxes(w, boxes, sessions)
        p, ready = start_watcher(w, kind, owners)
        time.sleep(1.0)  # the initial scan's looks and the first state write are over
        rng = random.Random(seed)
        targets = rng.sample(handles, min(drops, boxes))
        sent = []
        for i, h in enumerate(targets):
            tw, tr = drop(w.mail / h, i)
            sent.append((h, tw, tr))
            time.sleep(rng.uniform(0.75, 1.25) * spacing_ms / 1000)
        rings = wait_rings(out, sent, time.monotonic() + 5.0)
        cur, hwm = rss(p.pid)
        lat, lat_w, unrung, _ = latencies(sent, rings)
        lost = len(sent) - sum(queued(w.mail / h) for h, _, _ in sent)
        return {"test": "latency", "kind": kind, "watcher": ready.get("watcher"), "boxes": boxes, "drops": len(sent),
                "sessions": sessions, "spacing_ms": spacing_ms, "unrung": unrung, "lost": lost,
                "p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99), "max": max(lat, default=float("nan")),
                "write_p50": pct(lat_w, 50), "write_p99": pct(lat_w, 99),
                "rss_mb": round(cur, 1), "peak_rss_mb": round(hwm, 1), "load_before": l0, "load_after": load()}
    finally:
        w.close()


def wait_rings(out, sent: list, deadline: float) -> dict:
    """The fleet's rings, polled until every box dropped into has one or `deadline` (monotonic) passes."""
    rings = {}
    while time.monotonic() < deadline:
        rings = fleet_rings(out)
        if all(h in rings for h, _, _ in sent):
            break
        time.sleep(0.1)
    return rings


def latencies(sent: list, rings: dict) -> tuple[list, list, int, list]:
    """(ms from rename to ring, ms from write to ring, drops never rung, (rename wall time, ms) per rung drop)."""
    lat, lat_w, unrung, samples = [], [], 0, []
    for h, tw, tr in sent:
        times = [t for t in rings.get(h, []) if t >= tw]
        if not times:
            unrung += 1
            continue
        lat.append((min(times) - tr) * 1000)
        lat_w.append((min(times) - tw) * 1000)
        samples.append((round(tr, 6), round(lat[-1], 3)))
    return lat, lat_w, unrung, samples


def latency_paired(kinds: list[str], boxes: int, drops: int, spacing_ms: float, sessions: int, seed: int) -> list[dict]:
    """The kinds at the same time, each over its own world, drops taking turns `spacing_ms / len(kinds)` apart.

    Every kind sees the machine's load of the same seconds (other work here swings the load average
    from 1 to 15 within minutes), so their difference is courier's own cost, not the hour's noise."""
    worlds = {k: World() for k in kinds}
    l0 = load()
    try:
        setups = {}
        for k, w in worlds.items():
            handles, owners, out = setup_boxes(w, boxes, sessions)
            p, ready = start_watcher(w, k, owners)
            setups[k] = (handles, out, p, ready)
        time.sleep(1.0)
        rng = random.Random(seed)
        targets = {k: rng.sample(setups[k][0], min(drops, boxes)) for k in kinds}
        sent: dict[str, list] = {k: [] for k in kinds}
        for i in range(min(drops, boxes)):
            for j in range(len(kinds)):
                k = kinds[(i + j) % len(kinds)]  # alternate who goes first
                h = targets[k][i]
                tw, tr = drop(worlds[k].mail / h, i)
                sent[k].append((h, tw, tr))
                time.sleep(rng.uniform(0.75, 1.25) * spacing_ms / len(kinds) / 1000)
        rows = []
        samples: dict[str, list] = {}
        deadline = time.monotonic() + 5.0
        for k in kinds:
            handles, out, p, ready = setups[k]
            rings = wait_rings(out, sent[k], deadline)
            cur, hwm = rss(p.pid)
            lat, lat_w, unrung, samples[k] = latencies(sent[k], rings)
            lost = len(sent[k]) - sum(queued(worlds[k].mail / h) for h, _, _ in sent[k])
            rows.append({"test": "latency", "mode": "paired", "kind": k, "watcher": ready.get("watcher"), "boxes": boxes,
                         "drops": len(sent[k]), "sessions": sessions, "spacing_ms": spacing_ms, "unrung": unrung,
                         "lost": lost, "p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99),
                         "max": max(lat, default=float("nan")), "write_p50": pct(lat_w, 50), "write_p99": pct(lat_w, 99),
                         "rss_mb": round(cur, 1), "peak_rss_mb": round(hwm, 1), "load_before": l0, "load_after": load()})
            if os.environ.get("BENCH_SAMPLES"):
                rows[-1]["samples"] = samples.get(k, [])  # (wall time of the rename, latency ms) per drop
                logf = worlds[k].root / "courier.log"
                if logf.exists():
                    rows[-1]["log_tail"] = [ln for ln in logf.read_text().splitlines()
                                            if '"poke_sent"' not in ln][-50:]
        return rows
    finally:
        for w in worlds.values():
            w.close()


# ---------------------------------------------------------------- burst


def burst_run(kind: str, boxes: int, messages: int, sessions: int, seed: int = 3) -> dict:
    """`messages` drops as fast as this process can into random boxes; every box must be rung about once."""
    w = World()
    l0 = load()
    try:
        handles, owners, out = setup_boxes(w, boxes, sessions)
        p, ready = start_watcher(w, kind, owners)
        time.sleep(0.5)
        rng = random.Random(seed)
        first: dict[str, float] = {}
        start = time.time()
        for i in range(messages):
            h = handles[rng.randrange(boxes)]
            first.setdefault(h, drop(w.mail / h, i)[1])
        dropped_at = time.time()
        deadline = time.time() + 60
        rings = {}
        while time.time() < deadline:
            rings = fleet_rings(out)
            if all(h in rings for h in first):
                break
            time.sleep(0.05)
        time.sleep(2.0)  # late second rings would show here
        rings = fleet_rings(out)
        firsts = {h: min(v) for h, v in rings.items()}
        notice = [(firsts[h] - t) * 1000 for h, t in first.items() if h in firsts]
        all_rung = max(firsts.values()) if len(firsts) >= len(first) else float("nan")
        pokes = sum(len(v) for v in rings.values())
        total = sum(queued(w.mail / h) for h in handles)
        cur, hwm = rss(p.pid)
        return {"test": "burst", "kind": kind, "watcher": ready.get("watcher"), "boxes": boxes, "messages": messages,
                "sessions": sessions, "boxes_hit": len(first), "drop_s": round(dropped_at - start, 3),
                "all_rung_s": round(all_rung - start, 3), "after_last_drop_s": round(all_rung - dropped_at, 3),
                "first_notice_p50_ms": round(pct(notice, 50), 2), "first_notice_p99_ms": round(pct(notice, 99), 2),
                "first_notice_max_ms": round(max(notice, default=float("nan")), 2),
                "pokes": pokes, "pokes_per_box": round(pokes / max(1, len(first)), 3),
                "unrung": len([h for h in first if h not in firsts]), "lost": messages - total,
                "rss_mb": round(cur, 1), "peak_rss_mb": round(hwm, 1), "load_before": l0, "load_after": load()}
    finally:
        w.close()


# ---------------------------------------------------------------- idle


def idle_run(kind: str, boxes: int, seconds: float, sessions: int = 10, rescan: str | None = None,
             sample_s: float = 10.0) -> dict:
    """Boxes with live owners and no mail; count every thread's wakeups and CPU over the window."""
    w = World()
    l0 = load()
    try:
        _, owners, _ = setup_boxes(w, boxes, sessions)
        # Boxes exist long before a daemon starts; a directory changed within the last second is not
        # "settled" for the rescan's (mtime, inode) check, and would be looked at once more.
        time.sleep(1.5)
        extra = ["--rescan-interval", rescan] if rescan else []
        p, ready = start_watcher(w, kind, owners, extra)
        time.sleep(5.0)  # past start-up: the first state write, the initial looks
        log = w.root / "courier.log"
        log_mark = len(log.read_text().splitlines()) if log.exists() else 0
        t_start, ticks0, s0 = time.monotonic(), process_ticks(p.pid), threads(p.pid)
        series = []
        prev, prev_t = s0, t_start
        end = t_start + seconds
        while True:
            now = time.monotonic()
            if now >= end:
                break
            time.sleep(min(sample_s, end - now))
            cur_s, cur_t = threads(p.pid), time.monotonic()
            d = thread_delta(prev, cur_s, cur_t - prev_t)
            series.append({"t": round(cur_t - t_start, 1), "switches": sum(r["switches"] for r in d),
                           "cpu_ms": round(sum(r["cpu_s"] for r in d) * 1000, 2)})
            prev, prev_t = cur_s, cur_t
        elapsed = time.monotonic() - t_start
        s1, ticks1 = threads(p.pid), process_ticks(p.pid)
        per_thread = thread_delta(s0, s1, elapsed)
        switches = sum(r["switches"] for r in per_thread)
        cpu = sum(r["cpu_s"] for r in per_thread)
        exited = [tid for tid in s0 if tid not in s1]
        cur, hwm = rss(p.pid)
        rescans = []
        if log.exists():
            for raw in log.read_text().splitlines()[log_mark:]:
                if '"rescan_done"' in raw:
                    rec = json.loads(raw)
                    rescans.append(rec.get("duration_ms"))
        return {"test": "idle", "kind": kind, "watcher": ready.get("watcher"), "boxes": boxes, "seconds": round(elapsed, 1),
                "rescan_interval": rescan or "default", "wakeups": switches, "wakeups_per_s": round(switches / elapsed, 4),
                "cpu_s": round(cpu, 4), "cpu_pct": round(100 * cpu / elapsed, 4),
                "process_ticks": ticks1 - ticks0, "threads": per_thread, "threads_exited": exited,
                "rescans": len(rescans), "rescan_ms": rescans, "series": series,
                "rss_mb": round(cur, 1), "peak_rss_mb": round(hwm, 1), "load_before": l0, "load_after": load()}
    finally:
        w.close()


# ---------------------------------------------------------------- memory


def rss_run(kind: str, boxes: int, sessions: int = 10) -> dict:
    """Memory with every box holding one message and rung once (the state a busy day leaves behind)."""
    w = World()
    l0 = load()
    try:
        handles, owners, out = setup_boxes(w, boxes, sessions)
        for i, h in enumerate(handles):
            drop(w.mail / h, i)
        time.sleep(1.5)
        t0 = time.monotonic()
        p, ready = start_watcher(w, kind, owners)
        ready_rss = rss(p.pid)
        deadline = time.monotonic() + 300
        rings = {}
        while time.monotonic() < deadline:
            rings = fleet_rings(out)
            if len(rings) >= boxes:
                break
            time.sleep(0.5)
        all_rung = time.monotonic() - t0
        time.sleep(5.0)  # past the 3 s "did it turn busy?" looks
        cur, hwm = rss(p.pid)
        return {"test": "rss", "kind": kind, "watcher": ready.get("watcher"), "boxes": boxes, "rung": len(rings),
                "unrung": boxes - len(rings), "all_rung_s": round(all_rung, 2), "rss_ready_mb": round(ready_rss[0], 1),
                "rss_mb": round(cur, 1), "peak_rss_mb": round(hwm, 1), "load_before": l0, "load_after": load()}
    finally:
        w.close()


# ---------------------------------------------------------------- cold start


def cold_start(boxes: int, messages: int) -> dict:
    w = World()
    try:
        for i in range(boxes):
            w.claim(f"b-{i:05d}", 4000000 + i, f"gone-{i}")  # owners gone: the scan decides, nobody to ring
        payload = json.dumps({"id": "x", "from": "f", "to": "t", "subject": "s", "body": "b", "sentAt": 1})
        per = messages // boxes
        for i in range(boxes):
            box = w.mail / f"b-{i:05d}"
            for j in range(per):
                (box / f"{1700000000000 + j}-{i % 0xFFFFFF:06x}.json").write_text(payload)
        subprocess.run(["sync"])
        log = w.root / "courier.log"
        t0 = time.monotonic()
        w.courier(log=log)
        ready, rec = w.ready_event(log)
        return {"test": "cold", "boxes": boxes, "messages": per * boxes, "ready_s": round(ready - t0, 3),
                "watcher": rec.get("watcher"), "load": load()}
    finally:
        w.close()


# ---------------------------------------------------------------- report


def machine() -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for mod in ("trio", "watchfiles", "inotify_simple", "structlog"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod.replace("_", "-"))
        except Exception:  # noqa: BLE001 - a report, not a check
            versions[mod] = "?"
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--short", "src"], capture_output=True, text=True,
                               check=False).stdout.split()[1::2]
    except OSError:
        head, dirty = "?", []
    return {"kernel": f"{platform.system()} {platform.release()}", "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), **versions, "commit": head, "src_modified": dirty}


def emit(row: dict, json_out: str | None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if json_out:
        with open(json_out, "a") as f:
            f.write(line + "\n")


def summarize_latency(rows: list[dict]) -> list[dict]:
    """Median of runs per (boxes, kind)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["boxes"], r.get("mode", "alone"), r["kind"]), []).append(r)
    out = []
    for (boxes, mode, kind), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "paired",
                                                                          list(KINDS).index(kv[0][2]))):
        out.append({"test": "latency_summary", "boxes": boxes, "mode": mode, "kind": kind, "runs": len(rs),
                    **{k: round(statistics.median(r[k] for r in rs), 3) for k in ("p50", "p95", "p99", "max", "write_p50")},
                    "p50_range": [round(min(r["p50"] for r in rs), 3), round(max(r["p50"] for r in rs), 3)],
                    "p99_range": [round(min(r["p99"] for r in rs), 3), round(max(r["p99"] for r in rs), 3)],
                    "unrung": sum(r["unrung"] for r in rs), "lost": sum(r["lost"] for r in rs),
                    "rss_mb": max(r["rss_mb"] for r in rs)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes for CI: checks correctness, timings are noise")
    ap.add_argument("--only", default="latency,burst,idle,rss,cold,hook")
    ap.add_argument("--kinds", default="wf-20/10,wf-1/1", help="latency watchers run one after another")
    ap.add_argument("--paired", default="floor,courier", help="latency watchers run at the same time ('' for none)")
    ap.add_argument("--sizes", default=None, help="latency box counts (default 1000,10000)")
    ap.add_argument("--repeat", type=int, default=3, help="latency runs per (size, kind), interleaved")
    ap.add_argument("--drops", type=int, default=1000)
    ap.add_argument("--spacing-ms", type=float, default=20.0, help="mean gap between drops (±25 %%)")
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--burst-kinds", default="courier,wf-20/10")
    ap.add_argument("--idle", default="courier:10000:600",
                    help="kind:boxes:seconds[:rescan],... (e.g. courier:10000:600,wf-20/10:10000:120)")
    ap.add_argument("--rss", default="courier:1000,courier:10000,wf-20/10:10000", help="kind:boxes,...")
    ap.add_argument("--hook-runs", type=int, default=30)
    ap.add_argument("--json-out", default=None, help="append every result line here")
    args = ap.parse_args()
    only = set(args.only.split(","))
    kinds = list(KINDS) if args.quick else [k for k in args.kinds.split(",") if k]
    q = args.quick
    bad = []
    emit({"test": "machine", **machine(), "load": load(), "argv": sys.argv[1:]}, args.json_out)

    if "latency" in only:
        sizes = [50] if q else [int(s) for s in (args.sizes or "1000,10000").split(",")]
        drops = 40 if q else args.drops
        repeat = 1 if q else args.repeat
        rows = []
        paired = [k for k in args.paired.split(",") if k] if not q else []
        for boxes in sizes:
            for rep in range(repeat):
                if paired:
                    for r in latency_paired(paired, boxes, drops, args.spacing_ms, min(args.sessions, boxes), 100 + rep):
                        r["rep"] = rep
                        rows.append(r)
                        emit(r, args.json_out)
                        if r["kind"] != "floor" and (r["unrung"] or r["lost"]):
                            bad.append(f"latency {r['kind']}: {r['unrung']} never rung, {r['lost']} lost at {boxes}")
                shift = rep % len(kinds) if kinds else 0
                order = kinds[shift:] + kinds[:shift]  # rotate: no kind always runs first
                for kind in order:
                    r = latency_run(kind, boxes, drops, args.spacing_ms, min(args.sessions, boxes), seed=100 + rep)
                    r["rep"] = rep
                    rows.append(r)
                    emit(r, args.json_out)
                    if kind != "floor" and (r["unrung"] or r["lost"]):
                        bad.append(f"latency {kind}: {r['unrung']} drops never rung, {r['lost']} lost at {boxes} boxes")
                    if kind == "courier" and r["watcher"] != "inotify" and sys.platform.startswith("linux"):
                        bad.append(f"latency: the default watcher is {r['watcher']!r}, not inotify")
        for s in summarize_latency(rows):
            emit(s, args.json_out)
    if "burst" in only:
        for kind in args.burst_kinds.split(","):
            r = burst_run(kind, 100 if q else 1000, 1000 if q else 10000, 20 if q else 100)
            emit(r, args.json_out)
            if r["unrung"] or r["lost"]:
                bad.append(f"burst {kind}: {r['unrung']} boxes unrung, {r['lost']} messages lost")
            if q:
                break
    if "idle" in only:
        specs = ["courier:100:5"] if q else args.idle.split(",")
        for spec in specs:
            parts = spec.split(":")
            r = idle_run(parts[0], int(parts[1]), float(parts[2]), rescan=parts[3] if len(parts) > 3 else None)
            emit(r, args.json_out)
    if "rss" in only:
        for spec in (["courier:100"] if q else args.rss.split(",")):
            kind, boxes = spec.split(":")
            r = rss_run(kind, int(boxes))
            emit(r, args.json_out)
            if r["unrung"]:
                bad.append(f"rss {kind}: {r['unrung']} boxes with mail never rung")
    if "cold" in only:
        emit(cold_start(100 if q else 1000, 2000 if q else 100000), args.json_out)
    if "hook" in only:
        sys.path.insert(0, str(BENCH))
        import hookcost

        r = hookcost.ratio_run(runs=3 if q else args.hook_runs, check=True)
        emit({"test": "hook", **r}, args.json_out)
        if r.get("errors"):
            bad.append(f"hook: {r['errors']}")

    for b in bad:
        print("CORRECTNESS FAILURE:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
