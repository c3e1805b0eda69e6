"""A fake Claude Code session for tests: a separate process with a real socket and a real registry record.

Run as a script: python fakesession.py --socket S --registry DIR --session-id SID --out FILE
                 [--behaviour accept|never_read|close_early|no_listen|wrong_pid_record]
                 [--receipt held|dropped|denied|delivered|refused] [--reply]
It binds S (mode 0600, its dir must be 0700), writes <DIR>/<its pid>.json exactly as
Claude does (pid, sessionId, procStart from /proc, pidDomain, messagingSocketPath),
then records every line it receives, one JSON object per line, to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid


def proc_start(pid: int) -> str:
    raw = open(f"/proc/{pid}/stat").read()
    return raw[raw.rindex(")") + 2 :].split(" ")[19]


def pid_domain() -> str | None:
    try:
        return f"linux:{open('/etc/machine-id').read().strip()}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def write_record(registry: str, pid: int, session_id: str, socket_path: str, **fields) -> str:
    """Claude's registry record for a fake session, written as Claude does (a temp file, then rename).
    `fields` add to or override the defaults. Returns the record's path."""
    record = {
        "pid": pid,
        "sessionId": session_id,
        "startedAt": int(time.time() * 1000),
        "procStart": proc_start(pid),
        "version": "2.1.328",
        "peerProtocol": 1,
        "kind": "interactive",
        "messagingSocketPath": socket_path,
        "status": "idle",
    }
    record.update(fields)
    dom = pid_domain()
    if dom:
        record["pidDomain"] = dom
    path = os.path.join(registry, f"{pid}.json")
    tmp = os.path.join(registry, f".{pid}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, path)
    return path


def kill_all(pids) -> None:
    """SIGKILL these children of ours, then reap each (a fleet's or a soak host's exit)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def send_receipt(line: dict, status: str) -> None:
    addr = line.get("from")
    if not isinstance(addr, str) or not addr.startswith("uds:"):
        return
    from urllib.parse import unquote

    path = unquote(addr[4:])
    receipt = {
        "type": "control",
        "action": "peer_message_status",
        "status": status,
        "reason": f"fake {status}",
        "orig_msg_id": line.get("msg_id"),
        "msgV": 1,
        "msg_id": str(uuid.uuid4()),
    }
    if status == "refused":
        receipt["status"] = "expired"
        receipt["status_detail"] = "refused"
    if status == "dropped":
        receipt["drop_reason"] = "duplicate"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall((json.dumps(receipt) + "\n").encode())


def read_connection(conn, timeout: float = 30.0) -> list:
    """Everything one connection sends until it closes, as parsed lines (unparseable ones kept as text)."""
    data = b""
    conn.settimeout(timeout)
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    conn.close()
    lines = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            lines.append(json.loads(raw))
        except ValueError:
            lines.append({"unparsed": raw.decode("utf-8", "replace")})
    return lines


def serve(sock, out, on_line=None, timeout: float = 30.0) -> None:
    """The receive loop every fake session runs: accept, read to EOF, append {"at", "line"} per line to `out`."""
    while True:
        conn, _ = sock.accept()
        now = time.time()
        for line in read_connection(conn, timeout):
            out.write(json.dumps({"at": now, "line": line}) + "\n")
            if on_line is not None:
                on_line(line)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", help="socket path (default <--socket-dir>/<pid>.sock)")
    ap.add_argument("--socket-dir", help="directory for <pid>.sock, as Claude names it")
    ap.add_argument("--registry", required=True)
    ap.add_argument("--session-id", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--behaviour", default="accept")
    ap.add_argument("--receipt", default=None)
    ap.add_argument("--status", default="idle")
    ap.add_argument("--receipt-early", action="store_true",
                    help="send the receipt after reading the line but before closing the connection (Claude's own order)")
    ap.add_argument("--reply", action="store_true", help="also send a user line to the poke's from address")
    ap.add_argument("--pingpong", nargs=3, metavar=("MAIL_ROOT", "SELF", "PEER"),
                    help="on every line: deliver own box into read/ (as the hook would), then mail PEER")
    args = ap.parse_args()

    pid = os.getpid()
    if not args.socket:
        args.socket = os.path.join(args.socket_dir, f"{pid}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    sock.bind(args.socket)
    os.chmod(args.socket, 0o600)
    if args.behaviour != "no_listen":
        sock.listen(64)
    os.makedirs(args.registry, mode=0o700, exist_ok=True)
    write_record(args.registry, pid, args.session_id, args.socket, cwd=os.getcwd(), entrypoint="cli",
                 status=args.status)
    print("ready", flush=True)
    if args.behaviour == "no_listen":
        time.sleep(3600)
        return 0
    out = open(args.out, "a", buffering=1)
    if args.behaviour in ("close_early", "never_read"):
        held = []
        while True:
            conn, _ = sock.accept()
            if args.behaviour == "close_early":
                conn.close()
            else:
                held.append(conn)  # accept, never read, never close

    if args.receipt_early:
        while True:
            conn, _ = sock.accept()
            data = b""
            while b"\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            line = json.loads(data.split(b"\n")[0])
            out.write(json.dumps({"at": time.time(), "line": line}) + "\n")
            send_receipt(line, args.receipt)
            time.sleep(0.5)  # the receipt is in the daemon's hands before its poke sees EOF
            read_connection(conn)

    def on_line(line) -> None:
        if args.receipt:
            threading.Thread(target=send_receipt, args=(line, args.receipt), daemon=True).start()
        if args.pingpong:
            _pingpong(*args.pingpong)
        if args.reply and isinstance(line, dict) and line.get("from"):
            threading.Thread(target=_reply, args=(line,), daemon=True).start()

    serve(sock, out, on_line)


def _pingpong(root: str, me: str, peer: str) -> None:
    from pathlib import Path

    from courier import mailbox

    box = Path(root) / me
    for name in mailbox.list_box(box).queued:
        mailbox.consume(box, name)
    mailbox.drop_message(Path(root), peer, sender=me, subject="re", body="pong")


def _reply(line: dict) -> None:
    from urllib.parse import unquote

    path = unquote(line["from"][4:])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b'{"type":"user","message":{"role":"user","content":"thanks"}}\n')


if __name__ == "__main__":
    sys.exit(main())
