"""The benchmark in its quick profile, for correctness only: lost or unrung mail fails; timings never do.

bench.py --quick runs every watcher kind (the raw inotify floor, courier's default backend,
courier on watchfiles at 20/10 and 1/1 ms) over 50 boxes, a 1,000-message burst, memory with
mail in 100 boxes, a cold start and the hook against the bare interpreter, and exits non-zero
only if a drop was never rung, a box was never rung, a message was lost, the default backend
on Linux is not inotify, or a hook run failed.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_bench_loses_nothing():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--quick", "--only", "latency,burst,rss,cold,hook"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert '"unrung": 0' in p.stdout and '"lost": 0' in p.stdout
