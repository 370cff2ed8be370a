"""Record the notebooks' stored outputs whole: each notebook executed top to bottom in
one fresh kernel, on a machine checked to be quiet, with what it ran on and how long
each cell took written into its metadata.

    make record                          # all five notebooks, one after another
    make record NOTEBOOK=01              # one: a number, a name or a path
    make record RECORD_ARGS=--busy-ok    # write on a busy machine; marked "busy"
    make record-table                    # docs/notebooks.md's table, from the metadata
    python scripts/record.py --table     # print that table only

Why whole: a stored output is what a self-paced learner reads. A cell re-run alone
stores figures from another state of the kernel (notebook 01 once stored an eager
epoch several times slower than its own earlier ones), and a busy machine stores
figures that teach the wrong lesson. So a recording is all cells in order in one
kernel (execution counts 1, 2, 3, ...; tests/test_recording.py checks), and it is
written only when the machine was quiet before and during the run.

The kernel is this Python (as nbval's --nbval-current-env starts it, so what is
recorded is what `make test` compares), started in notebooks/ whatever the path of
the notebook, with make test's environment (OMP_WAIT_POLICY, as the Makefile sets
it). Tooling for whoever changes a notebook, outside the package: nothing a learner
imports uses it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DOCS_PAGE = ROOT / "docs" / "notebooks.md"
TABLE_START = "<!-- recording-table -->"
TABLE_END = "<!-- /recording-table -->"

# The limit: no cell over 30 s on the 2-core machine. A slower cell is
# recorded all the same (its figures are true), but said loudly.
SLOW_CELL_S = 30.0
# A cell that runs this long is stuck (a rank waiting for a peer that died), not slow.
CELL_TIMEOUT_S = 300.0
# Every process the kernel starts inherits this variable, also those that leave its
# process tree (the private Slurm cluster's daemons, a job's tasks): that is how
# the monitor tells the notebook's work from other work on the machine.
MARKER = "WORKSHOP_RECORDING"

# --- what "quiet" means --------------------------------------------------------------
# Sized for the 2-core machine the notebooks are recorded on, scaled by the cores.
# Before: the 1-min load average at most half a core per core (1.0 on 2 cores): one
# runnable task on average over the last minute would already take half of the
# machine from the notebook's ranks.
LOAD_PER_CORE = 0.5
# Other processes (not the recorder, not the notebook's): at most a fifth of one core,
# or a tenth of the machine where that is more. An idle machine's daemons use a few
# percent of a core; one busy process shows as a whole core.
OTHERS_MEAN_CORES = 0.2
OTHERS_MEAN_PER_CORE = 0.1
# During the run, also no stretch of one sampling interval in which others took 0.4
# of the machine (0.8 of a core on 2 cores): a burst that large stretches the cell
# it lands in, however short the burst is against the whole run.
OTHERS_PEAK_PER_CORE = 0.4
# The hypervisor giving our cores to another guest: 5% of the time stretches every
# figure by about as much.
STEAL_PERCENT = 5.0
# The load average is recorded during the run but not judged: the notebook's own
# ranks raise it (4 ranks on 2 cores are a load of 4), so "busy during" is judged by
# the CPU time of processes that are not the notebook's, and by steal.
SAMPLE_S = 3.0
BEFORE_S = 2.0

# The variables make test sets or that change what a notebook prints; those set are
# written into the recording.
ENV_RECORDED = (
    "OMP_WAIT_POLICY",
    "OMP_NUM_THREADS",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "CUDA_VISIBLE_DEVICES",
)
# The vector units that change what PyTorch's CPU kernels compute and how fast.
VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
)
REQUIRED_FIELDS = (
    "date",
    "busy",
    "machine",
    "environment",
    "before",
    "during",
    "seconds",
    "cell_seconds",
    "code_sha256",
)
MACHINE_FIELDS = (
    "cpu",
    "vector_units",
    "aten_cpu_capability",
    "cores",
    "affinity",
    "torch_threads",
    "memory_gib",
    "gpus",
    "python",
    "torch",
)


class RecordError(Exception):
    """Why nothing was written: a one-line message that names the value and the fix."""


class UsageError(RecordError):
    """A notebook named on the command line that is not there (exit status 2)."""


# --- which notebooks -----------------------------------------------------------------


def resolve_notebooks(names: list[str], folder: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks ``names`` mean: every notebook of ``folder`` when empty; else
    each a number ("01", "1"), a name ("01_single_node_multi_gpu") or a path to an
    .ipynb file (which may lie outside ``folder``).

    Raises:
        RecordError: a name that is none of these, naming it and what exists.
    """
    known = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return known
    found = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.is_file():
            found.append(path.resolve())
            continue
        number = f"{int(name):02d}" if name.isdigit() else None
        match = [
            p
            for p in known
            if p.stem == name or (number and p.name[:3] == number + "_")
        ]
        if len(match) != 1:
            numbers = ", ".join(p.name[:2] for p in known) or "none"
            raise UsageError(
                f"record: no notebook {name!r}: the notebooks in {_rel(folder)}/ are "
                f"{numbers} (give one of these, a notebook's name, or the path of an "
                ".ipynb file)"
            )
        found.append(match[0])
    return found


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# --- reading the machine's load from /proc -----------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat shows it; times in clock ticks."""

    pid: int
    ppid: int
    name: str
    own: int  # utime + stime
    children: int  # cutime + cstime: its children that it has reaped
    start: int  # since boot: tells a reused pid from the process seen before


def processes() -> dict[int, Proc]:
    """Every process of this machine (of this pid namespace) that can be read now."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue  # ended while we looked
        # The name is in parentheses and may hold spaces and parentheses itself.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = Proc(
            pid=int(entry.name),
            ppid=int(rest[1]),
            name=name,
            own=int(rest[11]) + int(rest[12]),
            children=int(rest[13]) + int(rest[14]),
            start=int(rest[19]),
        )
    return found


def cpu_used(before: dict[int, Proc], after: dict[int, Proc]) -> dict[int, int]:
    """Clock ticks of CPU each process of ``after`` used since ``before``.

    A child that ended and was reaped in between shows up in its parent's children
    time with all of its life, of which ``before`` had already seen part: that part
    is taken off, so a long run that ends now is not counted again. The same holds
    for a whole chain that ended (a shell, its pytest, the pytest's workers): what
    was seen of each is taken off at the nearest process still running above it.
    A process that started in between counts all its time (all of it is new).

    Init (pid 1) adopts every orphan and reaps it: the notebook's own (a Slurm job's
    tasks, an mpirun's daemons) end there too, most too short-lived for a sample to
    have seen them, and whose orphan it was cannot be told any more. So init counts
    only its own time, not its children's.
    """
    gone = {
        pid: old
        for pid, old in before.items()
        if pid not in after or after[pid].start != old.start
    }
    seen: dict[int, int] = {}
    for old in gone.values():
        up, steps = old.ppid, 0
        while up in gone and steps < len(gone):  # the chain's survivor
            up, steps = gone[up].ppid, steps + 1
        seen[up] = seen.get(up, 0) + old.own + old.children
    used = {}
    for pid, new in after.items():
        old = before.get(pid)
        if old is None or old.start != new.start:
            used[pid] = new.own + new.children
        elif pid == 1:
            used[pid] = new.own - old.own
        else:
            reaped = new.children - old.children - seen.get(pid, 0)
            used[pid] = new.own - old.own + max(0, reaped)
    return used


def _marked(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER}={marker}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _descendants(roots: set[int], procs: dict[int, Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _ancestors(pid: int, procs: dict[int, Proc]) -> set[int]:
    found = set()
    while pid in procs and pid not in found and pid > 1:
        found.add(pid)
        pid = procs[pid].ppid
    return found


SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "munged")


class _Others:
    """Which processes are "other work": not this recorder nor what waits on it (its
    ancestors), not the kernel's threads, and not the notebook's processes (those
    that carry the marker, and their descendants)."""

    def __init__(self, marker: str | None) -> None:
        self.marker = marker
        self._marks: dict[tuple[int, int], bool] = {}

    def pick(self, procs: dict[int, Proc]) -> set[int]:
        mine = _ancestors(os.getpid(), procs) | _descendants({os.getpid()}, procs)
        roots = set()
        if self.marker is not None:
            for p in procs.values():
                key = (p.pid, p.start)  # environ never changes after exec
                if key not in self._marks:
                    self._marks[key] = _marked(p.pid, self.marker)
                if self._marks[key]:
                    roots.add(p.pid)
        # slurmd starts each job step's slurmstepd with an environment of its own and
        # leaves it to init, so neither the marker nor the process tree leads from
        # the notebook to its jobs' step daemons. Where the notebook runs the Slurm
        # daemons (its private cluster), their slurmstepd processes are its too.
        if any(procs[pid].name in SLURM_DAEMONS for pid in roots if pid in procs):
            roots |= {pid for pid, p in procs.items() if p.name == "slurmstepd"}
        notebook = _descendants(roots, procs)
        # The kernel's own threads (kthreadd, pid 2, and its children) do the
        # machine's work, much of it for the notebook (its sockets, its pages).
        return {
            pid
            for pid, p in procs.items()
            if pid not in mine and pid not in notebook and pid != 2 and p.ppid != 2
        }


def _cpu_stat() -> tuple[int, int, int]:
    """(all, steal, busy) clock ticks of the first line of /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0, 0
    fields += [0] * (8 - len(fields))
    # user nice system idle iowait irq softirq steal (guest is inside user)
    total = sum(fields[:8])
    return total, fields[7], total - fields[3] - fields[4] - fields[7]


def _load_1min() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _steal_percent(before: tuple[int, ...], after: tuple[int, ...]) -> float:
    total = after[0] - before[0]
    return 100.0 * (after[1] - before[1]) / total if total > 0 else 0.0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _others_limit(cores: int) -> float:
    return max(OTHERS_MEAN_CORES, OTHERS_MEAN_PER_CORE * cores)


def _describe(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
        words = [w for w in words if w]
        if words:
            words[0] = os.path.basename(words[0])
            name = " ".join(" ".join(words).split())  # `python -c` code: one line
    except OSError:
        pass
    return f"{name[:48]} (pid {pid})"


def _busiest(per_pid: dict[int, float], names: dict[int, str], n: int = 3) -> list:
    """[[description, cores], ...]: the ``n`` busiest, from 0.1% of a core."""
    top = sorted(per_pid.items(), key=lambda item: -item[1])[:n]
    return [[_describe(pid, names[pid]), round(c, 3)] for pid, c in top if c >= 0.001]


@dataclass
class Quiet:
    """What the check before a recording found."""

    load_1min: float
    cores: int
    others_cores: float  # cores' worth of CPU other processes used over `seconds`
    busiest: list  # [[process, cores], ...] of the other processes
    steal_percent: float
    seconds: float
    load_judged: bool = True
    reasons: list[str] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        return bool(self.reasons)

    def line(self) -> str:
        load = f"load {self.load_1min:.2f} over the last minute on {self.cores} cores"
        if self.load_judged:
            load += f" (limit {LOAD_PER_CORE * self.cores:.2f})"
        else:
            load += " (not judged: the notebook just recorded raised it)"
        others = (
            f"other processes {self.others_cores:.2f} cores over {self.seconds:.0f} s "
            f"(limit {_others_limit(self.cores):.2f})"
        )
        if self.busiest:
            others += ", busiest: " + "; ".join(
                f"{what} {100 * c:.0f}% of a core" for what, c in self.busiest
            )
        steal = f"steal {self.steal_percent:.1f}% (limit {STEAL_PERCENT:.0f}%)"
        verdict = "BUSY: " + "; ".join(self.reasons) if self.busy else "quiet"
        return f"before: {load}; {others}; {steal}: {verdict}"


def quiet_check(seconds: float = BEFORE_S, judge_load: bool = True) -> Quiet:
    """Look at the machine for ``seconds``: its load average, the CPU other processes
    use, and steal, each against its limit (the module's constants say why)."""
    cores = _cores()
    others = _Others(marker=None)
    stat0, procs0 = _cpu_stat(), processes()
    time.sleep(seconds)
    stat1, procs1 = _cpu_stat(), processes()
    picked = others.pick(procs1)
    used = {pid: t for pid, t in cpu_used(procs0, procs1).items() if pid in picked}
    per_pid = {pid: t / _TICK / seconds for pid, t in used.items()}
    quiet = Quiet(
        load_1min=_load_1min(),
        cores=cores,
        others_cores=round(sum(per_pid.values()), 3),
        busiest=_busiest(per_pid, {p: procs1[p].name for p in per_pid}),
        steal_percent=round(_steal_percent(stat0, stat1), 2),
        seconds=seconds,
        load_judged=judge_load,
    )
    if judge_load and quiet.load_1min > LOAD_PER_CORE * cores:
        quiet.reasons.append(
            f"load {quiet.load_1min:.2f} over the last minute, above "
            f"{LOAD_PER_CORE * cores:.2f} ({LOAD_PER_CORE} per core)"
        )
    if quiet.others_cores > _others_limit(cores):
        quiet.reasons.append(
            f"other processes used {quiet.others_cores:.2f} cores, above "
            f"{_others_limit(cores):.2f}"
        )
    if quiet.steal_percent > STEAL_PERCENT:
        quiet.reasons.append(
            f"steal {quiet.steal_percent:.1f}%, above {STEAL_PERCENT:.0f}%"
        )
    return quiet


@dataclass
class During:
    """What the monitor saw while a notebook ran."""

    load_mean: float = 0.0
    load_max: float = 0.0
    others_cores_mean: float = 0.0
    others_cores_max: float = 0.0
    busiest: list = field(default_factory=list)
    steal_percent: float = 0.0
    samples: int = 0
    reasons: list[str] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        return bool(self.reasons)

    def line(self) -> str:
        others = (
            f"other processes {self.others_cores_mean:.2f} cores on average (limit "
            f"{_others_limit(_cores()):.2f}), {self.others_cores_max:.2f} at most "
            f"(limit {OTHERS_PEAK_PER_CORE * _cores():.2f})"
        )
        if self.busiest:
            others += ", busiest: " + "; ".join(
                f"{what} {c:.1f} CPU-s" for what, c in self.busiest
            )
        verdict = "BUSY: " + "; ".join(self.reasons) if self.busy else "quiet"
        return (
            f"during: load {self.load_mean:.2f} on average, {self.load_max:.2f} at "
            f"most (the notebook's own ranks raise it; not judged); {others}; steal "
            f"{self.steal_percent:.1f}% (limit {STEAL_PERCENT:.0f}%) in "
            f"{self.samples} samples: {verdict}"
        )


class Monitor:
    """Samples the machine every ``interval`` seconds in a thread while a notebook
    runs: the load average, steal, and the CPU time of every process that is not the
    notebook's (the kernel and what it starts carry ``marker`` in their
    environment).

    Example:
        >>> monitor = Monitor(marker).start()  # doctest: +SKIP
        >>> ...; during = monitor.stop()
    """

    def __init__(self, marker: str, interval: float = SAMPLE_S) -> None:
        self.interval = interval
        self._others = _Others(marker)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loads: list[float] = []
        # (CPU-seconds of others, seconds) per interval between two samples
        self._windows: list[tuple[float, float]] = []
        self.cpu_seconds: dict[int, float] = {}  # per other process, over the run
        self.names: dict[int, str] = {}  # "command line (pid N)"

    def start(self) -> Monitor:
        self._stat0, self._procs = _cpu_stat(), processes()
        self._stat = self._stat0
        self._started = self._last = time.monotonic()
        self._thread.start()
        return self

    def _sample(self) -> None:
        stat, procs, now = _cpu_stat(), processes(), time.monotonic()
        picked = self._others.pick(procs)
        used = cpu_used(self._procs, procs)
        window = 0.0
        for pid, ticks in used.items():
            if pid in picked and ticks > 0:
                seconds = ticks / _TICK
                window += seconds
                self.cpu_seconds[pid] = self.cpu_seconds.get(pid, 0.0) + seconds
                if pid not in self.names:  # now, while it runs: it may not later
                    self.names[pid] = _describe(pid, procs[pid].name)
        # Never more than the whole machine worked (/proc/stat): a process whose
        # life the accounting cannot follow must not make a quiet run look busy.
        window = min(window, (stat[2] - self._stat[2]) / _TICK)
        self._windows.append((window, now - self._last))
        self._loads.append(_load_1min())
        self._stat, self._procs, self._last = stat, procs, now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> During:
        self._stop.set()
        self._thread.join(timeout=30)
        self._sample()  # the last stretch, however short
        cores = _cores()
        top = sorted(self.cpu_seconds.items(), key=lambda item: -item[1])[:3]
        elapsed = max(self._last - self._started, 1e-3)
        # The peak over stretches of half a second or more: over a shorter one a
        # single clock tick (10 ms) of another process reads as a fifth of a core.
        windows = [(cpu, s) for cpu, s in self._windows if s >= 0.5] or [
            (sum(cpu for cpu, _ in self._windows), elapsed)
        ]
        during = During(
            load_mean=round(sum(self._loads) / len(self._loads), 2),
            load_max=round(max(self._loads), 2),
            # Weighted by time: the mean over the run, not over the samples.
            others_cores_mean=round(sum(cpu for cpu, _ in self._windows) / elapsed, 3),
            others_cores_max=round(max(cpu / s for cpu, s in windows), 3),
            busiest=[[self.names[pid], round(s, 1)] for pid, s in top if s >= 0.1],
            steal_percent=round(_steal_percent(self._stat0, self._stat), 2),
            samples=len(self._loads),
        )
        if during.others_cores_mean > _others_limit(cores):
            during.reasons.append(
                f"other processes used {during.others_cores_mean:.2f} cores on "
                f"average, above {_others_limit(cores):.2f}"
            )
        if during.others_cores_max > OTHERS_PEAK_PER_CORE * cores:
            during.reasons.append(
                f"other processes used {during.others_cores_max:.2f} cores in the "
                f"busiest stretch between two samples, above "
                f"{OTHERS_PEAK_PER_CORE * cores:.2f}"
            )
        if during.steal_percent > STEAL_PERCENT:
            during.reasons.append(
                f"steal {during.steal_percent:.1f}%, above {STEAL_PERCENT:.0f}%"
            )
        return during

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self._stop.is_set():
            self.stop()


# --- what the notebook ran on --------------------------------------------------------

_PROBE = """
import json, platform, torch
cpu = getattr(torch.backends, "cpu", None)
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(json.dumps({
    "python": platform.python_version(),
    "torch": torch.__version__,
    "torch_threads": torch.get_num_threads(),
    "aten_cpu_capability": cpu.get_cpu_capability() if cpu else None,
    "gpus": gpus,
}))
"""


def _cpuinfo() -> tuple[str, list[str]]:
    """The CPU's model and its vector units, from /proc/cpuinfo."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = re.sub(r"\((?:R|TM|tm)\)|\bCPU\b|@.*$", "", model)
    model = " ".join(model.split()) or platform.machine() or "unknown CPU"
    return model, [flag for flag in VECTOR_FLAGS if flag in flags]


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def describe_machine(env: dict[str, str]) -> dict:
    """What a kernel with ``env`` runs on: the CPU, its vector units and those
    PyTorch's kernels use, cores, threads, memory, GPUs, Python and torch.

    Torch's figures come from a Python started as the kernel is (this interpreter,
    ``env``), so ATEN_CPU_CAPABILITY and OMP_NUM_THREADS count as they do there.

    Raises:
        RecordError: that Python cannot import torch.
    """
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        cwd=NOTEBOOKS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RecordError(
            f"record: {sys.executable} could not describe torch ({last}); run "
            "make record, which uses the project's Python"
        )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    model, vector = _cpuinfo()
    return {
        "cpu": model,
        "vector_units": vector,
        "aten_cpu_capability": found["aten_cpu_capability"],
        "cores": os.cpu_count(),
        "affinity": _cores(),
        "torch_threads": found["torch_threads"],
        "memory_gib": _memory_gib(),
        "gpus": found["gpus"],
        "python": found["python"],
        "torch": found["torch"],
    }


def kernel_env(marker: str, inductor_cache: str | None = None) -> dict[str, str]:
    """The kernel's environment: this one, make test's OMP_WAIT_POLICY (the
    Makefile's WAIT_POLICY: OpenMP's idle threads sleep rather than spin, which
    changes no result; one already set is kept), no record of the lessons
    (WORKSHOP_PROGRESS=off: the checks a recording runs are not the recorder's
    own progress), and the marker.

    ``inductor_cache``: an empty folder for torch.compile's cache on disk, unless
    TORCHINDUCTOR_CACHE_DIR is set already. Inductor's cache is kept across
    processes, so without it notebook 01's compile lesson would record the warm-up
    of whatever compiled on this machine before (a second or less) instead of the
    first run's that a learner's new machine pays (tens of seconds)."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["WORKSHOP_PROGRESS"] = "off"
    if inductor_cache is not None:
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache)
    env[MARKER] = marker
    return env


# --- recording one notebook -------------------------------------------------------


def code_sha256(nb: dict) -> str:
    """A hash of the code cells' sources in order: a recording is of this code."""
    sources = ("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    return hashlib.sha256("\0".join(sources).encode()).hexdigest()[:16]


def _source(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def _kernel_manager_class():
    """A kernel manager that starts the kernel with this Python, whatever kernel the
    notebook names: what nbval's --nbval-current-env does (its
    NbvalKernelspecManager), so `make test` compares what this ran."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(
                resource_dir=ipykernel.kernelspec.RESOURCES,
                **ipykernel.kernelspec.get_kernel_dict(),
            )

    class Manager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _default_specs(self):
            return ThisPython()

    return Manager


def write_notebook(path: Path, nb: dict) -> None:
    """Write ``nb`` as nbformat writes it (lines split, keys sorted, one space of
    indent, a newline at the end), through a file beside it so a reader never
    sees half a notebook."""
    import nbformat
    from nbformat.v4.rwbase import split_lines, strip_transient

    nb = strip_transient(split_lines(nbformat.from_dict(json.loads(json.dumps(nb)))))
    text = json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    partial = path.with_name(f".{path.name}.recording")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _say_cell(out, index, cell, seconds, count) -> None:
    first = next((ln for ln in _source(cell).splitlines() if ln.strip()), "")
    slow = f"  WARNING: over {SLOW_CELL_S:.0f} s" if seconds > SLOW_CELL_S else ""
    out(f"  [{count:2d}] cell {index:2d} {cell.get('id', '?'):>8} {seconds:7.2f} s  "
        f"{first[:44]}{slow}")  # fmt: skip


def _busy(what: str, reasons: list[str]) -> RecordError:
    """The refusal of a busy machine: what was not done, why, and the way out."""
    return RecordError(
        f"record: {what} ({'; '.join(reasons)}); run again when it is quiet, or "
        "write it all the same with --busy-ok (make record RECORD_ARGS=--busy-ok), "
        "which marks it busy"
    )


def record_notebook(
    path: Path,
    *,
    busy_ok: bool = False,
    timeout: float = CELL_TIMEOUT_S,
    check: Callable[[], Quiet] = quiet_check,
    monitor: Callable[[str], Monitor] = Monitor,
    machine: Callable[[dict[str, str]], dict] = describe_machine,
    out: Callable[[str], None] = print,
) -> dict:
    """Execute the notebook at ``path`` top to bottom in one fresh kernel (started in
    notebooks/) and write its outputs and its recording back, if the machine was
    quiet before and during the run, or ``busy_ok``.

    Args:
        path: the notebook; it may lie outside notebooks/.
        busy_ok: write on a busy machine too, marked ``"busy": true``.
        timeout: seconds a cell may run before the recording fails.
        check: the check before the run (``quiet_check``).
        monitor: makes the sampler of the run from the marker (``Monitor``).
        machine: describes the machine from the kernel's environment.
        out: where progress lines go.

    Returns:
        The recording written under the notebook's metadata "workshop".

    Raises:
        RecordError: the machine was busy, a cell failed, or the notebook changed
            while it ran; the notebook is then left as it was.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import (
        CellExecutionError,
        CellTimeoutError,
        DeadKernelError,
    )

    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)  # its lines joined, as nbclient wants
    name = _rel(path)
    quiet = check()
    out(quiet.line())
    if quiet.busy and not busy_ok:
        raise _busy(f"{name} not recorded: the machine is busy", quiet.reasons)
    marker = uuid.uuid4().hex
    cache = tempfile.TemporaryDirectory(prefix="record-inductor-")
    env = kernel_env(marker, cache.name)
    described = machine(env)
    seconds: dict[str, float] = {}
    started: dict[int, float] = {}
    code_index = iter(range(1, 10**6))

    def on_start(cell, cell_index, **_):
        started[cell_index] = time.perf_counter()

    def on_done(cell, cell_index, **_):
        took = time.perf_counter() - started[cell_index]
        seconds[cell["id"]] = round(took, 2)
        _say_cell(out, cell_index, cell, took, next(code_index))

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_manager_class=_kernel_manager_class(),
        store_widget_state=True,  # notebook 04's widgets and the quizzes need it
        record_timing=True,
        on_cell_start=on_start,
        on_cell_executed=on_done,
    )
    where = f"{sys.executable}, in {_rel(NOTEBOOKS)}/"
    out(f"{name}: executing in one fresh kernel ({where})")
    wall = time.perf_counter()
    watcher = monitor(marker)
    with watcher:
        try:
            # The kernel's own log (its start-up notices) is not the notebook's:
            # nbval drops it too. What a cell writes to stderr comes as output.
            with cache:
                client.execute(cwd=str(NOTEBOOKS), env=env, stderr=subprocess.DEVNULL)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
            failed = max(started, default=0)
            cell = nb.cells[failed] if failed < len(nb.cells) else {}
            # The error's last line, without the terminal colours of the traceback.
            what = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
            raise RecordError(
                f"record: {name} not written: cell {failed} ({cell.get('id', '?')}) "
                f"failed: {what[-1] if what else type(error).__name__}; fix it and "
                "record the whole notebook again"
            ) from error
        during = watcher.stop()
    wall = time.perf_counter() - wall
    out(during.line())
    busy = quiet.busy or during.busy
    if during.busy and not busy_ok:
        raise _busy(
            f"{name} not written: the machine was busy while it ran", during.reasons
        )
    if path.read_text(encoding="utf-8") != text:
        raise RecordError(
            f"record: {name} not written: the file changed while it ran (someone "
            "edited it); record it again"
        )
    recording = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "busy": busy,
        "busy_reasons": quiet.reasons + during.reasons,
        "machine": described,
        "environment": {k: env[k] for k in ENV_RECORDED if k in env},
        "inductor_cache": (
            "empty at the start"
            if env["TORCHINDUCTOR_CACHE_DIR"] == cache.name
            else f"TORCHINDUCTOR_CACHE_DIR={env['TORCHINDUCTOR_CACHE_DIR']}, as set"
        ),
        "before": {k: v for k, v in asdict(quiet).items() if k != "reasons"},
        "during": {k: v for k, v in asdict(during).items() if k != "reasons"},
        "seconds": round(sum(seconds.values()), 1),
        "wall_seconds": round(wall, 1),
        "cell_seconds": seconds,
        "code_sha256": code_sha256(nb),
    }
    nb.metadata.setdefault("workshop", {})["recording"] = recording
    write_notebook(path, nb)
    _summary(out, name, nb, recording)
    return recording


def _summary(out, name: str, nb: dict, recording: dict) -> None:
    index = {c.get("id"): i for i, c in enumerate(nb["cells"])}
    cells = recording["cell_seconds"]
    slowest = sorted(cells.items(), key=lambda item: -item[1])[:5]
    out(
        f"{name}: written; {len(cells)} code cells, {recording['seconds']:.1f} s of "
        f"cells ({recording['wall_seconds']:.1f} s with the kernel's start)"
        + (", recorded BUSY" if recording["busy"] else "")
        + "; slowest: "
        + ", ".join(f"cell {index.get(i)} ({i}) {s:.1f} s" for i, s in slowest)
    )
    over = [(i, s) for i, s in cells.items() if s > SLOW_CELL_S]
    for cell_id, s in over:
        out(
            f"WARNING: {name} cell {index.get(cell_id)} ({cell_id}) took {s:.1f} s, "
            f"over {SLOW_CELL_S:.0f} s"
        )


# --- the table of docs/notebooks.md -----------------------------------------------


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def table_markdown(folder: Path = NOTEBOOKS) -> str:
    """A Markdown table of each notebook's recording: how long its cells ran, its
    slowest cell, the machine, torch, the date and whether it was busy."""
    rows = [
        "| notebook | cells run | slowest cell | machine | torch | recorded | busy |",
        "|---|---|---|---|---|---|---|",
    ]
    total, recorded = 0.0, 0
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        rec = nb.get("metadata", {}).get("workshop", {}).get("recording")
        number = path.name[:2]
        if not rec:
            rows.append(f"| {number} | not recorded with `make record` | | | | | |")
            continue
        index = {c.get("id"): i for i, c in enumerate(nb["cells"])}
        slow_id, slow_s = max(rec["cell_seconds"].items(), key=lambda item: item[1])
        m = rec["machine"]
        cores = (
            f"{m['cores']} cores"
            if m["affinity"] == m["cores"]
            else f"{m['affinity']} of {m['cores']} cores"
        )
        gpus = f", {len(m['gpus'])} x {m['gpus'][0]}" if m["gpus"] else ", no GPU"
        capability = f", {m['aten_cpu_capability']}" if m["aten_cpu_capability"] else ""
        machine = f"{m['cpu']}{capability}, {cores}, {m['torch_threads']} threads{gpus}"
        rows.append(
            f"| {number} | {_seconds(rec['seconds'])} | cell {index.get(slow_id)} "
            f"(`{slow_id}`) {_seconds(slow_s)} | {machine} | {m['torch']} | "
            f"{rec['date']} | {'yes' if rec['busy'] else 'no'} |"
        )
        total += rec["seconds"]
        recorded += 1
    if recorded and recorded == len(rows) - 2:
        rows.append(f"| all | {_seconds(total)} | | | | | |")
    return "\n".join(rows) + "\n"


def replace_block(text: str, table: str) -> str:
    """``text`` with what lies between the table's two markers replaced by ``table``.

    Raises:
        RecordError: the markers are not there, once each, in order.
    """
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start or text.count(TABLE_START) != 1:
        raise RecordError(
            f"record: {_rel(DOCS_PAGE)} has no block between {TABLE_START} and "
            f"{TABLE_END} (once each) for the table; add the two lines where it goes"
        )
    return text[: start + len(TABLE_START)] + "\n" + table + text[end:]


def docs_block(text: str) -> str | None:
    """What lies between the table's markers of ``text`` (None where they are not)."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        return None
    return text[start + len(TABLE_START) : end].removeprefix("\n")


def update_docs(page: Path = DOCS_PAGE, folder: Path = NOTEBOOKS) -> str:
    """Rewrite the table in ``page`` from the notebooks' recordings; return it."""
    table = table_markdown(folder)
    text = page.read_text(encoding="utf-8")
    new = replace_block(text, table)
    if new != text:
        page.write_text(new, encoding="utf-8")
    return table


# --- the command line ----------------------------------------------------------------


def _seconds_above_zero(text: str) -> float:
    # Not workshop._cli's above_zero: importing the package imports torch, seconds
    # before a typo could be refused.
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text} is not a number of seconds above 0; e.g. --timeout 300"
        )
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/record.py",
        description="Record notebooks whole, in one fresh kernel each, on a quiet "
        "machine; or print the table of their recordings.",
    )
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="numbers (01), names or paths of .ipynb files; none: all of notebooks/",
    )
    parser.add_argument(
        "--busy-ok",
        action="store_true",
        help="write even if the machine was busy, marking the notebook busy",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds_above_zero,
        default=CELL_TIMEOUT_S,
        help=f"seconds a cell may run (default {CELL_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="print the Markdown table of the notebooks' recordings; run nothing",
    )
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help=f"with --table: also rewrite the table's block in {_rel(DOCS_PAGE)}",
    )
    args = parser.parse_args(argv)
    if args.update_docs and not args.table:
        parser.error("--update-docs goes with --table (make record-table)")
    try:
        if args.table:
            if args.notebooks:
                parser.error("--table takes no notebooks: it reads all of notebooks/")
            table = update_docs() if args.update_docs else table_markdown()
            print(table, end="")
            return 0
        paths = resolve_notebooks(args.notebooks)
        if not paths:
            raise RecordError(f"record: no notebooks in {_rel(NOTEBOOKS)}")
        written = []
        try:
            for number, path in enumerate(paths):
                # After the first notebook the load average is the previous
                # notebook's (it falls over minutes): judged only before the first.
                first = number == 0
                record_notebook(
                    path,
                    busy_ok=args.busy_ok,
                    timeout=args.timeout,
                    check=lambda first=first: quiet_check(judge_load=first),
                )
                written.append(path)
        finally:  # also when a later notebook failed: the table says what is there
            if any(path.parent == NOTEBOOKS for path in written):
                update_docs()
                print(f"record: the table in {_rel(DOCS_PAGE)} is rewritten")
    except RecordError as error:
        print(error, file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
