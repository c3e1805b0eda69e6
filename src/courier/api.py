"""courier's Python API for senders that are Python programs: `courier.send(target, subject, body, sender=…)`.

The same resolution (`address.resolve_target`) and the same checks as `courier
send`: bounded fields, a retired box refused, several matches refused unless
`all=True`, and the secret backstop (refused unless `allow_secret=True`).

Trust: as `courier send`: the caller is the sender and `sender` is an unverified
claim the recipient sees labelled so. Exceptions carry handles, kinds and line
numbers, never the subject or body, so logging one cannot leak a secret.
Logs: nothing, and it never prints; every refusal is a `SendError` subclass whose
`code` is the exit status the CLI would use.
Limits: the secret scan is a backstop for accidental pastes, not a control: a
delivered message is copied into the recipient's transcript, which no cleanup
reaches. Paths are read from the environment (and courier's config file) the way
the CLI reads them unless `mail_dir` / `claude_config_dir` / `config` are given.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import sendmail
from .address import Directory
from .sendmail import Ambiguous, Invalid, NoMatch, Retired, SecretFound, SendError, Sent

__all__ = ["Ambiguous", "Invalid", "NoMatch", "Retired", "SecretFound", "SendError", "Sent", "send"]


def send(
    target: str,
    subject: str,
    body: str,
    sender: str | None = None,
    *,
    allow_secret: bool = False,
    all: bool = False,  # the CLI's --all, by the name callers will guess (shadows the builtin here only)
    create: bool = False,
    mail_dir: str | os.PathLike | None = None,
    claude_config_dir: str | os.PathLike | None = None,
    config=None,
    cwd: str | None = None,
) -> list[Sent]:
    """Send one message to what `target` names; returns one `Sent(path, id, handle, rule)` per file written.

    `target`: a handle, a path (contains "/" or starts with "." or "~"; relative to
    `cwd`, default the process's), or a session-id prefix of at least 6 characters.
    `sender` defaults to $HELM_MAIL_HANDLE, else this Claude session's own box, else $USER.
    Raises NoMatch, Ambiguous, Retired, SecretFound (with `.findings`, no text), Invalid,
    or SendError (nothing or not everything written; `.sent` lists what was).
    """
    for name, value in (("target", target), ("subject", subject), ("body", body)):
        if not isinstance(value, str):
            raise Invalid(f"{name} must be a str, not {type(value).__name__}")
    if sender is not None and not isinstance(sender, str):
        raise Invalid(f"sender must be a str, not {type(sender).__name__}")
    cfg = config if config is not None else _config(mail_dir, claude_config_dir)
    directory = Directory.from_config(cfg, cwd=cwd)
    return sendmail.send(directory, target, subject=subject, body=body, sender=sender,
                         allow_secret=bool(allow_secret), all_=bool(all), create=create)


def _config(mail_dir, claude_config_dir):
    from . import config as cfgmod

    try:
        return cfgmod.build(mail_dir=str(mail_dir) if mail_dir else None,
                            config_dir=str(claude_config_dir) if claude_config_dir else None)
    except cfgmod.ConfigError as exc:
        raise Invalid(str(exc)) from None


def mail_root(mail_dir: str | os.PathLike | None = None) -> Path:
    """The mail root a send would use (for callers that want to show it)."""
    return _config(mail_dir, None).mail_root
