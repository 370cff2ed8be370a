"""The private portal's processes and users: local accounts for its learners, what
each of them runs, and how a process is stopped (TERM, a grace period, KILL)."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

from .._procs import is_alive


class PortalError(RuntimeError):
    """The portal could not start, or could not be stopped cleanly."""


def _make_user(name: str, home: Path) -> bool:
    """Make the local user ``name`` with its home ``home`` (mode 0700); True when it
    was made now, False when it existed (its home is moved here)."""
    try:
        old_home = Path(pwd.getpwnam(name).pw_dir)
        existed = True
        other = old_home.parent.parent
        hub = _pid(other / "run" / "hub.pid")
        live = (other / "portal.json").exists() and hub is not None and is_alive(hub)
        if other != home.parent.parent and live:
            raise PortalError(
                f"the user {name} belongs to the portal running in {other}: stop it "
                f"first (python -m workshop portal stop --folder {other}), or give "
                "this one another prefix"
            )
        subprocess.run(
            ["usermod", "-d", str(home), name], check=True, capture_output=True
        )
    except KeyError:
        existed = False
        subprocess.run(
            [
                "useradd",
                "--no-create-home",
                "--home-dir",
                str(home),
                "--shell",
                "/bin/bash",
                "--user-group",
                name,
            ],
            check=True,
            capture_output=True,
        )
    entry = pwd.getpwnam(name)
    home.mkdir(parents=True, exist_ok=True)
    # A home left by an earlier portal belonged to a user of the same name, but
    # perhaps of another uid: all of it becomes this one's.
    for folder, dirs, files in os.walk(home):
        for item in [folder] + [os.path.join(folder, n) for n in dirs + files]:
            os.lchown(item, entry.pw_uid, entry.pw_gid)
    home.chmod(0o700)  # a learner's files are theirs alone
    return not existed


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _end(pid: int | None, grace: float) -> None:
    """SIGTERM ``pid``, wait ``grace`` seconds, then SIGKILL it."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def processes_of(users: list[str]) -> list[tuple[int, str, str]]:
    """Every live process owned by one of ``users``: (pid, user, command)."""
    uids = {}
    for name in users:
        try:
            uids[pwd.getpwnam(name).pw_uid] = name
        except KeyError:
            pass
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
            if uid in uids and is_alive(int(entry.name)):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                found.append(
                    (int(entry.name), uids[uid], command.decode(errors="replace"))
                )
        except OSError:
            continue
    return found
