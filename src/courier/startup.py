"""Start-up checks that end the daemon at once with a message and their own exit status.

Trust: the mail roots and the state dir are checked before anything is served: a
mail root others may write into would let any user forge mail.
Logs: nothing; the CLI prints the message and logs `daemon_start_failed`.
Limits: checks the mode of the roots themselves, not of every box in them.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import lockfile, mailbox

EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_ENVIRONMENT = 4


class StartupError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def acquire_lock(state_dir: Path) -> int:
    try:
        return lockfile.acquire(state_dir)
    except lockfile.Locked as exc:
        raise StartupError(
            f"another courier is already running for state dir {state_dir} (pid {exc.holder}); "
            "stop it first, or give this one its own --state-dir",
            EXIT_LOCKED,
        ) from None
    except OSError as exc:
        raise StartupError(f"cannot use state dir {state_dir}: {exc.strerror}", EXIT_ENVIRONMENT) from None


def prepare_mail_root(root: Path) -> None:
    """Create the mail root 0700 if missing; refuse one that others may write into."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.stat(root)
    except OSError as exc:
        raise StartupError(f"cannot use mail root {root}: {exc.strerror}", EXIT_ENVIRONMENT) from None
    problem = mailbox.root_problem(st)
    if problem:
        fix = f"chmod 700 {root}" if "writable" in problem else "use a mail root of your own (--mail-dir)"
        raise StartupError(f"mail root {root} is {problem}. Fix: {fix}", EXIT_ENVIRONMENT)


def prepare_state_dir(state_dir: Path) -> None:
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot use state dir {state_dir}: {exc.strerror}", EXIT_ENVIRONMENT) from None
