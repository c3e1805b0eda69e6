"""Where courier's files live and the knobs that tune it.

Trust: reads the environment and command-line flags only; every path it returns
is built from those, never from mail content.
Logs: nothing (callers log what they decide).
Limits: the optional TOML file is read by the CLI, not here; this module only
validates values, whatever their source.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from .paths import claude_config_dir, home, mail_root, registry_dir, state_dir, suite_roots


class ConfigError(ValueError):
    """A setting that makes no sense: reported at start-up, never silently defaulted."""


@dataclass(frozen=True)
class Config:
    mail_root: Path
    claude_config_dir: Path
    state_dir: Path
    extra_mail_roots: tuple = ()  # more roots served by the same daemon (helm suites)
    # watchfiles' 1600 ms default debounce would make every doorbell late (DESIGN §7).
    # Its watch loop also wakes every step_ms while idle: latency ~1.5 x step, idle CPU
    # ~3 %/step_ms of a core (measured, research/decisions.md). 10 ms notices a drop
    # in ~15 ms for ~0.5 % idle CPU; --step-ms 50 gives 0.1 % idle for ~85 ms.
    debounce_ms: int = 20
    step_ms: int = 10
    rescan_interval_s: float = 60.0
    poke_timeout_s: float = 2.0
    # An outstanding doorbell older than this, with mail still queued, may ring once more.
    outstanding_limit_s: float = 600.0
    # Claude Code refills its per-sender bucket at one line per 2 s.
    session_min_interval_s: float = 2.0
    wake_cap: int = 3
    wake_half_life_s: float = 600.0
    watcher: str = "auto"
    log_format: str = "json"
    log_level: str = "info"
    config_file: Path | None = None

    @property
    def registry_dir(self) -> Path:
        return Path(registry_dir(self.claude_config_dir))

    @property
    def mail_roots(self) -> tuple:
        """Every root this daemon serves, the primary first, each once."""
        seen, out = set(), []
        for root in (self.mail_root, *self.extra_mail_roots):
            if root not in seen:
                seen.add(root)
                out.append(root)
        return tuple(out)

    def validated(self) -> "Config":
        def positive(name: str, value: float) -> None:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"{name} must be a number, got {_show(value)}")
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive finite number, got {_show(value)}")

        positive("rescan interval", self.rescan_interval_s)
        positive("poke timeout", self.poke_timeout_s)
        positive("outstanding limit", self.outstanding_limit_s)
        positive("wake half-life", self.wake_half_life_s)
        if not isinstance(self.session_min_interval_s, (int, float)) or not (
            math.isfinite(self.session_min_interval_s) and self.session_min_interval_s >= 0
        ):
            raise ConfigError(f"minimum poke interval must be >= 0, got {_show(self.session_min_interval_s)}")
        if isinstance(self.wake_cap, bool) or not isinstance(self.wake_cap, int) or self.wake_cap < 1:
            raise ConfigError(f"wake cap must be a whole number >= 1, got {_show(self.wake_cap)}")
        if self.wake_cap > 1000:
            raise ConfigError(f"wake cap {_show(self.wake_cap)} is no brake at all; use at most 1000")
        if self.poke_timeout_s > 25:
            # Claude Code closes a connection that sends no full line within 30 s.
            raise ConfigError("poke timeout must stay under 25 s (Claude Code's first-line deadline is 30 s)")
        for name, value in (("debounce", self.debounce_ms), ("step", self.step_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5000:
                raise ConfigError(f"{name} must be 1..5000 ms, got {_show(value)}")
        if self.watcher not in ("auto", "inotify", "watchfiles"):
            raise ConfigError(f"watcher must be auto, inotify or watchfiles, got {_show(self.watcher)}")
        if self.log_format not in ("json", "console"):
            raise ConfigError(f"log format must be json or console, got {_show(self.log_format)}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log level must be debug, info, warning or error, got {_show(self.log_level)}")
        return self

    def with_(self, **changes) -> "Config":
        return replace(self, **changes)


def _show(value: object) -> str:
    """A value quoted in an error message, cut short: a hostile config must not flood the log."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1.5h' -> seconds. Raises ConfigError on anything else."""
    raw = str(text).strip().lower()
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if raw.endswith(suffix):
            number, scale = raw[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = raw, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"not a duration: {_show(text)} (use e.g. 30s, 10m, 1.5h)") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"not a duration: {_show(text)}")
    return value


def from_env(
    env: Mapping[str, str] | None = None,
    *,
    mail_dir: str | list[str] | None = None,
    config_dir: str | None = None,
    state: str | None = None,
    **knobs,
) -> Config:
    """Paths from flags and the environment. Several mail dirs: the first is the primary root (where
    `send` writes), all are served. None given and no HELM_MAIL_DIR: the convention's root for this
    suite, plus every other suite's root found beside it (helm keeps one per suite)."""
    env = os.environ if env is None else env
    dirs = [mail_dir] if isinstance(mail_dir, str) else list(mail_dir or [])
    try:
        if dirs:
            roots = [Path(mail_root(env, d)) for d in dirs]
        else:
            primary = Path(mail_root(env))
            roots = [primary] + [Path(r) for r in suite_roots(env) if Path(r) != primary]
        cfg = Config(
            mail_root=roots[0],
            extra_mail_roots=tuple(roots[1:]),
            claude_config_dir=Path(claude_config_dir(env, config_dir)),
            state_dir=Path(state_dir(env, state)),
        )
    except RuntimeError as exc:  # no home directory to put the default paths in: say so, set HOME or a flag
        raise ConfigError(f"{exc}; set HOME, or give --mail-dir, --claude-config-dir and --state-dir") from None
    knobs = {k: v for k, v in knobs.items() if v is not None}
    return replace(cfg, **knobs).validated()


# ---------------------------------------------------------------- the config file
#
# Optional TOML, re-read on SIGHUP. Flags win over the file, the file over defaults.
# Durations take the same forms as the flags ("90s", "10m"); paths are read at start
# only (a running daemon does not move its mail root).

FILE_KNOBS = {
    "wake_cap": ("wake_cap", "int"),
    "wake_half_life": ("wake_half_life_s", "duration"),
    "rescan_interval": ("rescan_interval_s", "duration"),
    "poke_timeout": ("poke_timeout_s", "duration"),
    "outstanding_limit": ("outstanding_limit_s", "duration"),
    "min_poke_interval": ("session_min_interval_s", "duration"),
    "debounce_ms": ("debounce_ms", "int"),
    "step_ms": ("step_ms", "int"),
    "log_level": ("log_level", "str"),
    "watcher": ("watcher", "str"),
}
FILE_PATHS = {"mail_dir", "claude_config_dir", "state_dir"}


def default_config_file(env: Mapping[str, str]) -> Path:
    explicit = env.get("COURIER_CONFIG", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CONFIG_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path(home(env)) / ".config"
    return base / "courier" / "config.toml"


def load_file(path: Path) -> tuple[dict, dict]:
    """(knobs, paths) from a TOML file; ({}, {}) if it does not exist. Raises ConfigError on anything wrong."""
    import tomllib

    from . import safeio

    try:
        raw = safeio.read_bounded(path, 1 << 20)
    except FileNotFoundError:
        return {}, {}
    except safeio.Unsafe as exc:
        raise ConfigError(f"config file {path} is not a plain file courier can read ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {str(exc)[:200]}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} nests too deeply to be courier's settings") from None
    knobs, paths = {}, {}
    for key, value in data.items():
        if key in FILE_PATHS:
            if key == "mail_dir" and isinstance(value, list) and value and all(
                isinstance(v, str) and v.strip() for v in value
            ):
                paths[key] = value  # several roots, the first primary
                continue
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{path}: {key} must be a path string" + (" or a list of them" if key == "mail_dir" else ""))
            paths[key] = value
            continue
        if key not in FILE_KNOBS:
            known = ", ".join(sorted(set(FILE_KNOBS) | FILE_PATHS))
            raise ConfigError(f"{path}: unknown setting {key!r} (known: {known})")
        field_name, kind = FILE_KNOBS[key]
        if kind == "duration":
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{path}: {key} must be a duration such as \"10m\"")
            knobs[field_name] = parse_duration(str(value))
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{path}: {key} must be a whole number")
            knobs[field_name] = value
        else:
            knobs[field_name] = value
    return knobs, paths


def build(
    env: Mapping[str, str] | None = None,
    *,
    config_file: str | None = None,
    mail_dir: str | list[str] | None = None,
    config_dir: str | None = None,
    state: str | None = None,
    **flag_knobs,
) -> Config:
    """Defaults < config file < flags; paths: flag < file < environment rules.

    Every command builds its configuration here, so `send`, `status` and `doctor` look
    at the same mail root and state dir as the `run` they talk about.
    """
    env = os.environ if env is None else env
    path = Path(config_file).expanduser() if config_file else default_config_file(env)
    if config_file and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    file_knobs, file_paths = load_file(path)
    knobs = dict(file_knobs)
    knobs.update({k: v for k, v in flag_knobs.items() if v is not None})
    cfg = from_env(
        env,
        mail_dir=mail_dir or file_paths.get("mail_dir"),
        config_dir=config_dir or file_paths.get("claude_config_dir"),
        state=state or file_paths.get("state_dir"),
        **knobs,
    )
    return replace(cfg, config_file=path)
