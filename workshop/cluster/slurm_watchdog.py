"""Stop a private Slurm cluster (scripts/local_slurm.sh) with all it runs, and the
watchdog that does it when the process that started the cluster dies.

A SIGKILLed kernel's ``atexit`` never runs and Slurm's daemons outlive it, so
:mod:`workshop.cluster.slurm_here` starts this file detached, with the standard
library only (not torch's hundreds of megabytes)::

    python -I workshop/cluster/slurm_watchdog.py PID START_TIME DIR STOP_SCRIPT
    python -I workshop/cluster/slurm_watchdog.py stop DIR STOP_SCRIPT   # at once

``slurmstepd`` outlives ``slurmd`` by design, so :func:`stop_cluster` cancels every
job and kills the job processes left before it stops the daemons.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if __package__:
    from .._procs import is_alive
    from .reaper import descendants
else:  # run as a file (python -I): the package would import torch; these two do not
    here = Path(__file__).resolve().parent
    # cluster/ holds reaper.py, workshop/ holds _procs.py
    sys.path += [str(here), str(here.parent)]
    from _procs import is_alive
    from reaper import descendants

_POLL_S = 0.5  # how often the watchdog looks at the kernel


def _quiet(command: list[str], env: dict[str, str], timeout: float) -> str:
    """Run a Slurm command; its stdout, or "" when it fails or does not answer."""
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _uses_folder(pid: int, folder: str) -> bool:
    """True if ``pid`` works in ``folder`` or holds a file open there."""
    base = Path(f"/proc/{pid}")
    try:
        links = [os.readlink(base / "cwd")]
        links += [os.readlink(fd) for fd in (base / "fd").iterdir()]
    except OSError:
        return False
    return any(link == folder or link.startswith(folder + "/") for link in links)


def job_processes(folder: str | os.PathLike[str]) -> list[int]:
    """The ``slurmstepd`` processes of the cluster in ``folder`` and all their
    descendants (the jobs' scripts, ``srun``, the tasks)."""
    folder = str(Path(folder).resolve())
    stepds = []
    for entry in Path("/proc").iterdir():
        try:
            name = (entry / "comm").read_text().strip() if entry.name.isdigit() else ""
        except OSError:
            continue
        if name == "slurmstepd" and _uses_folder(int(entry.name), folder):
            stepds.append(int(entry.name))
    return sorted({*stepds, *descendants(*stepds)}) if stepds else []


def stop_cluster(
    folder: str | os.PathLike[str], stop_script: str | os.PathLike[str]
) -> list[int]:
    """Cancel every job of the private cluster in ``folder`` (15 s), SIGKILL the job
    processes left 10 s later, then stop its daemons.

    Args:
        folder: the folder given to ``local_slurm.sh start``.
        stop_script: ``scripts/local_slurm.sh``.

    Returns:
        The job processes that had to be killed.
    """
    folder = Path(folder)
    env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"))
    if (folder / "run" / "slurmctld.pid").exists():
        cancel_jobs(env)
    deadline = time.monotonic() + 10
    left = job_processes(folder)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if is_alive(pid)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        subprocess.run(
            ["bash", str(stop_script), "stop-daemons", str(folder)],
            env=env,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        pass
    return left


def cancel_jobs(env: dict[str, str], users: list[str] | None = None) -> list[str]:
    """Cancel every job (of ``users``, if given) and wait up to 15 s for the queue to
    let them go; their ids."""
    queue = ["squeue", "-h", "-o", "%A", *(["-u", ",".join(users)] if users else [])]
    jobs = _quiet(queue, env, 15).split()
    if jobs:
        _quiet(["scancel", *jobs], env, 15)
    deadline = time.monotonic() + 15
    while jobs and time.monotonic() < deadline and _quiet(queue, env, 15):
        time.sleep(0.3)
    return jobs


def start_time(pid: int) -> str:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat);
    "" when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat.rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def watch_cluster(parent: int, started: str, folder: Path, stop_script: Path) -> None:
    """Wait for ``parent`` to end (or ``folder`` to go), then stop the cluster in
    ``folder`` and remove it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the kernel
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a terminal that closes
    while start_time(parent) == started and folder.exists():
        time.sleep(_POLL_S)
    if folder.exists():
        stop_cluster(folder, stop_script)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["stop"]:  # local_slurm.sh stop DIR
        stop_cluster(sys.argv[2], sys.argv[3])
    else:
        _pid, _started, _folder, _script = sys.argv[1:5]
        watch_cluster(int(_pid), _started, Path(_folder), Path(_script))
