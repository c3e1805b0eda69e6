"""The benchmarks in their quick profiles, for correctness only: lost or unrung mail fails; timings never do.

bench.py --quick runs every watcher kind (the raw inotify floor, courier's default backend,
courier on watchfiles at 20/10 and 1/1 ms) over 50 boxes, a 1,000-message burst, memory with
mail in 100 boxes, a cold start and the hook against the bare interpreter, and exits non-zero
only if a drop was never rung, a box was never rung, a message was lost, the default backend
on Linux is not inotify, or a hook run failed. The soak and the hook-scale benchmark run tiny
versions of themselves: the soak must lose nothing while sessions come and go, and every hook
scenario must exit 0 and find the box it should.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_bench_loses_nothing():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--quick", "--only", "latency,burst,rss,cold,hook"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert '"unrung": 0' in p.stdout and '"lost": 0' in p.stdout


def test_tiny_soak_loses_nothing_while_sessions_come_and_go():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--messages", "20000", "--max-seconds", "4",
                        "--boxes", "40", "--sessions", "8", "--churn", "2", "--churn-every", "0.5",
                        "--sample-every", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert r["lost"] == 0 and r["duplicates"] == 0 and r["unexpected"] == 0
    assert r["verified_dropped"] == r["in_boxes"] + r["in_read"] > 0
    assert r["sessions_started"] > 8 and r["events"]["box_failed"] == 0


def test_tiny_hookscale_finds_every_box():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "hookscale.py"), "--boxes", "300", "--runs", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert not r["errors"] and not r["hook_failed"]
