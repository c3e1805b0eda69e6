"""`courier run`, plus a sampler thread that writes the sizes of the daemon's own tables (for bench/soak.py).

    python bench/soak_daemon.py SIZES_FILE INTERVAL_S [courier run arguments ...]

The daemon is courier's own CLI entry (`courier.cli.main(["run", ...])`), unchanged. A
daemon thread finds the one `courier.daemon.Daemon` instance (once, through `gc`) and
every INTERVAL_S appends one JSON line of `len()`s: the per-box, per-session and
per-message structures the soak must show bounded (issue #12 item 9). None of these is
observable from outside today; the soak report proposes a `stats` field for the few that
matter. The sampler only reads lengths (atomic under the GIL) and never changes anything.

Trust: benchmark-only. Reads private attributes, so a refactor may rename one: a missing
attribute is reported as null, never an error that stops the daemon.
Logs: nothing of its own; the sizes go to SIZES_FILE.
Limits: one extra thread waking every INTERVAL_S (irrelevant to a soak; do not use it to measure idle).
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time


def _len(obj, *path):
    try:
        for name in path:
            obj = getattr(obj, name)
        return len(obj)
    except Exception:  # noqa: BLE001 - a renamed attribute is a null, not a crash
        return None


def _inner_watcher(w):
    for _ in range(4):
        if w is None or hasattr(w, "_wds") or hasattr(w, "identities"):
            return w
        w = getattr(w, "inner", None) or getattr(w, "active", None)
    return w


def sizes(d) -> dict:
    disp, rec, srv, store = d.dispatcher, d.receipts, d.receipt_server, d.store
    w = _inner_watcher(getattr(d, "watcher", None))
    out = {
        "t": round(time.time(), 3),
        "blocks_allocated": sys.getallocatedblocks(),
        "threads": threading.active_count(),
        "boxes": _len(disp, "boxes"),
        "dirty": _len(disp, "dirty"),
        "timers": _len(disp, "timers"),
        "last_wake": _len(disp, "last_wake"),
        "sighted": _len(disp, "sighted"),
        "session_index": _len(disp, "sessions"),
        "skipped_logged": _len(disp, "_skipped_logged"),
        "receipts_pending": _len(rec, "pending"),
        "receipts_blocks": _len(rec, "blocks"),
        "receipts_warned_held": _len(rec, "warned_held"),
        "receipts_retried": _len(rec, "retried"),
        "listeners": _len(srv, "listeners"),
        "listener_failed_dirs": _len(srv, "failed_dirs"),
        "receipt_conns": _len(srv, "_conns"),
        "peer_line_buckets": _len(srv, "_lines"),
        "peer_log_buckets": _len(srv, "_logs"),
        "wake_levels": _len(store, "table", "levels"),
        "wake_last_ring": _len(store, "table", "last_ring"),
        "bad_turns_logged": _len(store, "_bad_turns"),
        "waiters_index": _len(d, "waiters", "index"),
        "watch_wds": _len(w, "_wds"),
        "watch_uncovered": _len(w, "_uncovered"),
        "watch_failed": _len(w, "_failed"),
    }
    try:
        out["watch_boxes"] = sum(len(r.boxes) for r in w._roots)
    except Exception:  # noqa: BLE001
        out["watch_boxes"] = None
    try:
        out["poke_tasks"] = len(disp.poke_nursery.child_tasks)  # rings and the 3 s "did it turn busy?" looks
    except Exception:  # noqa: BLE001
        out["poke_tasks"] = None
    try:
        out["receipt_tasks"] = len(srv._nursery.child_tasks)
    except Exception:  # noqa: BLE001
        out["receipt_tasks"] = None
    return out


def sampler(path: str, interval: float) -> None:
    from courier.daemon import Daemon

    daemon = None
    while daemon is None:
        time.sleep(0.5)
        daemon = next((o for o in gc.get_objects() if isinstance(o, Daemon)), None)
    with open(path, "a", buffering=1) as f:
        while True:
            try:
                f.write(json.dumps(sizes(daemon)) + "\n")
            except Exception as exc:  # noqa: BLE001 - never disturb the daemon
                f.write(json.dumps({"t": time.time(), "error": type(exc).__name__}) + "\n")
            time.sleep(interval)


def main() -> int:
    path, interval, args = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    threading.Thread(target=sampler, args=(path, interval), daemon=True, name="soak-sizes").start()
    from courier.cli import main as courier_main

    return courier_main(["run", *args])


if __name__ == "__main__":
    sys.exit(main())
