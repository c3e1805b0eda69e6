"""Rendering hostile strings for people and models: one bounded line, or an escaped literal.

Trust: every string handed here may come from a hostile file or peer (a subject, a
`from`, a file name, a peer's receipt reason). The output never contains a control,
format (bidi override) or separator character, so it cannot forge a line of a notice,
steer a terminal (ESC/OSC) or hide text.
Logs: nothing. Limits: stdlib only (the prompt hooks import it).
"""

from __future__ import annotations

import unicodedata


def _unsafe(ch: str) -> bool:
    # C*: controls, format (bidi), surrogates, private use, unassigned; Z*: line/paragraph/space separators.
    return unicodedata.category(ch)[0] in ("C", "Z") and ch != " "


def one_line(value: object, limit: int, missing: str = "") -> str:
    """Collapse to one printable line of at most `limit` characters (for fields shown to a reader).

    Unsafe characters become spaces and runs of whitespace one space; an empty result is `missing`.
    """
    if not isinstance(value, str):
        return missing
    cleaned = "".join(" " if _unsafe(ch) else ch for ch in value[: limit * 8])
    text = " ".join(cleaned.split())
    if not text:
        return missing
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(value: object, limit: int = 200) -> str:
    """An escaped literal of at most about `limit` characters (for names and log values).

    Printable characters stay as they are (so `résumé.json` reads as itself); a backslash
    and every unsafe character become escapes (\\n, \\x1b, \\u202e; an undecodable byte
    carried as a surrogate by os.fsdecode becomes \\xff).
    """
    if not isinstance(value, str):
        value = str(value)
    out: list[str] = []
    size = 0
    for ch in value:
        if ch == "\\":
            piece = "\\\\"
        elif not _unsafe(ch):
            piece = ch
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # surrogateescape: the original byte
            piece = f"\\x{ord(ch) - 0xDC00:02x}"
        elif ch == "\n":
            piece = "\\n"
        elif ch == "\t":
            piece = "\\t"
        elif ord(ch) < 0x100:
            piece = f"\\x{ord(ch):02x}"
        else:
            piece = f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"
        if size + len(piece) > limit:
            out.append("…")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def is_plain(value: str) -> bool:
    """True if `escape` would return the string unchanged (no escapes needed, any length)."""
    return "\\" not in value and not any(_unsafe(ch) for ch in value)
