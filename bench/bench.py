"""courier benchmarks: latency against the floor, burst, idle cost, memory, cold start, hook cost.

    .venv/bin/python bench/bench.py [--quick] [--repeat N] [--out research/performance.md]

Every process is real: courier runs as `python -m courier run`, fake sessions are
separate processes (this driver for latency, the fork-based fleet for bursts)
listening on real Unix sockets with real registry records, and the floor is a
minimal watcher process (same watchfiles backend and timings, no courier logic)
that writes one line to a socket on each event. Everything lives in a private
temporary HOME; nothing touches ~/.claude or ~/.helm. Correctness failures (lost
or unrung mail) exit non-zero; timings never do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from courier import mailbox, registry  # noqa: E402

FLOOR = r'''
import socket, sys
from watchfiles._rust_notify import RustNotify
root, sock, debounce, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = RustNotify([root], False, False, 50, True, True)
print("ready", flush=True)
while True:
    changes = n.watch(debounce, step, 0, None)
    if isinstance(changes, set):
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.sendall(b'{"floor":1}\n')
        s.close()
'''


TIMING = [None, None]  # debounce_ms, step_ms; None = courier's defaults


def timing_args() -> list[str]:
    out = []
    if TIMING[0]:
        out += ["--debounce-ms", str(TIMING[0])]
    if TIMING[1]:
        out += ["--step-ms", str(TIMING[1])]
    return out


class World:
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
                        XDG_RUNTIME_DIR=str(self.runtime), COURIER_STATE_DIR=str(self.state), PYTHONUNBUFFERED="1")
        for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC"):
            self.env.pop(k, None)
        self.procs: list[subprocess.Popen] = []

    def claim(self, handle: str, pid: int, sid: str) -> Path:
        box = self.mail / handle
        (box / "read").mkdir(parents=True, exist_ok=True)
        (box / "owner.json").write_text(json.dumps({"handle": handle, "runtime": "claude", "pid": pid, "sessionId": sid}))
        return box

    def courier(self, *args, log: Path | None = None, env_extra=None) -> subprocess.Popen:
        env = dict(self.env, **(env_extra or {}))
        p = subprocess.Popen([sys.executable, "-m", "courier", "run", *args], env=env,
                             stdout=subprocess.DEVNULL, stderr=open(log or self.root / "courier.log", "w"))
        self.procs.append(p)
        return p

    def wait_ready(self, log: Path, timeout=120.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and '"daemon_ready"' in log.read_text():
                return time.monotonic()
            time.sleep(0.005)
        raise RuntimeError(f"courier not ready: {log.read_text()[-2000:]}")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


class Listener:
    """This process as a fake session: a real socket, a real registry record, receive times recorded."""

    def __init__(self, world: World, consume: bool):
        self.path = str(world.socks / f"{os.getpid()}.sock")
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(512)
        self.world = world
        self.consume = consume
        self.received: list[tuple[float, bytes]] = []
        self.event = threading.Event()
        rec = {"pid": os.getpid(), "sessionId": "bench-session", "procStart": registry.proc_start(os.getpid()),
               "pidDomain": registry.own_pid_domain(), "messagingSocketPath": self.path, "status": "idle"}
        (world.claude / "sessions" / f"{os.getpid()}.json").write_text(json.dumps(rec))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            first = True
            data = b""
            while True:
                chunk = c.recv(65536)
                if first and chunk:
                    t = time.perf_counter()
                    first = False
                if not chunk:
                    break
                data += chunk
            c.close()
            self.received.append((t, data))
            if self.consume and data:
                try:
                    content = json.loads(data.split(b"\n")[0])["message"]["content"]
                    box = Path(content.split("mailbox ", 1)[1].split("/ .", 1)[0])
                    for name in mailbox.list_box(box).queued:
                        mailbox.consume(box, name)
                except (ValueError, KeyError, IndexError, OSError):
                    pass
            self.event.set()

    def close(self):
        self.sock.close()


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def drop_raw(box: Path, i: int) -> float:
    """Write the message as a temp file, then time the rename into the box (what senders do)."""
    name = f"{1700000000000 + i}-{i % 0xFFFFFF:06x}.json"
    tmp = box / f".tmp-{i}"
    tmp.write_text(json.dumps({"id": name[:-5], "from": "bench", "to": box.name, "subject": "s", "body": "b", "sentAt": 1}))
    t0 = time.perf_counter()
    os.rename(tmp, box / name)
    return t0


def latency_run(boxes: int, drops: int, interval: float, floor: bool) -> dict:
    w = World()
    try:
        lis = Listener(w, consume=not floor)
        targets = []
        for i in range(boxes):
            targets.append(w.claim(f"b-{i:05d}", os.getpid(), "bench-session"))
        if floor:
            p = subprocess.Popen([sys.executable, "-c", FLOOR, str(w.mail), lis.path, str(TIMING[0]), str(TIMING[1])], env=w.env,
                                 stdout=subprocess.PIPE, text=True)
            w.procs.append(p)
            p.stdout.readline()
        else:
            log = w.root / "courier.log"
            # The cap would (rightly) hold a box rung 20 times in a row; latency is what is measured here.
            w.courier("--min-poke-interval", "0", "--wake-cap", "1000", "--log-level", "warning", *timing_args(), log=log)
            # warning level hides daemon_ready; poll the status snapshot instead
            w.env_ready = _wait_lock(w)
        time.sleep(0.3)
        lat, lost = [], 0
        rotation = targets[: min(len(targets), 50)]
        for i in range(drops):
            box = rotation[i % len(rotation)]
            lis.event.clear()
            n = len(lis.received)
            t0 = drop_raw(box, i)
            deadline = time.monotonic() + 2.0
            while len(lis.received) <= n and time.monotonic() < deadline:
                lis.event.wait(0.5)
                lis.event.clear()
            if len(lis.received) > n:
                lat.append((lis.received[n][0] - t0) * 1000)
            else:
                lost += 1
            # steady rate; also lets the consume's rename events settle before the box comes round again
            time.sleep(interval)
            if floor:
                # the floor rings on every event (including its own noise); drain extra lines
                time.sleep(0.005)
        lis.close()
        return {"boxes": boxes, "drops": drops, "unrung": lost, "p50": pct(lat, 50), "p95": pct(lat, 95),
                "p99": pct(lat, 99)}
    finally:
        w.close()


def _wait_lock(w: World, timeout=60.0):
    from courier import lockfile

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lockfile.holder(w.state):
            time.sleep(0.2)
            return True
        time.sleep(0.01)
    raise RuntimeError("courier did not start")


def start_fleet(w: World, n: int):
    out = w.root / "fleet"
    p = subprocess.Popen([sys.executable, str(REPO / "tests" / "fleet.py"), "--sessions", str(n), "--socket-dir",
                          str(w.socks), "--registry", str(w.claude / "sessions"), "--out", str(out)],
                         stdout=subprocess.PIPE, env=w.env, text=True)
    w.procs.append(p)
    info = json.loads(p.stdout.readline())
    return info["pids"], out


def fleet_rings(out: Path) -> dict[str, list[float]]:
    rings: dict[str, list[float]] = {}
    for f in out.glob("*.jsonl"):
        for raw in f.read_text().splitlines():
            rec = json.loads(raw)
            box = rec["line"]["message"]["content"].split("mailbox ", 1)[1].split("/ .", 1)[0]
            rings.setdefault(Path(box).name, []).append(rec["at"])
    return rings


def burst_run(boxes: int, messages: int, sessions: int) -> dict:
    w = World()
    try:
        pids, out = start_fleet(w, sessions)
        handles = [f"b-{i:05d}" for i in range(boxes)]
        for i, h in enumerate(handles):
            w.claim(h, pids[i % sessions], f"fleet-{i % sessions}")
        log = w.root / "courier.log"
        # The fleet shares each session among several boxes; the wake cap is per session, so lift it here.
        w.courier("--min-poke-interval", "0", "--wake-cap", "1000", log=log)
        w.wait_ready(log)
        import random

        rng = random.Random(3)
        start = time.time()
        for i in range(messages):
            h = handles[rng.randrange(boxes)]
            mailbox.drop_message(w.mail, h, sender="burst", subject=str(i), body="b")
        dropped_at = time.time()
        deadline = time.time() + 60
        rings = {}
        while time.time() < deadline:
            rings = fleet_rings(out)
            if len(rings) >= boxes:
                break
            time.sleep(0.05)
        rung_at = max(min(v) for v in rings.values()) if rings else float("nan")
        time.sleep(1.0)
        rings = fleet_rings(out)
        pokes = sum(len(v) for v in rings.values())
        queued = sum(len(mailbox.list_box(w.mail / h).queued) for h in handles)
        return {"boxes": boxes, "messages": messages, "sessions": sessions, "drop_s": dropped_at - start,
                "all_rung_s": rung_at - start, "pokes": pokes, "pokes_per_box": pokes / boxes,
                "unrung": boxes - len(rings), "lost": messages - queued}
    finally:
        w.close()


def proc_cpu(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches incl. every thread) of a process."""
    ticks = os.sysconf("SC_CLK_TCK")
    raw = open(f"/proc/{pid}/stat").read()
    fields = raw[raw.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    switches = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{task}/status"):
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                switches += int(line.split()[1])
    return cpu, switches


def rss(pid: int) -> tuple[float, float]:
    cur = hwm = 0.0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            cur = int(line.split()[1]) / 1024
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return cur, hwm


def idle_and_memory(boxes: int, seconds: float, with_mail: bool = True) -> dict:
    w = World()
    try:
        pids, out = start_fleet(w, 10)
        for i in range(boxes):
            box = w.claim(f"b-{i:05d}", pids[i % 10], f"fleet-{i % 10}")
            if with_mail:
                mailbox.drop_message(w.mail, box.name, sender="x", subject="y", body="z")
        log = w.root / "courier.log"
        p = w.courier("--min-poke-interval", "0", "--wake-cap", "1000", *timing_args(), log=log)
        w.wait_ready(log)
        # Idle means idle: wait until every box has been rung, then past the 3 s receipt checks.
        deadline = time.time() + 300
        while with_mail and time.time() < deadline and len(fleet_rings(out)) < boxes:
            time.sleep(0.5)
        time.sleep(5.0)
        cpu0, sw0 = proc_cpu(p.pid)
        time.sleep(seconds)
        cpu1, sw1 = proc_cpu(p.pid)
        cur, hwm = rss(p.pid)
        return {"boxes": boxes, "seconds": seconds, "cpu_s": cpu1 - cpu0, "cpu_pct": 100 * (cpu1 - cpu0) / seconds,
                "wakeups_per_s": (sw1 - sw0) / seconds, "rss_mb": cur, "peak_rss_mb": hwm}
    finally:
        w.close()


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
        ready = w.wait_ready(log)
        return {"boxes": boxes, "messages": per * boxes, "ready_s": ready - t0}
    finally:
        w.close()


def hook_cost(queued: int, runs: int) -> dict:
    # An installed package has its bytecode compiled (pip does it); this machine sets
    # PYTHONDONTWRITEBYTECODE, so an editable checkout would otherwise recompile every run.
    import courier

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(courier.__file__).parent)], capture_output=True)
    w = World()
    try:
        script = Path(sys.executable).parent / "courier"
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "courier"]
        env = dict(w.env, HELM_MAIL_HANDLE="hk")
        payload = json.dumps({"session_id": "hook-s", "cwd": "/x", "prompt": "hello"}).encode()
        subprocess.run([*cmd, "hook", "claim"], input=payload, env=env, check=True, capture_output=True)
        times = []
        for _ in range(runs):
            for _ in range(queued):
                mailbox.drop_message(w.mail, "hk", sender="x", subject="y", body="z")
            t = time.perf_counter()
            p = subprocess.run([*cmd, "hook", "deliver"], input=payload, env=env, capture_output=True)
            times.append((time.perf_counter() - t) * 1000)
            assert p.returncode == 0
            if queued:
                assert f"{queued} message".encode() in p.stdout
        return {"queued": queued, "runs": runs, "median_ms": statistics.median(times), "max_ms": max(times)}
    finally:
        w.close()


def machine() -> str:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"watchfiles {__import__('watchfiles').__version__}, trio {__import__('trio').__version__}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes for CI: checks correctness, timings are noise")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="write a markdown report here")
    ap.add_argument("--only", default="latency,burst,idle,cold,hook")
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--debounce-ms", type=int, default=None, help="pass to courier (and the floor)")
    ap.add_argument("--step-ms", type=int, default=None, help="pass to courier (and the floor)")
    args = ap.parse_args()
    from courier.config import Config

    TIMING[0] = args.debounce_ms
    TIMING[1] = args.step_ms
    defaults = Config(Path("/"), Path("/"), Path("/"))
    if TIMING[0] is None or TIMING[1] is None:
        # the floor must use the same timings as courier
        TIMING[0] = TIMING[0] or defaults.debounce_ms
        TIMING[1] = TIMING[1] or defaults.step_ms
    only = set(args.only.split(","))
    q = args.quick
    results: dict[str, list] = {}
    bad = []

    if "latency" in only:
        sizes = [10, 100] if q else [10, 1000, 10000]
        drops = 60 if q else 1000
        for boxes in sizes:
            for kind in ("floor", "courier"):
                runs = [latency_run(boxes, drops, 0.015, floor=(kind == "floor")) for _ in range(1 if q else args.repeat)]
                row = {"kind": kind, "boxes": boxes, "drops": drops, "runs": len(runs),
                       "p50": statistics.median(r["p50"] for r in runs), "p95": statistics.median(r["p95"] for r in runs),
                       "p99": statistics.median(r["p99"] for r in runs), "unrung": sum(r["unrung"] for r in runs)}
                results.setdefault("latency", []).append(row)
                print(json.dumps(row), flush=True)
                if kind == "courier" and row["unrung"]:
                    bad.append(f"latency: {row['unrung']} drops never rung at {boxes} boxes")
    if "burst" in only:
        r = burst_run(100 if q else 1000, 1000 if q else 10000, 20 if q else 100)
        results["burst"] = [r]
        print(json.dumps(r), flush=True)
        if r["unrung"] or r["lost"]:
            bad.append(f"burst: {r['unrung']} boxes unrung, {r['lost']} messages lost")
    if "idle" in only:
        for boxes in ([100] if q else [1000, 10000]):
            r = idle_and_memory(boxes, 5 if q else args.idle_seconds)
            results.setdefault("idle", []).append(r)
            print(json.dumps(r), flush=True)
    if "cold" in only:
        r = cold_start(100 if q else 1000, 2000 if q else 100000)
        results["cold"] = [r]
        print(json.dumps(r), flush=True)
    if "hook" in only:
        for n in (0, 1, 50):
            r = hook_cost(n, 5 if q else 15)
            results.setdefault("hook", []).append(r)
            print(json.dumps(r), flush=True)

    if args.out:
        Path(args.out).write_text(render(results, " ".join(["bench/bench.py", *sys.argv[1:]])))
    for b in bad:
        print("CORRECTNESS FAILURE:", b, file=sys.stderr)
    return 1 if bad else 0


def render(results: dict, command: str) -> str:
    lines = ["# courier performance", "", f"Machine: {machine()}.", f"Command: `.venv/bin/python {command}`.",
             f"Watcher timings: debounce {TIMING[0]} ms, step {TIMING[1]} ms (courier and floor alike).",
             f"Date: {time.strftime('%Y-%m-%d')}.", ""]
    if "latency" in results:
        lines += ["## Latency: rename into a box → line received by the fake session (ms; median of runs)", "",
                  "| boxes | who | drops/run | runs | p50 | p95 | p99 | unrung | courier p50 / floor p50 |", "|---|---|---|---|---|---|---|---|---|"]
        floor = {r["boxes"]: r for r in results["latency"] if r["kind"] == "floor"}
        for r in results["latency"]:
            ratio = f"{r['p50'] / floor[r['boxes']]['p50']:.2f}" if r["kind"] == "courier" and r["boxes"] in floor else ""
            lines.append(f"| {r['boxes']} | {r['kind']} | {r['drops']} | {r['runs']} | {r['p50']:.2f} | {r['p95']:.2f} | "
                         f"{r['p99']:.2f} | {r['unrung']} | {ratio} |")
        lines.append("")
    if "burst" in results:
        r = results["burst"][0]
        lines += ["## Burst", "", f"{r['messages']} messages dropped as fast as one process can ({r['drop_s']:.2f} s) into "
                  f"{r['boxes']} boxes owned by {r['sessions']} fake sessions: every box rung {r['all_rung_s']:.2f} s after the "
                  f"first drop; {r['pokes']} pokes ({r['pokes_per_box']:.2f} per box); {r['unrung']} boxes unrung; "
                  f"{r['lost']} messages lost.", ""]
    if "idle" in results:
        lines += ["## Idle cost and memory", "", "| boxes | window s | CPU s | CPU % of a core | context switches/s (all threads) | RSS MB | peak RSS MB |",
                  "|---|---|---|---|---|---|---|"]
        for r in results["idle"]:
            lines.append(f"| {r['boxes']} | {r['seconds']:.0f} | {r['cpu_s']:.3f} | {r['cpu_pct']:.3f} | {r['wakeups_per_s']:.1f} | "
                         f"{r['rss_mb']:.1f} | {r['peak_rss_mb']:.1f} |")
        lines.append("")
    if "cold" in results:
        r = results["cold"][0]
        lines += ["## Cold start", "", f"{r['messages']} queued messages across {r['boxes']} boxes: process start → "
                  f"`daemon_ready` in {r['ready_s']:.2f} s.", ""]
    if "hook" in results:
        lines += ["## Hook cost: `courier hook deliver` wall time (console script, fresh process each run)", "",
                  "| queued | runs | median ms | max ms |", "|---|---|---|---|"]
        for r in results["hook"]:
            lines.append(f"| {r['queued']} | {r['runs']} | {r['median_ms']:.1f} | {r['max_ms']:.1f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
