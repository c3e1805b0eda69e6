"""Safe file I/O for hostile same-user files: bounded reads, bounded JSON, atomic writes that follow no link.

Trust: every file courier parses (messages, owner.json, registry records, its own
state, operator turns, settings, receipts lines) may have been written by a
prompt-injected agent running as this user. Reads never follow a final symlink,
never block on a FIFO and are bounded in size; JSON is bounded in nesting depth
and in the size of its numbers, and rejects NaN/Infinity. Every way a file can be
bad ends in one exception, `Unsafe(reason)`, never in RecursionError,
OverflowError or UnicodeError. Writes go to an unpredictable O_EXCL temp file in
the target's directory and are renamed into place.
Logs: nothing; callers log the reason.
Limits: stdlib only and small: the prompt hooks import it on every prompt.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat

MAX_DEPTH = 64  # no file courier reads nests deeper than a handful of levels
MAX_NUMBER_CHARS = 24  # an int64 is 20 characters with its sign; a float literal a few more


class Unsafe(Exception):
    """A file or line courier will not use: not a plain regular file, too big, or not the JSON it should be."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def random_hex(nbytes: int) -> str:
    return os.urandom(nbytes).hex()  # `secrets` would import hashlib and random on the hook path


# ---------------------------------------------------------------- reading


def read_bounded(path: str, limit: int, *, dir_fd: int | None = None) -> bytes:
    """Read a regular file without following a final symlink and without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unsafe("symlink") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO/socket with no writer, a directory
            raise Unsafe("not_regular") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe("not_regular")
        if st.st_size > limit:
            raise Unsafe("too_large")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(65536, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise Unsafe("too_large")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise Unsafe("number_out_of_range")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise Unsafe("number_out_of_range")
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise Unsafe("number_out_of_range")
    return value


def _no_constants(name: str) -> object:
    raise Unsafe("non_finite_number")  # NaN, Infinity, -Infinity are not JSON


class WholeName:
    """A pattern a name must match whole, compiled at its first use: the prompt hook imports the modules that
    hold these on every prompt, and most prompts never check a name. (Matched whole: `re.match(r"^...$")`
    lets a trailing newline through.)"""

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._compiled = None

    def fullmatch(self, value: str):
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.pattern)
        return compiled.fullmatch(value)


_DECODER = json.JSONDecoder(parse_int=_bounded_int, parse_float=_bounded_float, parse_constant=_no_constants)
# Patterns, compiled on first use by `re`'s own cache: most files never need them (hook import time).
_STRINGS = rb'"[^"\\]*(?:\\.[^"\\]*)*"'  # unrolled: linear, no backtracking
_BRACKETS = rb"[\[\]{}]"
_SURROGATE = r"[\ud800-\udfff]"


def _too_deep(raw: bytes) -> bool:
    """True if brackets outside strings nest deeper than MAX_DEPTH. Strings are cut out at C speed
    first, so a long body full of brackets in its text costs one regex pass, not a Python loop."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for m in re.finditer(_BRACKETS, re.sub(_STRINGS, b'""', raw)):
        if m.group() in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


def loads(raw: bytes, *, allow_surrogates: bool = False) -> object:
    """Parse bounded JSON; raises Unsafe(reason) for anything that is not plain, finite, shallow JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unsafe("not_utf8") from None
    if _too_deep(raw):
        raise Unsafe("too_deep")
    try:
        value = _DECODER.decode(text)
    except Unsafe:
        raise
    except RecursionError:  # unreachable after _too_deep, kept as the backstop the issue names
        raise Unsafe("too_deep") from None
    except (ValueError, OverflowError):
        raise Unsafe("malformed_json") from None
    if not allow_surrogates and "\\u" in text and _has_surrogate(value):
        raise Unsafe("lone_surrogate")
    return value


def _has_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return bool(re.search(_SURROGATE, value))
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def loads_object(raw: bytes, *, allow_surrogates: bool = False) -> dict:
    value = loads(raw, allow_surrogates=allow_surrogates)
    if not isinstance(value, dict):
        raise Unsafe("not_an_object")
    return value


def read_json_object(path: str, limit: int, *, dir_fd: int | None = None, allow_surrogates: bool = False) -> dict:
    """Read and parse a bounded JSON object; raises Unsafe(reason), or OSError (e.g. FileNotFoundError)."""
    return loads_object(read_bounded(path, limit, dir_fd=dir_fd), allow_surrogates=allow_surrogates)


# ---------------------------------------------------------------- typed fields


def finite_number(value: object) -> float | None:
    """A JSON number as a finite float, else None. Never raises (no bare float() on input)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 2**63:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def positive_int(value: object, limit: int = 2**31) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit else None


def short_str(value: object, limit: int = 4096) -> str | None:
    return value if isinstance(value, str) and value and len(value) <= limit else None


# ---------------------------------------------------------------- writing


def write_bytes_atomic(
    path: str, payload: bytes, *, mode: int = 0o600, fsync: bool = False, dir_fd: int | None = None
) -> None:
    """Unpredictable O_EXCL temp file beside `path`, then rename: a reader never sees half a file,
    and a link planted at the temp name cannot redirect the write. With `dir_fd`, `path` is a
    name inside that directory (which the caller opened without following links)."""
    path = os.fspath(path)
    temp = os.path.join(os.path.dirname(path), f".tmp-{random_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def dumps(data: object, *, indent: int | None = 2) -> bytes:
    """JSON that round-trips: refuses NaN/Infinity rather than writing what no JSON reader accepts."""
    try:
        return (json.dumps(data, indent=indent, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except ValueError:  # NaN/Infinity; UnicodeEncodeError (a lone surrogate) is a ValueError too
        raise Unsafe("not_serialisable") from None


def write_json_atomic(
    path: str, data: object, *, fsync: bool = False, mode: int = 0o600, dir_fd: int | None = None
) -> None:
    write_bytes_atomic(path, dumps(data), mode=mode, fsync=fsync, dir_fd=dir_fd)


def open_dir_nofollow(path: str, *, dir_fd: int | None = None) -> int:
    """An fd for a directory that is not a symlink; raises OSError (ELOOP/ENOTDIR) otherwise."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
