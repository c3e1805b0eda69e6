"""The benchmark in its quick profile, for correctness only: lost or unrung mail fails; timings never do."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quick_bench_loses_nothing():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--quick", "--only", "latency,burst,cold,hook"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert '"unrung": 0' in p.stdout and '"lost": 0' in p.stdout
