"""Stop a private Slurm cluster (scripts/local_slurm.sh) with all it runs, and the
watchdog that does it when the process that started the cluster dies.

A notebook kernel that started a private cluster stops it at exit (``atexit``), but a
kernel can also be SIGKILLed or restarted, and Slurm's daemons detach from it: they
would outlive it. So :mod:`workshop.cluster.slurm_here` also starts this file as a
small detached process::

    python -I workshop/cluster/slurm_watchdog.py PID START_TIME DIR STOP_SCRIPT

(``python -I workshop/cluster/slurm_watchdog.py stop DIR STOP_SCRIPT`` stops a cluster
at once: ``scripts/local_slurm.sh stop DIR`` runs it.)

It polls the kernel (``PID``, with the start time from ``/proc`` so a reused PID does
not fool it) twice a second; when the kernel is gone it stops the cluster in ``DIR``
and removes ``DIR``. It imports nothing but the standard library and two files
that do the same (``workshop/_procs.py``, ``reaper.py``), so it costs a few
megabytes, not torch's hundreds.

Stopping the daemons is not enough: ``slurmstepd`` (the process that runs a job's
tasks) outlives ``slurmd`` by design. So :func:`stop_cluster` cancels every job first,
waits for their ``slurmstepd`` to end, and kills those that do not.
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
    """True if ``pid`` works in ``folder`` or holds a file open there (slurmstepd's
    working directory and log are in the cluster's folder)."""
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
    """Cancel every job of the private cluster in ``folder``, stop its daemons.

    Steps: ``scancel`` all jobs and wait up to 15 s for the queue to empty; wait up
    to 10 s more for their ``slurmstepd`` to end, then SIGKILL what is left of them;
    ``bash stop_script stop-daemons folder`` (TERM, grace, KILL for each daemon).

    Args:
        folder: the folder given to ``local_slurm.sh start``.
        stop_script: ``scripts/local_slurm.sh``.

    Returns:
        The job processes that had to be killed (empty when the jobs ended on
        their own).
    """
    folder = Path(folder)
    env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"))
    if (folder / "run" / "slurmctld.pid").exists():
        jobs = _quiet(["squeue", "-h", "-o", "%A"], env, 15).split()
        if jobs:
            _quiet(["scancel", *jobs], env, 15)
        deadline = time.monotonic() + 15
        while jobs and time.monotonic() < deadline:
            time.sleep(0.3)
            jobs = _quiet(["squeue", "-h", "-o", "%A"], env, 15).split()
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


def start_time(pid: int) -> str:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat);
    "" when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat.rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def watch_cluster(parent: int, started: str, folder: Path, stop_script: Path) -> None:
    """Wait for ``parent`` to end, then stop the cluster in ``folder`` and remove it.

    A cluster already stopped (its folder removed by the parent's own clean-up) ends
    the watch early."""
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
