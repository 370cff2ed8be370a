"""What :class:`workshop.machine.monitor.Monitor` reads: Linux's cumulative counters
in ``/proc`` (those ``top``, ``free``, ``iostat`` and ``sar -n DEV`` read) and the GPUs
(NVML, else ``nvidia-smi``); a sample is the difference of two readings."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from pathlib import Path

from ..allocation import cpu_limit, memory_limit, slurm_allocation
from .doctor_probes import _run
from .interconnect import _proc_net_dev
from .monitor_plot import Sample

__all__ = [
    "ADMIN_COMMANDS",
    "Gpus",
    "admin_commands",
    "difference",
    "read_counters",
    "scope_line",
]

#: Seconds one ``nvidia-smi`` query may take before it is killed.
SMI_TIMEOUT = 2.0
_SMI_QUERY = [
    "--query-gpu=utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]
_NOT_WHOLE_DISKS = ("loop", "ram", "zram", "dm-", "md", "sr")


def read_counters(
    proc: Path = Path("/proc"), pid: int | None = None
) -> dict[str, float]:
    """Linux's cumulative counters, read once: what each sample is a difference of.

    Args:
        proc: where procfs is mounted (a folder of copies, in tests).
        pid: the process whose CPU time, with its children's, is read (None: this).

    Returns:
        ``cpu_busy``, ``cpu_total`` (clock ticks, all cores), ``process_ticks``,
        ``memory_gib`` (MemTotal - MemAvailable), ``memory_total_gib``,
        ``disk_read_bytes`` (whole disks, as ``iostat`` counts them) and
        ``network_bytes`` (received + sent, every interface but ``lo``).

    Raises:
        RuntimeError: ``proc`` has no ``stat`` (not Linux).

    Example:
        >>> read_counters()["memory_gib"] > 0
        True
    """
    try:
        cpu_line = (proc / "stat").read_text().splitlines()[0].split()
    except OSError as e:
        raise RuntimeError(
            f"cannot read {proc / 'stat'} ({e.strerror or e}): the monitor reads "
            "Linux's /proc; run it on a Linux machine (a cluster node, this workshop's "
            "container)"
        ) from e
    ticks = [float(v) for v in cpu_line[1:]]
    # user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
    total = sum(ticks[:8])
    meminfo = {}
    for line in (proc / "meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        meminfo[name] = float(rest.split()[0]) if rest.split() else 0.0
    mem_total = meminfo.get("MemTotal", 0.0)
    mem_free = meminfo.get("MemAvailable", meminfo.get("MemFree", 0.0))
    return {
        "cpu_busy": total - idle,
        "cpu_total": total,
        "process_ticks": _tree_ticks(proc, os.getpid() if pid is None else pid),
        "memory_gib": (mem_total - mem_free) / 2**20,  # kB to GiB
        "memory_total_gib": mem_total / 2**20,
        "disk_read_bytes": _disk_read_bytes(proc),
        "network_bytes": _network_bytes(proc),
    }


def _tree_ticks(proc: Path, pid: int) -> float:
    """User + system CPU ticks of ``pid`` and its descendants (DataLoader workers)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            # The command name, in parentheses, may hold spaces: split after it.
            fields = (proc / str(current) / "stat").read_text().rpartition(")")[2]
            values = fields.split()
            # utime, stime, and cutime, cstime: the time of children already
            # reaped (a DataLoader's workers at the end of an epoch), so the sum
            # does not drop when a child exits.
            total += sum(float(v) for v in values[11:15])
            for task in (proc / str(current) / "task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except (OSError, IndexError, ValueError):
            continue  # it exited while we read: its time leaves the sum
    return total


def _disk_read_bytes(proc: Path) -> float:
    try:
        lines = (proc / "diskstats").read_text().splitlines()
    except OSError:
        return 0.0
    block = proc.parent / "sys" / "block"  # /sys/block beside /proc
    whole = {p.name for p in block.iterdir()} if block.is_dir() else None
    sectors = 0.0
    for line in lines:
        parts = line.split()
        if len(parts) < 6:
            continue
        name = parts[2]
        # A partition's reads are also its disk's; a device-mapper volume's are also
        # its disks': count whole physical disks only, or reads count twice.
        if name.startswith(_NOT_WHOLE_DISKS) or (
            whole is not None and name not in whole
        ):
            continue
        sectors += float(parts[5])
    return sectors * 512  # diskstats counts 512-byte sectors, whatever the disk's


def _network_bytes(proc: Path) -> float:
    counts = _proc_net_dev(proc / "net" / "dev")
    # Loopback left out: a process talking to itself, not the network.
    return float(sum(rx + tx for name, (rx, tx) in counts.items() if name != "lo"))


class Gpus:
    """GPU utilisation (%) and memory in use (GiB) per GPU: NVML, nvidia-smi or none."""

    def __init__(self, wanted: bool) -> None:
        self.source, self.count = "none", 0
        self._nvml = None
        self._handles: list = []
        if not wanted:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i)
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
            self._nvml, self.source, self.count = pynvml, "NVML", len(self._handles)
            return
        except Exception:  # not installed, no driver: try the command line
            self._handles = []
        smi = shutil.which("nvidia-smi")
        if smi:
            values = self._query_smi(smi)
            if values:
                self._smi, self.source, self.count = smi, "nvidia-smi", len(values)

    def _query_smi(self, smi: str) -> list[tuple[float, float]]:
        ok, output = _run([smi, *_SMI_QUERY], SMI_TIMEOUT)
        values = []
        for line in output.splitlines() if ok else []:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 2:
                continue  # a warning among the rows
            values.append((_number(parts[0]), _number(parts[1]) / 1024))  # MiB
        return values

    def read(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if self.source == "NVML":
            nvml, handles = self._nvml, self._handles
            util = tuple(
                float(nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in handles
            )
            memory = tuple(
                nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30 for h in handles
            )
            return util, memory
        if self.source == "nvidia-smi":
            values = self._query_smi(self._smi)
            if len(values) != self.count:  # a failed or odd query: a gap, not a crash
                values = [(math.nan, math.nan)] * self.count
            return tuple(v[0] for v in values), tuple(v[1] for v in values)
        return (), ()

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "[N/A]" (a MIG slice, a GPU that does not say)
        return math.nan


def difference(
    before: dict[str, float], after: dict[str, float], seconds: float, at: float
) -> Sample:
    """One sample from two readings ``seconds`` apart; never divides by zero."""
    ticks = after["cpu_total"] - before["cpu_total"]
    busy = after["cpu_busy"] - before["cpu_busy"]
    # Two reads within one clock tick (10 ms) see no change: call that 0 % busy.
    cpu = min(100.0, max(0.0, 100.0 * busy / ticks)) if ticks > 0 else 0.0
    # A child that exited took its ticks with it: a drop, clamped at 0.
    mine = max(0.0, after["process_ticks"] - before["process_ticks"])
    process = min(100.0, 100.0 * mine / ticks) if ticks > 0 else 0.0

    def rate(name: str) -> float:
        delta = max(0.0, after[name] - before[name])  # a counter reset is no read
        return delta / seconds / 1e6 if seconds > 0 else 0.0

    return Sample(
        time=at,
        cpu_percent=cpu,
        process_cpu_percent=process,
        memory_gib=after["memory_gib"],
        disk_read_mb_s=rate("disk_read_bytes"),
        network_mb_s=rate("network_bytes"),
    )


#: What an administrator runs on a node, and what each reports.
ADMIN_COMMANDS = [
    ("nvidia-smi dmon -c 1", "per GPU: power, temperature, SM and memory use %"),
    (
        "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv",
        "per GPU: utilisation %, memory in use",
    ),
    ("iostat -x 1 2", "per disk: reads/s, kB/s read, wait (ms), % busy"),
    ("sar -n DEV 1 1", "per network interface: packets/s and kB/s in and out"),
    ("vmstat 1 2", "runnable processes, memory, swap, blocks in/out, CPU split"),
    ("top -b -n 1 -w 88", "the processes using the most CPU, and the load"),
    (
        "sstat -j {job} --format=JobID,AveCPU,MaxRSS,AveDiskRead",
        "a running Slurm job's steps: CPU time, peak memory, reads",
    ),
]


def admin_commands(lines: int = 8, timeout_s: float = 5.0) -> list[tuple[str, bool]]:
    """Run the administrator's commands this machine has, briefly, and print the
    first lines of each; "not on this machine" for the others (``sstat`` only inside a
    Slurm job with job accounting).

    Args:
        lines: lines of each command's output to print.
        timeout_s: seconds each command may take before it is killed.

    Returns:
        (command, whether it ran) for each of :data:`ADMIN_COMMANDS`.

    Example:
        >>> ran = admin_commands(lines=3)  # doctest: +SKIP
    """
    job = slurm_allocation().job_id
    results = []
    for template, _ in ADMIN_COMMANDS:
        command = template.format(job=job or "JOBID")
        refuse = None
        if "{job}" in template and not job:
            refuse = "not inside a Slurm job here (no SLURM_JOB_ID): run it in one"
        ok = run_listed(command, command, lines, timeout_s, refuse=refuse)
        results.append((command, ok))
    return results


def run_listed(
    command: str, shown: str, lines: int, timeout_s: float, refuse: str | None = None
) -> bool:
    """Print ``$ shown``, then run ``command`` where its program is on PATH and print
    its first ``lines`` non-empty lines (each cut to fit 88 columns), or why it did
    not run: "not on this machine", ``refuse`` when given, or its error.

    Returns:
        True when the command ran and succeeded.
    """
    argv = command.split()
    print(f"$ {shown}")
    if not shutil.which(argv[0]):
        print("  not on this machine")
        return False
    if refuse:
        print(f"  {refuse}")
        return False
    ok, output = _run(argv, timeout_s)
    kept = [ln[:86].rstrip() for ln in output.splitlines() if ln.strip()][:lines]
    print("\n".join(f"  {line}" for line in kept) if ok else f"  {output}")
    return ok


def scope_line() -> str | None:
    """Where this process may use less than the node, what its figures mean: CPU %
    and memory are the whole node's, so a 1-core job on 64 cores moves CPU % by 1.6
    points at most. None where the process may use the whole node.

    Example:
        >>> scope_line()                                        # doctest: +SKIP
    """
    cpus, memory = cpu_limit(), memory_limit()
    if cpus.cores >= cpus.node_cores and memory.limit is None:
        return None
    share = 100 * cpus.cores / cpus.node_cores
    text = (
        f"CPU % and memory are the whole node's ({cpus.node_cores} cores); this "
        f"process may use {cpus.describe()}, so its cores all busy read "
        f"{share:.0f} %"
    )
    if memory.limit is not None:
        text += f"; memory: {memory.describe()}"
    return text
