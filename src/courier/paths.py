"""Where courier's files are: the mail root, Claude's config dir and registry, courier's state dir.

Trust: reads only the environment it is handed and flags; every path is built from
those, never from mail content.
Logs: nothing. Limits: stdlib only and tiny: the prompt hooks import it on every prompt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# The convention treats these suite names as "no suite" (research/helm-conformance.md §2.1).
_NO_SUITE = {"", "com.wirasm.helm", "helm"}


def home(env: Mapping[str, str]) -> Path:
    value = env.get("HOME", "").strip()
    return Path(value) if value else Path.home()


def mail_root(env: Mapping[str, str], flag: str | None = None) -> Path:
    """The mail root exactly as the helm convention resolves it, unless a flag overrides."""
    if flag:
        return Path(flag).expanduser().resolve()
    override = env.get("HELM_MAIL_DIR", "").strip()
    if override:
        return Path(override).expanduser().resolve()
    suite = env.get("HELM_DEFAULTS_SUITE", "").strip()
    if suite not in _NO_SUITE and "/" not in suite:
        return home(env) / ".helm" / f"mail-{suite}"
    return home(env) / ".helm" / "mail"


def suite_roots(env: Mapping[str, str]) -> list[Path]:
    """Every mail root of the convention beside the default one (~/.helm/mail and ~/.helm/mail-<suite>),
    as they exist now; [] when HELM_MAIL_DIR names a root of its own."""
    if env.get("HELM_MAIL_DIR", "").strip():
        return []
    parent = home(env) / ".helm"
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    roots = []
    for name in names:
        suite = name[len("mail-"):] if name.startswith("mail-") else None
        if name != "mail" and (suite is None or suite.strip() in _NO_SUITE or suite != suite.strip()):
            continue
        path = parent / name
        if path.is_dir() and not path.is_symlink():
            roots.append(path)
    return roots


def claude_config_dir(env: Mapping[str, str], flag: str | None = None) -> Path:
    if flag:
        return Path(flag).expanduser().resolve()
    configured = env.get("CLAUDE_CONFIG_DIR", "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return home(env) / ".claude"


def state_dir(env: Mapping[str, str], flag: str | None = None) -> Path:
    if flag:
        return Path(flag).expanduser().resolve()
    configured = env.get("COURIER_STATE_DIR", "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg:
        return Path(xdg).expanduser().resolve() / "courier"
    return home(env) / ".local" / "state" / "courier"


def registry_dir(config_dir: Path) -> Path:
    return config_dir / "sessions"
