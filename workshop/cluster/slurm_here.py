"""Is there a Slurm here to submit to? A real cluster, a private one started here, or
none.

:func:`slurm_cluster` answers with a :class:`SlurmCluster`; where no controller
answers, it may start a private two-node cluster here (``scripts/local_slurm.sh``),
stopped at exit or by a watchdog (:mod:`workshop.cluster.slurm_watchdog`).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .._house import ROOT
from . import slurm_watchdog

# The script that starts and stops a private Slurm cluster (this module, the portal).
LOCAL_SLURM = ROOT / "scripts" / "local_slurm.sh"
_DAEMONS = ("slurmctld", "slurmd", "munged")
_NO_SBATCH = (
    "sbatch not found: on a cluster, run this notebook on a login node or inside an "
    "allocation (some sites need `module load slurm` first); on your own "
    "Debian/Ubuntu machine, run `make setup` as root to install slurm-wlm"
)
_PRIVATE: SlurmCluster | None = None  # the private cluster this process started


@dataclass
class SlurmCluster:
    """Where Slurm jobs can be submitted from this process, if anywhere.

    Attributes:
        available: True when :func:`workshop.cluster.slurm.submit` can submit.
        kind: "cluster" (a controller answered), "private" (started by this
            process) or "none".
        reason: why jobs can or cannot be submitted, in a sentence.
        partitions: partition names, the default one first.
        hosts: node names.
        cpus: CPUs of all nodes together.
        gpus: GPUs of all nodes together (from each node's GRES).
        gpus_per_node: the fewest GPUs of a node with GPUs (0 without any): what
            ``--gpus-per-node`` can ask of every node.
        folder: a private cluster's configuration, state and logs.
    """

    available: bool
    kind: str
    reason: str
    partitions: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    cpus: int = 0
    gpus: int = 0
    gpus_per_node: int = 0
    folder: Path | None = None
    _watchdog: subprocess.Popen | None = field(default=None, repr=False)
    _previous_conf: str | None = field(default=None, repr=False)

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return len(self.hosts)

    def describe(self) -> str:
        """What this is, its nodes, CPUs and GPUs, or why there is none."""
        if not self.available:
            return f"no Slurm to submit to: {self.reason}"
        gpus = _count(self.gpus, "GPU") if self.gpus else "no GPUs"
        if self.kind == "private":
            # Every node of a private cluster offers all of this machine's CPUs.
            each = self.cpus // max(self.nodes, 1)
            return (
                "private Slurm cluster for this notebook, stopped when the kernel "
                f"ends:\n{_count(self.nodes, 'node')} on this machine "
                f"({', '.join(self.hosts)}), {_count(each, 'CPU')} each"
                f"{', shared' if self.nodes > 1 else ''}, {gpus}"
            )
        size = f"{_count(self.nodes, 'node')}, {_count(self.cpus, 'CPU')}, {gpus}"
        parts = ", ".join(self.partitions) or "none"
        return f"Slurm cluster ({self.reason}): partitions {parts}; {size}"

    __str__ = describe

    def stop(self) -> None:
        """Stop a private cluster (jobs, daemons, watchdog), restore ``SLURM_CONF``
        and remove its folder; nothing for a real cluster, or the second time.

        Example:
            >>> slurm_cluster().stop()                  # doctest: +SKIP
        """
        global _PRIVATE
        if self.kind != "private" or self.folder is None or not self.available:
            return
        self.available = False
        self.reason = "stopped; call slurm_cluster() to start another"
        atexit.unregister(self.stop)
        slurm_watchdog.stop_cluster(self.folder, LOCAL_SLURM)
        if self._watchdog is not None:
            _end(self._watchdog)
        if os.environ.get("SLURM_CONF") == str(self.folder / "slurm.conf"):
            if self._previous_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._previous_conf
        shutil.rmtree(self.folder, ignore_errors=True)
        if _PRIVATE is self:
            _PRIVATE = None


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _end(popen: subprocess.Popen, grace: float = 5.0) -> None:
    """TERM, a grace period, then KILL; always reaped."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(grace)


def _parse_sinfo(text: str) -> tuple[list[str], list[str], int, int, int]:
    """Partitions, hosts, CPUs, GPUs and the fewest GPUs of a node with GPUs, from
    ``sinfo -h -N -o "%N|%P|%c|%G"`` (each node counted once)."""
    partitions: list[str] = []
    nodes: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        host, partition, cpus, gres = parts
        name = partition.rstrip("*")
        if name and name not in partitions:
            partitions.append(name)
        if partition.endswith("*"):  # Slurm's mark of the default partition
            partitions.insert(0, partitions.pop(partitions.index(name)))
        gpus = sum(
            int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres)
        )
        nodes[host] = (int(cpus) if cpus.isdigit() else 0, gpus)
    cpus = sum(c for c, _ in nodes.values())
    gpus = [g for _, g in nodes.values()]
    fewest = min((g for g in gpus if g), default=0)
    return partitions, list(nodes), cpus, sum(gpus), fewest


def _query(command: list[str], timeout: float = 20) -> tuple[bool, str]:
    """(succeeded, its stdout, or the last line of what it said when it failed)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return False, f"{command[0]} not found"
    except subprocess.TimeoutExpired:
        return False, f"`{' '.join(command)}` did not answer in {timeout:g} s"
    if done.returncode == 0:
        return True, done.stdout
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return False, said[-1] if said else f"exit code {done.returncode}"


def _with_sinfo(cluster: SlurmCluster) -> SlurmCluster:
    ok, text = _query(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%G"])
    if ok:
        (
            cluster.partitions,
            cluster.hosts,
            cluster.cpus,
            cluster.gpus,
            cluster.gpus_per_node,
        ) = _parse_sinfo(text)
    return cluster


def _unique_job_ids(conf: Path) -> None:
    """Number a new private cluster's jobs from the clock, not 1, so its output
    files (runs/NAME-ID.out) do not meet an earlier cluster's. Best effort."""
    first = 1000 + int(time.time() * 10) % 60_000_000  # below Slurm's MaxJobId
    with open(conf, "a") as f:
        f.write(f"FirstJobId={first}\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        subprocess.run(
            ["scontrol", "reconfigure"], env=env, capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        pass


def _start_private() -> SlurmCluster:
    """Start a private two-node cluster in a new temporary folder; RuntimeError
    with ``local_slurm.sh``'s error (and its logs' folder) where it failed."""
    folder = Path(tempfile.mkdtemp(prefix="workshop-slurm-"))
    # The watchdog first: should this process die during the start, it still stops
    # whatever was started.
    watchdog = subprocess.Popen(
        [
            sys.executable, "-I", slurm_watchdog.__file__, str(os.getpid()),
            slurm_watchdog.start_time(os.getpid()), str(folder), str(LOCAL_SLURM),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C or a signal to the kernel's group
    )  # fmt: skip
    try:
        done = subprocess.run(
            ["bash", str(LOCAL_SLURM), "start", str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        failure = None if done.returncode == 0 else done.stderr.strip()
    except subprocess.TimeoutExpired:
        failure = "local_slurm.sh start did not finish in 60 s"
    if failure:
        slurm_watchdog.stop_cluster(folder, LOCAL_SLURM)
        _end(watchdog)
        logs = folder / "log"
        if not logs.is_dir():
            # Refused before starting anything (no Slurm, not root, a host name that
            # is not on loopback): there is nothing to look at, so nothing to keep.
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"could not start a private Slurm cluster: {failure}")
        raise RuntimeError(
            f"could not start a private Slurm cluster in {folder}: {failure}; its "
            f"logs are in {logs}"
        )
    _unique_job_ids(folder / "slurm.conf")
    cluster = SlurmCluster(
        available=True,
        kind="private",
        reason=f"a private cluster started by this process (SLURM_CONF={folder}/"
        "slurm.conf)",
        folder=folder,
        _watchdog=watchdog,
        _previous_conf=os.environ.get("SLURM_CONF"),
    )
    os.environ["SLURM_CONF"] = str(folder / "slurm.conf")
    atexit.register(cluster.stop)
    return _with_sinfo(cluster)


def conf_problem() -> str | None:
    """What is wrong with ``SLURM_CONF``, if it names no file; else None."""
    conf = os.environ.get("SLURM_CONF")
    if not conf or Path(conf).is_file():
        return None
    what = "a folder" if Path(conf).is_dir() else "a file that does not exist"
    return (
        f"SLURM_CONF={conf} names {what}, not a Slurm configuration file, so "
        "Slurm's commands would retry reading it for 60 s and then fail. "
        "HINT: unset it to use this machine's own configuration "
        '(os.environ.pop("SLURM_CONF") here, `unset SLURM_CONF` in a shell), '
        "or point it at an existing slurm.conf"
    )


def slurm_cluster(start_private: bool = True) -> SlurmCluster:
    """Find out whether Slurm jobs can be submitted from here, and where.

    In this order: a private cluster this process started; a controller that
    answers ``scontrol ping``; else, with ``start_private``, Slurm installed and
    root, a new private two-node cluster on this machine (``SLURM_CONF`` set), stopped
    at exit or by a watchdog if the kernel is killed.

    Args:
        start_private: start a private cluster when no controller answers.

    Returns:
        A :class:`SlurmCluster`; ``available`` False, with the ``reason``, when
        nothing can be submitted here (it never raises for a missing Slurm).

    Example:
        >>> cluster = slurm_cluster()                   # doctest: +SKIP
        >>> print(cluster)                              # doctest: +SKIP
        private Slurm cluster for this notebook, stopped when the kernel ends:
        2 nodes on this machine (127.0.0.2, 127.0.0.3), 2 CPUs each, shared, no GPUs
    """
    global _PRIVATE
    if _PRIVATE is not None and _PRIVATE.available:
        return _PRIVATE
    if shutil.which("sbatch") is None:
        return SlurmCluster(False, "none", _NO_SBATCH)
    problem = conf_problem()
    if problem:  # a minute of retries, then a misleading answer: say it now
        return SlurmCluster(False, "none", problem)
    ok, said = _query(["scontrol", "ping"])
    if ok:
        where = os.environ.get("SLURM_CONF")
        source = (
            f"SLURM_CONF={where}" if where else "this machine's Slurm configuration"
        )
        return _with_sinfo(SlurmCluster(True, "cluster", source))
    no_controller = f"no Slurm controller answers (scontrol ping: {said})"
    if not start_private:
        return SlurmCluster(False, "none", f"{no_controller}; start_private=False")
    missing = [name for name in _DAEMONS if shutil.which(name) is None]
    needs = (
        f"{', '.join(missing)}: run `make setup` as root to install slurm-wlm and "
        "munge, or run this notebook on a cluster's login node"
        if missing
        else "root (slurmd starts the jobs' processes): run the notebook as root, "
        "or on a cluster"
        if os.geteuid() != 0
        else None
    )
    if needs:
        why = f"{no_controller}, and a private cluster needs {needs}"
        return SlurmCluster(False, "none", why)
    if not LOCAL_SLURM.is_file():
        return SlurmCluster(
            False, "none", f"{no_controller}, and {LOCAL_SLURM} is not there"
        )
    try:
        _PRIVATE = _start_private()
    except RuntimeError as exc:
        return SlurmCluster(False, "none", str(exc))
    return _PRIVATE
