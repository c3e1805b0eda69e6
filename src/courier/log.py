"""structlog configuration: one JSON object per line for machines, console rendering for people.

Trust: log lines carry handles, pids, session ids, reasons and counts; never a
message body, subject or `from` (those are hostile and may be private). Strings a
peer controls are escaped by their callers (text.escape) before they get here.
Logs: this is the logger.
Limits: structlog's native filtering logger, not the stdlib, for speed (structlog docs/performance.md).
Loggers from `get()` are lazy proxies: a reconfiguration (SIGHUP changing the level)
reaches every component that holds one.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _head_first(_logger, _name, event_dict: dict) -> dict:
    """ts, level, event first: an operator scanning raw lines reads the verb before the context."""
    head = {k: event_dict.pop(k) for k in ("ts", "level", "event") if k in event_dict}
    head.update(event_dict)
    return head


def configure(fmt: str = "json", level: str = "info", stream: TextIO | None = None) -> None:
    stream = stream if stream is not None else sys.stderr
    renderer = (
        structlog.dev.ConsoleRenderer(colors=stream.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer(sort_keys=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.add_log_level,
            _head_first,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get(**context):
    """A lazy logger: it reads the current configuration at each call."""
    return structlog.get_logger(**context)
