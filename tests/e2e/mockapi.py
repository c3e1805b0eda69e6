"""A local mock of the Anthropic Messages API on 127.0.0.1, for driving the real Claude Code CLI offline.

POST /v1/messages answers with a streamed (SSE) or plain assistant message. Every
request body is appended to a JSONL log so a test can assert that a turn started
and what its prompt and hook context contained. A `policy` callable decides the
reply: plain text, or a Bash tool_use (used by the ping-pong scenario).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable


def text_reply(text: str) -> dict:
    return {"kind": "text", "text": text}


def bash_reply(command: str) -> dict:
    return {"kind": "tool_use", "name": "Bash", "input": {"command": command, "description": "courier reply"}}


class MockAPI:
    def __init__(self, log_path: Path, policy: Callable[[dict], dict] | None = None):
        self.log_path = log_path
        self.policy = policy or (lambda body: text_reply("ok"))
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._counter = 0
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "mock"}})

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    return self._json(200, {"input_tokens": 10})
                if not path.endswith("/v1/messages"):
                    return self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
                entry = {"at": time.time(), "path": self.path, "body": body}
                with mock.lock:
                    mock.requests.append(entry)
                    with open(mock.log_path, "a") as f:
                        f.write(json.dumps(entry) + "\n")
                    mock._counter += 1
                    n = mock._counter
                try:
                    reply = mock.policy(body)
                except Exception as exc:  # noqa: BLE001 - a broken policy must not hang the CLI
                    reply = text_reply(f"policy error {exc!r}")
                if body.get("stream"):
                    self._stream(reply, n, body)
                else:
                    self._json(200, self._message(reply, n, body))

            def _json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _message(self, reply, n, body):
                if reply["kind"] == "text":
                    content = [{"type": "text", "text": reply["text"]}]
                    stop = "end_turn"
                else:
                    content = [{"type": "tool_use", "id": f"toolu_{n:06d}", "name": reply["name"], "input": reply["input"]}]
                    stop = "tool_use"
                return {
                    "id": f"msg_{n:06d}",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "claude-mock"),
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 5},
                }

            def _stream(self, reply, n, body):
                msg = self._message(reply, n, body)
                events = []
                start = dict(msg, content=[], stop_reason=None)
                events.append(("message_start", {"type": "message_start", "message": start}))
                block = msg["content"][0]
                if block["type"] == "text":
                    events.append(("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": block["text"]}}))
                else:
                    events.append(("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
                events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
                events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None}, "usage": {"output_tokens": 5}}))
                events.append(("message_stop", {"type": "message_stop"}))
                payload = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def turns(self) -> list[dict]:
        with self.lock:
            return list(self.requests)


def last_user_text(body: dict) -> str:
    for msg in reversed(body.get("messages", [])):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return content
        texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
        return "\n".join(texts)
    return ""
