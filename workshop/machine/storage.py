"""Your storage on a site: what a scratch purge would delete, and your quotas
(notebook 05, section 1). :func:`purge_dry_run` lists, as a site's purge tool's dry
run does, the files older than a number of days without deleting anything."""

from __future__ import annotations

import getpass
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..checks import positive_number, whole
from .monitor_probes import run_listed

__all__ = [
    "QUOTA_COMMANDS",
    "PurgeCandidate",
    "purge_dry_run",
    "quota_commands",
    "write_aged_files",
]

DAY = 86_400.0  # seconds
_CLOCKS = ("mtime", "atime")


@dataclass(frozen=True)
class PurgeCandidate:
    """A file that a purge would delete: its ``path`` relative to the folder
    searched, ``age_days`` at ``now``, and ``size`` in bytes."""

    path: Path
    age_days: float
    size: int


def _check_days(days: float, what: str) -> None:
    if isinstance(days, bool) or not isinstance(days, (int, float)):
        raise ValueError(f"{what} must be a number of days, got {days!r}")
    if not (days >= 0 and math.isfinite(days)):
        raise ValueError(f"{what} must be 0 or more days, got {days!r}")


def write_aged_files(
    folder: str | os.PathLike,
    ages_days: Mapping[str, float],
    size: int = 1024,
    now: float | None = None,
) -> list[Path]:
    """Write files dated ``ages_days`` days back (modification and access, as
    ``touch -d``): a scratch folder to purge.

    Args:
        folder: where to write them (made if missing).
        ages_days: file name (relative, may hold folders) -> its age in days.
        size: bytes of each file.
        now: the present, seconds since the epoch (default: the clock).

    Returns:
        The files written, in the order given.

    Raises:
        ValueError: a negative or non-numeric age or size, a ``folder`` that is a
            file, or a name that is absolute or climbs out of ``folder`` with "..".

    Example:
        >>> write_aged_files(tmp, {"old.log": 90, "new.log": 1})  # doctest: +SKIP
    """
    whole("size", size, least=0)
    now = time.time() if now is None else now
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise ValueError(
            f"folder={str(root)!r} is a file, not a folder; give a folder to write "
            "the files in (made if missing), e.g. a new one under $TMPDIR"
        )
    written = []
    for name, age in ages_days.items():
        _check_days(age, f"the age of {name!r}")
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(
                f"file name {name!r} must stay inside {root}: give a relative name "
                "without '..'"
            )
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * size)
        stamp = now - age * DAY
        os.utime(path, (stamp, stamp))
        written.append(path)
    return written


def purge_dry_run(
    folder: str | os.PathLike,
    days: float = 60,
    now: float | None = None,
    clock: str = "mtime",
) -> list[PurgeCandidate]:
    """The files under ``folder`` whose last modification (``clock="mtime"``) or
    access (``"atime"``, often updated lazily) is more than ``days`` old; nothing is
    deleted, and symbolic links are not followed.

    Args:
        days: the purge's age limit (Graham's scratch: 60).
        now: the present, seconds since the epoch (default: the clock).

    Returns:
        A :class:`PurgeCandidate` per file, oldest first.

    Raises:
        ValueError: ``days`` negative or not a number, an unknown ``clock``, or a
            ``folder`` that is not a directory.

    Example:
        >>> [c.path.name for c in purge_dry_run(tmp, days=60)]  # doctest: +SKIP
        ['old.log']
    """
    _check_days(days, "days")
    if clock not in _CLOCKS:
        raise ValueError(f"clock={clock!r}: pass one of {', '.join(_CLOCKS)}")
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder; pass the folder a purge would scan")
    now = time.time() if now is None else now
    found = []
    for path in root.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        info = path.stat()
        stamp = info.st_mtime if clock == "mtime" else info.st_atime
        age = (now - stamp) / DAY
        if age > days:
            found.append(PurgeCandidate(path.relative_to(root), age, info.st_size))
    return sorted(found, key=lambda c: (-c.age_days, str(c.path)))


#: Commands that report your quotas at many sites: what each one is.
QUOTA_COMMANDS = [
    ("diskusage_report", "the Alliance (Compute Canada) sites' summary"),
    ("quota -s", "quotas of the file systems that keep them (home, often NFS)"),
    ("lfs quota -h -u {user} {scratch}", "your Lustre quota on scratch"),
    ("df -h {home}", "the size and use of the file system holding home"),
]


def quota_commands(lines: int = 8, timeout_s: float = 10.0) -> list[tuple[str, bool]]:
    """Run the quota commands this machine has and print the first lines of each;
    "not on this machine" for the others; ``{scratch}`` is ``$SCRATCH`` or
    ``/scratch``.

    Args:
        lines: lines of each command's output to print.
        timeout_s: seconds each command may take (a busy Lustre answers slowly).

    Returns:
        (command, whether it ran and succeeded) for each of :data:`QUOTA_COMMANDS`.

    Raises:
        ValueError: ``lines`` below 1 or ``timeout_s`` not positive.

    Example:
        >>> ran = quota_commands(lines=3)  # doctest: +SKIP
    """
    whole("lines", lines)
    positive_number("timeout_s", timeout_s, what="a number of seconds")
    values = {
        "user": getpass.getuser(),
        "scratch": os.environ.get("SCRATCH", "/scratch"),
        "home": str(Path.home()),
    }
    results = []
    for template, _ in QUOTA_COMMANDS:
        command = template.format(**values)
        shown = template.format(user="$USER", scratch="$SCRATCH", home="$HOME")
        results.append((command, run_listed(command, shown, lines, timeout_s)))
    return results
