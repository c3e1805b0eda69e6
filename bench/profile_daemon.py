"""Where courier's CPU goes: py-spy samples of the daemon doing safety rescans, or ringing drops.

    .venv/bin/python bench/profile_daemon.py [--boxes 10000] [--interval 5s] [--seconds 30]   # rescans
    .venv/bin/python bench/profile_daemon.py --boxes 1000 --drops 1000 --interval 1h           # rings

Starts courier (default watcher) over `--boxes` claimed, empty boxes with a
`--rescan-interval`, lets it settle, then samples it with `py-spy record --nonblocking`
(reads the process's memory without stopping it) and prints the functions that hold
the samples, self and inclusive. Only active samples are kept (py-spy drops idle
ones). With `--drops`, convention drops into distinct boxes 20 ms apart are made while
sampling, so the profile is the notice path's. Not a measurement of cost itself
(bench.py --only idle/latency do that without a profiler attached).

Trust: benchmark-only, private world; py-spy reads only our own child.
Logs: nothing; prints the profile.
Limits: needs py-spy (in the venv); 1 kHz sampling, so a 50 ms rescan is ~50 samples.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boxes", type=int, default=10000)
    ap.add_argument("--interval", default="5s")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--kind", default="courier")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--drops", type=int, default=0)
    args = ap.parse_args()
    w = bench.World()
    try:
        _, owners, _ = bench.setup_boxes(w, args.boxes, 10)
        time.sleep(1.5)  # boxes settled (see bench.idle_run)
        p, _ = bench.start_watcher(w, args.kind, owners, ["--rescan-interval", args.interval])
        time.sleep(3.0)
        raw = w.root / "pyspy.txt"
        spy = Path(sys.executable).parent / "py-spy"
        cmd = [str(spy), "record", "--nonblocking", "--rate", "1000", "--format", "raw", "-d", str(args.seconds),
               "-o", str(raw), "-p", str(p.pid)]
        if args.drops:
            spy_p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            for i, h in enumerate(sorted(owners)[: args.drops]):
                bench.drop(w.mail / h, i)
                time.sleep(0.02)
            spy_p.wait(args.seconds + 60)
        else:
            subprocess.run(cmd, capture_output=True, timeout=args.seconds + 60, check=False)
        log = (w.root / "courier.log").read_text().splitlines()
        rescans = [ln for ln in log if '"rescan_done"' in ln]
        selfc: collections.Counter = collections.Counter()
        incl: collections.Counter = collections.Counter()
        total = 0
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack:
                continue
            n = int(n)
            total += n
            frames = stack.split(";")
            selfc[frames[-1]] += n
            for f in set(frames):
                incl[f] += n
        print(f"boxes={args.boxes} interval={args.interval} seconds={args.seconds} samples={total} "
              f"rescans={len(rescans)} (~{total / max(1, len(rescans)):.0f} ms of samples each at 1 kHz)")
        for ln in rescans[-3:]:
            print("  ", ln[:200])
        print("inclusive:")
        for f, n in incl.most_common(args.top):
            print(f"  {100 * n / max(1, total):5.1f}%  {f}")
        print("self:")
        for f, n in selfc.most_common(args.top):
            print(f"  {100 * n / max(1, total):5.1f}%  {f}")
    finally:
        w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
