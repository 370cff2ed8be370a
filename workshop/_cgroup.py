"""This process's cgroup limits: CPU quota, cpuset and memory, from cgroup v2's single
tree or cgroup v1's controllers (both as Slurm's cgroup plugins and containers set
them). Private plumbing of ``allocation.py``; every function takes the mount and the
``/proc/self`` folder, so tests give it stand-in files.
"""

from __future__ import annotations

import math
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF = Path("/proc/self")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number; anything past
# an exbibyte is no limit either.
_NO_MEMORY_LIMIT = 1 << 60


def _cgroup_paths(proc_self: Path) -> dict[str, str]:
    """This process's cgroup per controller ("" for cgroup v2's single tree), from
    ``/proc/self/cgroup`` ("0::/user.slice/..." or "4:memory:/slurm/uid_1/job_7")."""
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller.removeprefix("name=")] = parts[2]
    return paths


def _levels(mount: Path, path: str) -> list[Path]:
    """This process's cgroup folder under ``mount`` and every folder above it, up to
    the mount: a limit set on the job holds for the step and task below it. Where
    the path is not under the mount (a container that sees only its own cgroup as
    the root), the mount alone."""
    here = mount / path.strip("/")
    if not here.is_dir():
        return [mount] if mount.is_dir() else []
    levels = [here]
    while levels[-1] != mount and mount in levels[-1].parents:
        levels.append(levels[-1].parent)
    return levels


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_list_size(text: str | None) -> int | None:
    """How many CPUs a cpuset list names ("0-3,8,10-11" -> 7); None if unreadable."""
    if not text:
        return None
    count = 0
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            count += (int(last) if last else int(first)) - int(first) + 1
    except ValueError:
        return None
    return count or None


def _v1_mount(root: Path, controller: str) -> Path | None:
    """The cgroup v1 hierarchy that holds ``controller`` ("cpu,cpuacct" holds cpu)."""
    try:
        for entry in root.iterdir():
            if controller in entry.name.split(",") and entry.is_dir():
                return entry
    except OSError:
        pass
    return None


def cgroup_cpus(
    root: Path = CGROUP_ROOT, proc_self: Path = PROC_SELF
) -> list[tuple[str, int]]:
    """The CPU limits of this process's cgroup: ("cgroup cpu.max", 2) for a quota of
    two CPUs' time, ("cgroup cpuset", 4) for four CPUs; empty where none is set or
    there are no cgroups. A quota rounds up: 1.5 CPUs of time keep 2 threads busy.

    Example:
        >>> cgroup_cpus(Path("/nonexistent"), Path("/nonexistent"))
        []
    """
    paths = _cgroup_paths(proc_self)
    limits: list[tuple[str, int]] = []
    quotas: list[float] = []
    if "" in paths and (root / "cgroup.controllers").is_file():  # cgroup v2
        levels = _levels(root, paths[""])
        for level in levels:
            quota, _, period = (_read(level / "cpu.max") or "max").partition(" ")
            if quota != "max" and quota.isdigit() and period.isdigit():
                quotas.append(int(quota) / int(period))
        cpuset = levels[0] / "cpuset.cpus.effective" if levels else None
        cpuset_name = "cgroup cpuset.cpus.effective"
    else:  # cgroup v1: one hierarchy per controller
        cpuset = None
        cpuset_name = "cgroup cpuset.effective_cpus"
        mount = _v1_mount(root, "cpu")
        for level in _levels(mount, paths.get("cpu", "/")) if mount else []:
            quota = _read(level / "cpu.cfs_quota_us") or "-1"
            period = _read(level / "cpu.cfs_period_us") or "0"
            if quota.isdigit() and period.isdigit() and int(period) > 0:
                quotas.append(int(quota) / int(period))
        mount = _v1_mount(root, "cpuset")
        if mount is not None:
            levels = _levels(mount, paths.get("cpuset", "/"))
            cpuset = levels[0] / "cpuset.effective_cpus" if levels else None
    if quotas:
        limits.append(("cgroup cpu.max", max(1, math.ceil(min(quotas) - 1e-9))))
    count = _cpu_list_size(_read(cpuset)) if cpuset is not None else None
    if count:
        limits.append((cpuset_name, count))
    return limits


def cgroup_memory(
    root: Path = CGROUP_ROOT, proc_self: Path = PROC_SELF
) -> tuple[int, int | None] | None:
    """(limit, in use) in bytes of this process's memory cgroup, the smallest limit
    of its folder and those above it; None where no limit is set.

    Example:
        >>> cgroup_memory(Path("/nonexistent"), Path("/nonexistent")) is None
        True
    """
    paths = _cgroup_paths(proc_self)
    if "" in paths and (root / "cgroup.controllers").is_file():
        levels = _levels(root, paths[""])
        limit_file, used_file = "memory.max", "memory.current"
    else:
        mount = _v1_mount(root, "memory")
        levels = _levels(mount, paths.get("memory", "/")) if mount else []
        limit_file, used_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
    found: list[tuple[int, int | None]] = []
    for level in levels:
        limit = _read(level / limit_file) or "max"
        if limit.isdigit() and int(limit) < _NO_MEMORY_LIMIT:
            used = _read(level / used_file) or ""
            found.append((int(limit), int(used) if used.isdigit() else None))
    # The tightest level: the least left over, counting what its cgroup already uses.
    return min(found, key=lambda f: f[0] - (f[1] or 0), default=None)
