"""Many fake Claude sessions from one command: N forked processes, each with its own socket and registry record.

python fleet.py --sessions N --socket-dir D --registry R --out DIR [--prefix fleet]
Each child is a real process (its own pid, procStart, SO_PEERCRED identity) that
listens on <D>/<pid>.sock and appends every received line to <DIR>/<pid>.jsonl as
{"at": <time>, "line": <line>}. The parent prints "ready" once every record is
written, and on SIGTERM/SIGINT kills its children (by pid) and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

from fakesession import kill_all, serve, write_record  # one fake session for every test


def child(index: int, args) -> None:
    pid = os.getpid()
    path = os.path.join(args.socket_dir, f"{pid}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(512)
    write_record(args.registry, pid, f"{args.prefix}-{index}", path)
    out = open(os.path.join(args.out, f"{pid}.jsonl"), "a", buffering=1)
    serve(sock, out, timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, required=True)
    ap.add_argument("--socket-dir", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", default="fleet")
    args = ap.parse_args()
    os.makedirs(args.registry, mode=0o700, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    kids = []
    for i in range(args.sessions):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                child(i, args)
            finally:
                os._exit(0)
        kids.append(pid)

    def stop(*_):
        kill_all(kids)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.time() + 60
    while time.time() < deadline:
        if all(os.path.exists(os.path.join(args.registry, f"{k}.json")) for k in kids):
            break
        time.sleep(0.02)
    print(json.dumps({"ready": True, "pids": kids}), flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
