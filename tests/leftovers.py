"""What a test run left in the machine's temporary folders (issue 47: "nothing left
behind"): the entries of /tmp, /var/tmp and /dev/shm are listed when the run starts
and again when it ends (tests/conftest.py), and the new ones this user owns are
reported, pytest's own ``pytest-of-<user>`` folders apart (pytest keeps the last few
runs' tmp_path folders there on purpose, and removes older ones itself)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

TEMP_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")
PYTEST_BASETEMP = "pytest-of-"  # pytest's basetemp root: /tmp/pytest-of-<user>


def temp_entries(folders: Iterable[str] = TEMP_FOLDERS) -> dict[str, set[str]]:
    """The names in each of ``folders``. A folder that is missing or cannot be read
    (another user's view of it, as in scripts/test_site.sh's namespaces) is left out,
    and so is never compared."""
    found = {}
    for folder in folders:
        try:
            found[folder] = set(os.listdir(folder))
        except OSError:
            continue
    return found


def left_behind(
    before: Mapping[str, set[str]],
    after: Mapping[str, set[str]],
    uid: int | None = None,
) -> list[str]:
    """Paths in ``after`` that ``before`` did not hold, owned by ``uid`` (default: this
    user), apart from pytest's basetemp folders. Another user's entry (another
    process of the machine) is not the run's; one gone by the time it is looked at
    is not left."""
    uid = os.getuid() if uid is None else uid
    left = []
    for folder in sorted(before.keys() & after.keys()):
        for name in sorted(after[folder] - before[folder]):
            if name.startswith(PYTEST_BASETEMP):
                continue
            path = os.path.join(folder, name)
            try:
                owner = os.lstat(path).st_uid
            except OSError:
                continue
            if owner == uid:
                left.append(path)
    return left


def summary(left: list[str], shown: int = 20) -> list[str]:
    """Lines for the end of the run: how many entries were left, the first
    ``shown`` of them, and how many more."""
    if not left:
        return [f"workshop: the run left nothing new in {', '.join(TEMP_FOLDERS)}"]
    lines = [f"workshop: the run left {len(left)} entries in the temporary folders:"]
    lines += [f"    {path}" for path in left[:shown]]
    if len(left) > shown:
        lines.append(f"    ... and {len(left) - shown} more")
    return lines
