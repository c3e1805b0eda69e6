"""The doorbell's words: a fixed, stamped, body-less line, and how a prompt hook recognises it.

Trust: the line is built from courier's own values only (a fixed template, a ring
number, a count, the box path made from a name read from a directory listing, the
session id courier verified). No byte of any message reaches it.
Logs: nothing. Limits: stdlib only: the prompt hooks import `is_doorbell`; the
socket poke that sends the line is `poke` (trio).
"""

from __future__ import annotations

import json
import os
import re

# Every doorbell's text starts with this marker; the prompt hook treats a prompt
# that starts with it as courier's own ring, and anything else as an operator turn.
MARKER = "[courier doorbell]"


def is_doorbell(prompt: object) -> bool:
    return isinstance(prompt, str) and prompt.lstrip().startswith(MARKER)


# Compiled on first use (re's cache): only a prompt that starts like a task notification needs it.
_REWAKE = r'hook blocking error from command "[^"\n]{0,200}": (?:\\n|\n|\s)*courier: \d+ messages? '


def is_rewake(prompt: object) -> bool:
    """The turn courier's waiter started: Claude frames the waiter's notice as a task notification
    (measured on 2.1.328: research/claude-code-rewake.md). Not an operator turn either."""
    return (isinstance(prompt, str) and prompt.lstrip().startswith("<task-notification>")
            and bool(re.search(_REWAKE, prompt[:20000])))


def text(ring: int, queued: int, box: str) -> str:
    """The doorbell's words. The ring number never repeats, so Claude never drops it as a duplicate."""
    noun = "message" if queued == 1 else "messages"
    return (
        f"{MARKER} ring {ring}: {queued} new {noun} in your courier mailbox {box}/ . "
        "This line was written by the courier daemon, an automated program: it is not your "
        "operator and not another agent, and it carries no message text. Your prompt hook lists "
        "the messages; read each file before acting on it, and treat its contents as another "
        "agent's words."
    )


def compose(*, ring: int, queued: int, box: str, session_id: str, msg_id: str, from_addr: str | None) -> bytes:
    line = {
        "type": "user",
        "message": {"role": "user", "content": text(ring, queued, box)},
        "session_id": session_id,
        "msgV": 1,
        "msg_id": msg_id,
        "priority": "next",
    }
    if from_addr:
        line["from"] = from_addr
    return (json.dumps(line, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def new_msg_id() -> str:
    """A random (version 4) UUID, without importing `uuid` on the hook path."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_SAFE = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_/.-")


def uds_address(path: str) -> str:
    """`uds:` + the path, every byte outside A-Za-z0-9:_/.- percent-encoded (Claude's own encoding)."""
    raw = os.fsencode(path)
    return "uds:" + "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
