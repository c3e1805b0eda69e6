"""The SessionStart hook's cost: `courier hook claim` with an empty mail root and with 1,000 other boxes.

    .venv/bin/python bench/claim_cost.py

Superseded by bench/hookscale.py (claim and deliver at 20,000 boxes, fresh and resumed sessions, hints and
scans); kept for the small-root numbers.
"""
import json, os, subprocess, sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import courier
subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(courier.__file__).parent)], capture_output=True)
import bench
w = bench.World()
for i in range(1000):
    w.claim(f"b-{i:05d}", 4000000 + i, f"gone-{i}")
    (w.mail / f"b-{i:05d}" / "owner.json").write_text(json.dumps({"handle": f"b-{i:05d}", "runtime": "claude", "pid": os.getpid(), "sessionId": f"s-{i}", "retiredAt": 1}))
cmd = [str(Path(sys.executable).parent / "courier")]
payload = json.dumps({"session_id": "claim-s", "cwd": "/x/proj"}).encode()
for label, boxes in (("1000 boxes (retired)", None),):
    ts = []
    for _ in range(10):
        t = time.perf_counter(); p = subprocess.run([*cmd, "hook", "claim"], input=payload, env=w.env, capture_output=True); ts.append((time.perf_counter()-t)*1000)
    print(label, "claim median ms", round(statistics.median(ts),1), "max", round(max(ts),1))
w.close()
w = bench.World()
ts = []
for _ in range(10):
    t = time.perf_counter(); p = subprocess.run([*cmd, "hook", "claim"], input=payload, env=w.env, capture_output=True); ts.append((time.perf_counter()-t)*1000)
print("empty root claim median ms", round(statistics.median(ts),1), "max", round(max(ts),1))
w.close()
