"""`courier log`: render courier's JSON log (the daemon's or the hooks') for people.

Trust: log values may carry strings a peer or a file chose (escaped when logged,
escaped again here), so nothing printed can steer the terminal.
Logs: prints.
Limits: lines that are not JSON objects (journal noise) are skipped.
"""

from __future__ import annotations

import json
import sys

from .text import escape

def _value(v) -> str:
    if isinstance(v, str):
        shown = escape(v, 300)
        return json.dumps(shown, ensure_ascii=False) if (" " in shown or not shown) else shown
    return escape(json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, (dict, list)) else str(v), 300)


def render(rec: dict) -> str:
    """One log record as one line: ts, level, event, handle, then key=value; every value escaped."""
    ts = escape(str(rec.pop("ts", "")), 23)
    level = escape(str(rec.pop("level", "")), 8)
    event = escape(str(rec.pop("event", "")), 40)
    handle = rec.pop("handle", None)
    rest = " ".join(f"{escape(str(k), 40)}={_value(v)}" for k, v in rec.items() if v is not None)
    head = f"{ts} {level:<7} {event:<22}"
    return f"{head} {escape(str(handle), 80) + ' ' if handle else ''}{rest}".rstrip()


def cmd_log(args) -> int:
    stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8", errors="replace")
    handles = set(args.handle or [])
    events = set(args.event or [])
    try:
        for raw in stream:
            raw = raw.strip()
            if not raw:
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # journal noise, not ours
            if not isinstance(rec, dict):
                continue
            if handles and rec.get("handle") not in handles:
                continue
            if events and rec.get("event") not in events:
                continue
            print(render(rec))
    except BrokenPipeError:
        return 0
    finally:
        if stream is not sys.stdin:
            stream.close()
    return 0

