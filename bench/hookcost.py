"""The prompt hook's cost against the bare interpreter, in one interleaved run, and where the time goes.

    .venv/bin/python bench/hookcost.py ratio [--runs N]       # deliver (0/1/50 queued) / `python -c pass`
    .venv/bin/python bench/hookcost.py breakdown [--runs N]   # -X importtime, site, .pth, entry points
    .venv/bin/python bench/hookcost.py venvs                  # (re)build the scratch venvs breakdown compares

Every variant is a fresh process started the same way (subprocess.run, payload on
stdin, output captured), and the variants take turns in a shuffled order each round,
so load from other work on the machine falls on all of them alike. The ratio is
median(deliver) / median(bare) from the same rounds.

Scratch venvs (under /work/scratch/bench-venv, built by `venvs`, never the project's
.venv): `regular` (pip install --no-deps . : a wheel, bytecode compiled by pip),
`editable` (pip install --no-deps -e .), and `nopth` (the wheel in a venv made
without pip/setuptools, so no distutils-precedence.pth). --no-deps is enough: the
hook imports only the standard library and courier.

Trust: benchmark-only; private HOME/CLAUDE_CONFIG_DIR/HELM_MAIL_DIR per run.
Logs: nothing; the result is JSON on stdout (and appended to --json-out).
Limits: wall time of a process includes fork/exec from this driver, equal for all variants.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import bench  # noqa: E402

VENV = REPO / ".venv"
SCRATCH = Path("/work/scratch/bench-venv")
DIRECT = "import sys; from courier.hooks import main; sys.exit(main('deliver'))"
# What a deliver hook cannot avoid: the payload and the messages are JSON (and json imports re).
STDLIB_FLOOR = "import json, os, sys, time, errno, stat, fcntl, unicodedata"


def compile_package() -> None:
    """Bytecode for the editable checkout, as an install has it (this machine sets PYTHONDONTWRITEBYTECODE)."""
    subprocess.run([str(VENV / "bin" / "python"), "-m", "compileall", "-q", str(REPO / "src" / "courier")],
                   capture_output=True)


class HookWorld:
    """A private world with box `hk` claimed by session `hook-s`; `fill(n)` queues n messages."""

    def __init__(self):
        self.w = bench.World()
        self.env = dict(self.w.env, HELM_MAIL_HANDLE="hk")
        self.payload = self.w.root / "payload.json"
        self.payload.write_text(json.dumps({"session_id": "hook-s", "cwd": "/x", "prompt": "hello"}))
        with open(self.payload) as stdin:
            p = subprocess.run([str(VENV / "bin" / "courier"), "hook", "claim"], stdin=stdin, env=self.env,
                               capture_output=True)
        if p.returncode != 0 or not (self.w.mail / "hk").is_dir():
            raise RuntimeError(f"hook claim failed: {p.stderr[-500:]!r}")

    def fill(self, n: int) -> None:
        for i in range(n):
            bench.drop(self.w.mail / "hk", i, body="z")

    def run(self, cmd: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
        with open(self.payload) as stdin:
            t = time.perf_counter()
            p = subprocess.run(cmd, stdin=stdin, env=env or self.env, capture_output=True)
            return (time.perf_counter() - t) * 1000, p

    def close(self):
        self.w.close()


def interleaved(world: HookWorld, variants: dict[str, tuple[list[str], int, dict | None]], runs: int,
                seed: int = 7) -> tuple[dict[str, list[float]], list[str]]:
    """variants: name -> (argv, messages to queue first, env override). Returns times and errors."""
    rng = random.Random(seed)
    times: dict[str, list[float]] = {k: [] for k in variants}
    errors: list[str] = []
    names = list(variants)
    for _ in range(runs):
        rng.shuffle(names)
        for name in names:
            argv, fill, env = variants[name]
            world.fill(fill)
            ms, p = world.run(argv, env)
            times[name].append(ms)
            if p.returncode != 0:
                errors.append(f"{name}: exit {p.returncode}")
            if fill and f"{fill} message".encode() not in p.stdout:
                errors.append(f"{name}: {fill} queued but not shown")
            # A notice is bounded (hooks.NOTICE_MAX_BYTES): of 50, what did not fit stays queued. Every
            # variant starts from an empty box.
            for n in os.listdir(world.w.mail / "hk"):
                if n.endswith(".json") and n != "owner.json":
                    os.unlink(world.w.mail / "hk" / n)
    return times, errors


def stats(ts: list[float]) -> dict:
    return {"median_ms": round(statistics.median(ts), 2), "min_ms": round(min(ts), 2),
            "p90_ms": round(bench.pct(ts, 90), 2), "runs": len(ts)}


def ratio_run(runs: int = 30, check: bool = True) -> dict:
    """deliver (console script) with 0/1/50 queued vs `python -c pass` from the same venv, interleaved."""
    compile_package()
    py = str(VENV / "bin" / "python")
    script = str(VENV / "bin" / "courier")
    world = HookWorld()
    l0 = bench.load()
    try:
        variants = {
            "bare": ([py, "-c", "pass"], 0, None),
            "deliver_0": ([script, "hook", "deliver"], 0, None),
            "deliver_1": ([script, "hook", "deliver"], 1, None),
            "deliver_50": ([script, "hook", "deliver"], 50, None),
        }
        times, errors = interleaved(world, variants, runs)
    finally:
        world.close()
    bare = statistics.median(times["bare"])
    out = {"load_before": l0, "load_after": bench.load(), "errors": errors[:5]}
    for k, ts in times.items():
        out[k] = stats(ts)
        out[k]["ratio"] = round(statistics.median(ts) / bare, 2)
    return out


# ---------------------------------------------------------------- breakdown


def importtime(argv: list[str], env: dict, stdin_path: Path, runs: int) -> dict[str, dict]:
    """module -> median self/cumulative µs and nesting depth, from `-X importtime` over `runs` processes."""
    acc: dict[str, dict] = {}
    for _ in range(runs):
        with open(stdin_path) as stdin:
            p = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], stdin=stdin, env=env, capture_output=True,
                               text=True)
        for line in p.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            parts = line[len("import time:"):].split("|")
            self_us, cum_us, raw = int(parts[0]), int(parts[1]), parts[2]
            depth = (len(raw) - len(raw.lstrip(" ")) - 1) // 2
            name = raw.strip()
            e = acc.setdefault(name, {"self": [], "cum": [], "depth": depth})
            e["self"].append(self_us)
            e["cum"].append(cum_us)
    return {k: {"self_us": statistics.median(v["self"]), "cum_us": statistics.median(v["cum"]), "depth": v["depth"],
                "seen": len(v["self"])} for k, v in acc.items()}


def venv_python(name: str) -> Path:
    return SCRATCH / name / "bin" / "python"


def build_venvs() -> dict:
    """regular / editable / nopth scratch venvs from the same base interpreter as the project's .venv."""
    base = None
    for line in (VENV / "pyvenv.cfg").read_text().splitlines():
        if line.startswith("executable"):
            base = line.split("=", 1)[1].strip()
    base = base or sys.executable
    SCRATCH.mkdir(parents=True, exist_ok=True)
    made = {}
    # Build from a copy that stays (the editable venv points into it): a build writes build/ and
    # *.egg-info next to pyproject.toml, and the checkout is not ours to write into.
    src = SCRATCH / "src-copy"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build",
                                                             ".pytest_cache", ".hypothesis", "artifacts", ".cache"))
    for name, how in (("regular", "wheel"), ("editable", "editable"), ("nopth", "wheel-nopip")):
        target = SCRATCH / name
        shutil.rmtree(target, ignore_errors=True)
        if how == "wheel-nopip":
            subprocess.run([base, "-m", "venv", "--without-pip", str(target)], check=True)
            cmd = [str(VENV / "bin" / "pip"), "--python", str(target / "bin" / "python"), "install", "--no-deps",
                   "-q", str(src)]
        else:
            subprocess.run([base, "-m", "venv", str(target)], check=True)
            cmd = [str(target / "bin" / "pip"), "install", "--no-deps", "-q", *(["-e"] if how == "editable" else []),
                   str(src)]
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # an install compiles bytecode, as on a user's machine
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        made[name] = {"ok": p.returncode == 0, "cmd": " ".join(cmd), "err": p.stderr[-800:]}
        made[name]["pth"] = sorted(x.name for x in (target / "lib" / "python3.11" / "site-packages").glob("*.pth"))
    return made


def breakdown(runs: int) -> dict:
    compile_package()
    copy = SCRATCH / "src-copy" / "src" / "courier"
    if copy.is_dir():  # the editable scratch venv's package: compiled too, so layouts alone differ
        subprocess.run([str(VENV / "bin" / "python"), "-m", "compileall", "-q", str(copy)], capture_output=True,
                       check=False)
    py = str(VENV / "bin" / "python")
    script = str(VENV / "bin" / "courier")
    world = HookWorld()
    out: dict = {"load_before": bench.load()}
    try:
        env = world.env
        # A copy of the package with no bytecode beside it: what an editable checkout costs on a machine that
        # sets PYTHONDONTWRITEBYTECODE (as this one does) once a source file changed after the last compile.
        nobc = Path(tempfile.mkdtemp(prefix="crb-nobc-"))
        shutil.copytree(REPO / "src" / "courier", nobc / "courier", ignore=shutil.ignore_patterns("__pycache__"))
        env_nobc = dict(env, PYTHONPATH=str(nobc), PYTHONDONTWRITEBYTECODE="1")
        variants = {
            "bare": ([py, "-c", "pass"], 0, None),
            "bare -S (no site)": ([py, "-S", "-c", "pass"], 0, None),
            "bare -I (isolated)": ([py, "-I", "-c", "pass"], 0, None),
            "bare, import site only (-S -c 'import site')": ([py, "-S", "-c", "import site"], 0, None),
            "console script `courier hook deliver`": ([script, "hook", "deliver"], 0, None),
            "`python -m courier hook deliver`": ([py, "-m", "courier", "hook", "deliver"], 0, None),
            "`python -c` from courier.hooks import main": ([py, "-c", DIRECT], 0, None),
            "`python -c 'import courier.hooks'` (imports only)": ([py, "-c", "import courier.hooks"], 0, None),
            "`python -c 'import re'` (the console-script wrapper's import)": ([py, "-c", "import re"], 0, None),
            "`python -c 'import json'` (imports re too)": ([py, "-c", "import json"], 0, None),
            "stdlib floor: json os sys time errno stat fcntl unicodedata": ([py, "-c", STDLIB_FLOOR], 0, None),
            "stdlib floor, -S": ([py, "-S", "-c", STDLIB_FLOOR], 0, None),
            "`python -c 'import pathlib'`": ([py, "-c", "import pathlib"], 0, None),
            "`python -c 'import typing'`": ([py, "-c", "import typing"], 0, None),
            "console script, courier without bytecode": ([script, "hook", "deliver"], 0, env_nobc),
        }
        for name in ("regular", "editable", "nopth"):
            vpy = venv_python(name)
            if vpy.exists():
                variants[f"[{name} venv] bare"] = ([str(vpy), "-c", "pass"], 0, None)
                variants[f"[{name} venv] console script deliver"] = ([str(vpy.parent / "courier"), "hook", "deliver"], 0,
                                                                     None)
                where = (SCRATCH / "src-copy" / "src") if name == "editable" else (vpy.parent.parent / "lib" / "python3.11"
                                                                                  / "site-packages")
                # -S skips site (and every .pth): the package's directory is put on sys.path by hand.
                variants[f"[{name} venv] -S -c from courier.hooks"] = (
                    [str(vpy), "-S", "-c", f"import sys; sys.path.append({str(where)!r}); " + DIRECT], 0, None)
        times, errors = interleaved(world, variants, runs)
        bare = statistics.median(times["bare"])
        out["times"] = {k: {**stats(v), "ratio": round(statistics.median(v) / bare, 2)} for k, v in times.items()}
        out["errors"] = errors[:5]
        # Where the time goes: imports beyond the bare interpreter's.
        it_bare = importtime([py, "-c", "pass"], env, world.payload, 9)
        it_hook = importtime([py, script, "hook", "deliver"], env, world.payload, 9)
        extra = {k: v for k, v in it_hook.items() if k not in it_bare}
        out["importtime_bare"] = {k: v for k, v in sorted(it_bare.items(), key=lambda kv: -kv[1]["self_us"])}
        out["importtime_hook_extra"] = {k: v for k, v in sorted(extra.items(), key=lambda kv: -kv[1]["self_us"])}
        out["importtime_hook_extra_total_us"] = sum(v["self_us"] for v in extra.values())
        out["importtime_bare_total_us"] = sum(v["self_us"] for v in it_bare.values())
        shutil.rmtree(nobc, ignore_errors=True)
    finally:
        world.close()
    out["load_after"] = bench.load()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ratio", "breakdown", "venvs"])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    if args.what == "venvs":
        r = build_venvs()
    elif args.what == "ratio":
        r = ratio_run(args.runs)
    else:
        r = breakdown(args.runs)
    m = bench.machine()
    r = {"test": f"hook_{args.what}", "commit": m["commit"], "src_modified": m["src_modified"], **r}
    print(json.dumps(r, indent=1))
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
