"""Pokes per hour in an agent ping-pong, with and without the wake cap, for two half-lives.

    .venv/bin/python bench/pingpong.py [--out research/wakecap.md]

Two fake sessions (separate processes, real sockets, real registry records) answer
every doorbell the way a runaway agent pair would: the recipient's box is
delivered into read/ (as its prompt hook does) and a reply is dropped into the
other box at once. Time is scaled x300: one simulated hour is 12 s of wall time,
a 10 min half-life is 2 s, a 5 min half-life is 1 s, and the per-session pacing
(2 s) is 1/300 of it. The cap arithmetic is scale-free; the uncapped rate is
bounded only by how fast the fake sessions answer (a real model turn takes
seconds, so real uncapped loops are slower, but they do not stop).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import bench  # noqa: E402

SCALE = 300.0
WINDOW = 3600.0 / SCALE


def run(half_life_min: float, cap: int) -> dict:
    w = bench.World()
    try:
        fakes = []
        for me, peer, sid in (("ping-0001", "pong-0001", "sess-ping"), ("pong-0001", "ping-0001", "sess-pong")):
            p = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakesession.py"), "--socket-dir", str(w.socks),
                                  "--registry", str(w.claude / "sessions"), "--session-id", sid,
                                  "--out", str(w.root / f"{me}.jsonl"), "--pingpong", str(w.mail), me, peer],
                                 stdout=subprocess.PIPE, env=w.env, text=True)
            w.procs.append(p)
            p.stdout.readline()
            w.claim(me, p.pid, sid)
            fakes.append(p)
        log = w.root / "courier.log"
        w.courier("--wake-cap", str(cap), "--wake-half-life", f"{half_life_min * 60 / SCALE}s",
                  "--min-poke-interval", f"{2 / SCALE}s", log=log)
        w.wait_ready(log)
        bench.drop_message(w.mail, "ping-0001", sender="pong-0001", subject="start", body="go")
        time.sleep(WINDOW)
        for p in fakes:
            p.kill()
        pokes = capped = 0
        for line in log.read_text().splitlines():
            try:
                ev = json.loads(line).get("event")
            except ValueError:
                continue
            pokes += ev == "poke_sent"
            capped += ev == "wake_capped"
        queued = sum(bench.queued(w.mail / h) for h in ("ping-0001", "pong-0001"))
        return {"half_life_min": half_life_min, "cap": cap, "pokes_per_hour": pokes, "per_recipient": pokes / 2,
                "wake_capped_events": capped, "queued_at_end": queued}
    finally:
        w.close()


def predicted(half_life_min: float, cap: int) -> float:
    """Per recipient per hour: the first `cap`, then one each time the level decays from cap to cap-1."""
    return cap + 60 / (half_life_min * math.log2(cap / (cap - 1)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for half in (10.0, 5.0):
        for cap in (3, 1000):
            r = run(half, cap)
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        lines = ["# Wake cap: pokes per hour in an agent ping-pong", "",
                 f"Command: `.venv/bin/python bench/pingpong.py --out {args.out}` ({time.strftime('%Y-%m-%d')}; "
                 f"time scaled x{SCALE:.0f}, see the script's docstring).", "",
                 "| half-life | cap | pokes/hour (both) | per recipient | predicted per recipient | wake_capped events | mail queued at the end |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            pred = f"{predicted(r['half_life_min'], r['cap']):.1f}" if r["cap"] < 1000 else "unbounded"
            cap = "none (1000)" if r["cap"] >= 1000 else str(r["cap"])
            lines.append(f"| {r['half_life_min']:.0f} min | {cap} | {r['pokes_per_hour']} | {r['per_recipient']:.1f} | {pred} | "
                         f"{r['wake_capped_events']} | {r['queued_at_end']} |")
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
