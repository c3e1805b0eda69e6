"""The user service: a systemd unit (Linux) or a launchd agent (macOS) that runs `courier run`.

Trust: writes only the user's own unit directory; the unit carries the absolute
path of this courier. One source for each file: the templates in courier/data;
the copies under systemd/ and launchd/ are rendered from them (a test keeps them equal).
Logs: prints for people.
Limits: drives systemctl/launchctl when a user manager answers; otherwise prints the commands.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .settings import courier_command

LAUNCHD_LABEL = "dev.courier.daemon"
SYSTEMD_UNIT = "courier.service"


def systemd_unit(cmd: list[str]) -> str:
    template = (Path(__file__).parent / "data" / "courier.service").read_text()
    return template.replace("@COURIER@", " ".join(shlex.quote(c) for c in cmd))


def launchd_plist(cmd: list[str], home: Path) -> bytes:
    template = (Path(__file__).parent / "data" / f"{LAUNCHD_LABEL}.plist").read_bytes()
    data = plistlib.loads(template)
    data["ProgramArguments"] = cmd + ["run"]
    logs = home / "Library" / "Logs" / "courier"
    data["StandardErrorPath"] = str(logs / "courier.log")
    data["StandardOutPath"] = str(logs / "courier.out")
    return plistlib.dumps(data)


def cmd_service(args) -> int:
    cmd = courier_command()
    home = Path.home()
    if sys.platform == "darwin":
        target = home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        content = launchd_plist(cmd, home)
        uid = os.getuid()
        up = [["launchctl", "bootstrap", f"gui/{uid}", str(target)]]
        down = [["launchctl", "bootout", f"gui/{uid}/{LAUNCHD_LABEL}"]]
        show = [["launchctl", "print", f"gui/{uid}/{LAUNCHD_LABEL}"]]
        tool = "launchctl"
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
        target = Path(xdg) / "systemd" / "user" / SYSTEMD_UNIT
        content = systemd_unit(cmd).encode()
        up = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]]
        down = [["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]]
        show = [["systemctl", "--user", "status", SYSTEMD_UNIT]]
        tool = "systemctl"
    if args.action == "print":
        sys.stdout.write(content.decode())
        return 0
    steps = {"install": up, "uninstall": down, "status": show}[args.action]
    if args.action == "install":
        if args.dry_run:
            print(f"# would write {target}")
        elif not (target.exists() and target.read_bytes() == content):
            os.makedirs(target.parent, exist_ok=True)
            target.write_bytes(content)
            print(f"courier: wrote {target}")
        else:
            print(f"courier: {target} is up to date")
    available = shutil.which(tool) is not None and (tool != "systemctl" or _user_manager_up())
    if args.dry_run or not available:
        if not args.dry_run:
            print(f"courier: {tool} is not available here (no user service manager); run these yourself:")
        for step in steps:
            print("  " + " ".join(shlex.quote(s) for s in step))
        if args.action == "uninstall" and not args.dry_run:
            print(f"  rm {shlex.quote(str(target))}")
        return 0 if args.dry_run else 1
    rc = 0
    for step in steps:
        proc = subprocess.run(step)
        rc = rc or proc.returncode
        if proc.returncode and args.action != "status":
            print(f"courier: `{' '.join(step)}` failed ({proc.returncode})", file=sys.stderr)
            return proc.returncode
    if args.action == "uninstall":
        try:
            target.unlink()
            print(f"courier: removed {target}")
        except FileNotFoundError:
            pass
    return rc


def _user_manager_up() -> bool:
    try:
        proc = subprocess.run(
            ["systemctl", "--user", "is-system-running"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.stdout.strip() not in ("", "offline") and "Failed to connect" not in proc.stderr

