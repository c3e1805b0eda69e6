"""Where courier's files are: the mail root, Claude's config dir and registry, courier's state dir.

Trust: reads only the environment it is handed and flags; every path is built from
those, never from mail content.
Logs: nothing. Limits: stdlib only and tiny: the prompt hooks import it on every prompt, so paths
are plain strings (pathlib would cost the hook ~4 ms a prompt; config wraps them in Path for the daemon).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# The convention treats these suite names as "no suite" (research/helm-conformance.md §2.1).
_NO_SUITE = {"", "com.wirasm.helm", "helm"}
# <state>/by-session/<session id>: the box a session claimed last (the hooks write it, the daemon prunes it).
HINT_DIR = "by-session"


def _expand(path: str) -> str:
    """`~` and `~user` expanded, or RuntimeError as pathlib raises: os.path.expanduser returns "~/x" unchanged
    when there is no home to find, and a relative "~/x" would put mailboxes inside the session's project."""
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise RuntimeError(f"cannot expand {path.split('/', 1)[0]!r}: no such user, or no home directory")
    return expanded


def _full(path: str) -> str:
    return os.path.realpath(_expand(path))


def home(env: Mapping[str, str]) -> str:
    value = env.get("HOME", "").strip()
    return os.path.normpath(value) if value else _expand("~")


def mail_root(env: Mapping[str, str], flag: str | None = None) -> str:
    """The mail root exactly as the helm convention resolves it, unless a flag overrides."""
    if flag:
        return _full(flag)
    override = env.get("HELM_MAIL_DIR", "").strip()
    if override:
        return _full(override)
    suite = env.get("HELM_DEFAULTS_SUITE", "").strip()
    if suite not in _NO_SUITE and "/" not in suite:
        return os.path.join(home(env), ".helm", f"mail-{suite}")
    return os.path.join(home(env), ".helm", "mail")


def suite_roots(env: Mapping[str, str]) -> list[str]:
    """Every mail root of the convention beside the default one (~/.helm/mail and ~/.helm/mail-<suite>),
    as they exist now; [] when HELM_MAIL_DIR names a root of its own."""
    if env.get("HELM_MAIL_DIR", "").strip():
        return []
    parent = os.path.join(home(env), ".helm")
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    roots = []
    for name in names:
        suite = name[len("mail-"):] if name.startswith("mail-") else None
        if name != "mail" and (suite is None or suite.strip() in _NO_SUITE or suite != suite.strip()):
            continue
        path = os.path.join(parent, name)
        if os.path.isdir(path) and not os.path.islink(path):
            roots.append(path)
    return roots


def claude_config_dir(env: Mapping[str, str], flag: str | None = None) -> str:
    if flag:
        return _full(flag)
    configured = env.get("CLAUDE_CONFIG_DIR", "").strip()
    if configured:
        return _full(configured)
    return os.path.join(home(env), ".claude")


def state_dir(env: Mapping[str, str], flag: str | None = None) -> str:
    if flag:
        return _full(flag)
    configured = env.get("COURIER_STATE_DIR", "").strip()
    if configured:
        return _full(configured)
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg:
        return os.path.join(_full(xdg), "courier")
    return os.path.join(home(env), ".local", "state", "courier")


def registry_dir(config_dir: str | os.PathLike) -> str:
    return os.path.join(config_dir, "sessions")
