"""Where courier's notice latency goes: the syscalls between the inotify event and the doorbell write, by strace.

    .venv/bin/python bench/trace_ring.py [--boxes 1000] [--drops 30] [--kind courier|floor]

Starts the same world as bench.py's latency run, attaches `strace -f -tt -T` to the
watcher process, makes `--drops` convention drops 100 ms apart into distinct boxes,
detaches, and prints, for each drop, the syscalls from the read of the inotify fd that
carried the rename up to the socket write, grouped by call, with their count. strace
slows every syscall down (ptrace stops), so the times it shows are inflated; what it
measures truly is how much work happens on the path, call by call.

Trust: benchmark-only, private world; strace is attached to our own child by pid.
Logs: nothing; prints the summary and one drop's sequence.
Limits: needs strace and ptrace permission.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

LINE = re.compile(r"^(?:\[pid\s+(\d+)\]\s+|(\d+)\s+)?(\d\d:\d\d:\d\d\.\d+)\s+(\w+)\((.*)$")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boxes", type=int, default=1000)
    ap.add_argument("--drops", type=int, default=30)
    ap.add_argument("--kind", default="courier")
    ap.add_argument("--show", type=int, default=1, help="print the full sequence of this many drops (from the middle)")
    args = ap.parse_args()
    w = bench.World()
    trace = w.root / "strace.txt"
    try:
        handles, owners, _out = bench.setup_boxes(w, args.boxes, min(50, args.boxes))
        p, _ready = bench.start_watcher(w, args.kind, owners)
        time.sleep(1.0)
        # Find the inotify fd: the one whose /proc fd link says anon_inode:inotify.
        ino_fd = None
        for fd in os.listdir(f"/proc/{p.pid}/fd"):
            try:
                if os.readlink(f"/proc/{p.pid}/fd/{fd}") == "anon_inode:inotify":
                    ino_fd = int(fd)
            except OSError:
                continue
        st = subprocess.Popen(["strace", "-f", "-tt", "-T", "-s", "80", "-o", str(trace), "-p", str(p.pid)],
                              stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        rng = random.Random(5)
        for i, h in enumerate(rng.sample(handles, args.drops)):
            bench.drop(w.mail / h, i)
            time.sleep(0.1)
        time.sleep(0.5)
        st.send_signal(signal.SIGINT)
        st.wait(10)
        calls = [m.groups() for m in map(LINE.match, trace.read_text().splitlines()) if m]
        # A path: from a read(ino_fd) that returned data up to the next sendto/write on a socket after a connect.
        paths, cur, armed = [], None, False
        for pid, pid2, _ts, name, rest in calls:
            if name == "read" and rest.startswith(f"{ino_fd},") and not rest.rstrip().endswith("EAGAIN (Resource temporarily unavailable) <0.000000>") and "= -1" not in rest:
                if cur is None:
                    cur, armed = [], False
            if cur is None:
                continue
            cur.append((name, rest[:110]))
            if name == "connect":
                armed = True
            if armed and name in ("sendto", "write", "send", "sendmsg"):
                paths.append(cur)
                cur = None
        counts = [len(x) for x in paths]
        by_call = collections.Counter()
        for x in paths:
            by_call.update(n for n, _ in x)
        print(f"kind={args.kind} boxes={args.boxes} drops={args.drops} paths found={len(paths)} inotify fd={ino_fd}")
        if counts:
            print(f"syscalls from the inotify read to the doorbell write: median {statistics.median(counts)}, "
                  f"min {min(counts)}, max {max(counts)}")
            print("per drop, by call (mean):", ", ".join(f"{n} {c / len(paths):.1f}" for n, c in by_call.most_common()))
        for x in paths[len(paths) // 2 : len(paths) // 2 + args.show]:  # a typical drop, not the first
            print("--- one drop:")
            for n, r in x:
                print(f"  {n}({r}")
    finally:
        w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
