"""Profile training steps with ``torch.profiler``: which operators cost the most, and a
trace file to open in Perfetto (https://ui.perfetto.dev) or TensorBoard.

Used by notebook 01, section 6::

    report = workshop.training.profile_steps(one_step, steps=3, trace_dir="traces")
    print(report.table)

Inside a long training loop, ``schedule(wait=, warmup=, active=, repeat=)`` picks
the steps to record; notebook 05, section 5, reads which it picked and what
``tensorboard_trace_handler`` wrote::

    recorded_steps(12, wait=1, warmup=1, active=3, repeat=2)   # [2, 3, 4, 7, 8, 9]
    for trace in trace_files("log"):
        print(stable_trace_name(trace), trace_steps(trace))
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import whole

__all__ = [
    "OperatorCost",
    "Profile",
    "profile_steps",
    "quiet_profiler",
    "recorded_steps",
    "stable_trace_name",
    "trace_files",
    "trace_steps",
]


@dataclass(frozen=True)
class OperatorCost:
    """What one operator cost over the profiled steps."""

    name: str
    calls: int
    self_cpu_ms: float
    self_device_ms: float


@dataclass
class Profile:
    """The result of :func:`profile_steps`.

    Attributes:
        activities: what was recorded ("CPU", and "CUDA" when the step used it).
        steps: how many steps were recorded (after the warm-up).
        top: the costliest operators, most expensive first.
        table: ``torch.profiler``'s own table of the same operators.
        trace: the trace file written, if a ``trace_dir`` was given.
    """

    activities: list[str]
    steps: int
    top: list[OperatorCost] = field(default_factory=list)
    table: str = ""
    trace: Path | None = None


def profile_steps(
    step: Callable[[], object],
    *,
    steps: int = 3,
    warmup: int = 1,
    trace_dir: str | os.PathLike | None = None,
    row_limit: int = 10,
    cuda: bool | None = None,
) -> Profile:
    """Run ``step`` ``warmup + steps`` times and profile the last ``steps`` runs (the
    first pays one-off costs, allocation and kernel selection, that would mislead).

    Args:
        step: one training step (forward, backward, optimizer step), no arguments.
        steps: steps recorded.
        warmup: steps run before recording.
        trace_dir: where to write a ``.pt.trace.json`` trace; none when omitted.
        row_limit: operators kept in ``top`` and ``table``.
        cuda: record GPU work too; None: when CUDA is in use after the warm-up (so a
            CPU step leaves CUDA untouched and the kernel can still fork ranks).

    Returns:
        A :class:`Profile`.

    Raises:
        ValueError: ``steps`` below 1 or ``warmup`` below 0, or ``cuda=True``
            where no GPU is visible.

    Example:
        >>> report = profile_steps(lambda: model(x).sum().backward())  # doctest: +SKIP
        >>> report.top[0].name                                          # doctest: +SKIP
        'aten::convolution_backward'
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..env import visible_gpu_count

    # Kineto, the profiler's engine, logs an error per run on a machine without a
    # GPU ("gpuGetDeviceCount failed"): noise in a learner's cell. A level the user
    # set wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    if steps < 1 or warmup < 0:
        raise ValueError(
            f"profile_steps needs steps >= 1 and warmup >= 0, got steps={steps} and "
            f"warmup={warmup}; pass steps=3, warmup=1 for example"
        )
    if not (cuda is None or isinstance(cuda, bool)):
        raise ValueError(f"cuda={cuda!r}: pass True, False or None (decide)")
    # Asking NVML, not CUDA, whether there is a GPU keeps a notebook kernel forkable.
    if cuda and visible_gpu_count() == 0:
        raise ValueError(
            "cuda=True but no CUDA GPU is visible here; pass cuda=None to record "
            "the CPU alone"
        )
    for _ in range(warmup):
        step()
    # A step that ran on the GPU has initialised CUDA; one on the CPU has not, and
    # synchronising or recording CUDA for it would start CUDA in this process.
    gpu = torch.cuda.is_initialized() if cuda is None else cuda
    activities = [ProfilerActivity.CPU]
    if gpu:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(steps):
            step()
        if gpu:
            torch.cuda.synchronize()
    averages = prof.key_averages()
    # torch 2.4 renamed the "cuda" timings "device"; older releases know only "cuda".
    device_key = "self_device_time_total"
    if averages and not hasattr(averages[0], device_key):
        device_key = "self_cuda_time_total"
    # By GPU time when the GPU did the work; a CPU step recorded beside an idle GPU
    # (CUDA was in use for something else) has none, so it goes by CPU time.
    gpu_work = gpu and any(getattr(e, device_key, 0) > 0 for e in averages)
    sort_by = device_key if gpu_work else "self_cpu_time_total"
    ranked = sorted(averages, key=lambda e: getattr(e, sort_by, 0), reverse=True)
    top = [
        OperatorCost(
            name=e.key,
            calls=e.count,
            self_cpu_ms=e.self_cpu_time_total / 1000,
            self_device_ms=getattr(e, device_key, 0) / 1000,
        )
        for e in ranked[:row_limit]
    ]
    trace = None
    if trace_dir is not None:
        directory = Path(trace_dir)
        directory.mkdir(parents=True, exist_ok=True)
        trace = directory / f"step_profile_{os.getpid()}.pt.trace.json"
        prof.export_chrome_trace(str(trace))
    return Profile(
        activities=["CPU", "CUDA"] if gpu else ["CPU"],
        steps=steps,
        top=top,
        table=averages.table(sort_by=sort_by, row_limit=row_limit),
        trace=trace,
    )


_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# tensorboard_trace_handler's name: <worker>.<time>.pt.trace.json[.gz], where the
# worker is "<host>_<pid>" unless given; the time is in ms (torch 2.4) or ns.
_HANDLER_NAME = re.compile(
    r"^(?P<worker>.+)\.(?P<time>\d+)\.pt\.trace\.json(?P<gz>\.gz)?$"
)


def quiet_profiler() -> None:
    """Silence Kineto's log lines and torch's "Profiler clears events" warning (what
    a schedule is for) in a notebook cell; call it before the first profiler. A
    ``KINETO_LOG_LEVEL`` you set yourself is kept."""
    import warnings

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    warnings.filterwarnings("ignore", message=r".*Profiler clears events")


def recorded_steps(
    steps: int,
    *,
    wait: int,
    warmup: int,
    active: int,
    repeat: int = 0,
    skip_first: int = 0,
) -> list[int]:
    """The steps (0, 1, ... ``steps`` - 1; the trace's ``ProfilerStep#s``) that
    ``torch.profiler.schedule`` records.

    Args:
        steps: how many steps the loop runs.
        wait, warmup, active, repeat, skip_first: as given to ``schedule``.

    Returns:
        The recorded steps, in order.

    Raises:
        ValueError: a negative value, ``active`` below 1, or a value that is not a
            whole number.

    Example:
        >>> recorded_steps(12, wait=1, warmup=1, active=3, repeat=2)
        [2, 3, 4, 7, 8, 9]
    """
    counts = {"steps": steps, "wait": wait, "warmup": warmup, "repeat": repeat}
    for name, value in (counts | {"skip_first": skip_first}).items():
        whole(name, value, 0)
    whole("active", active, 1)
    cycle = wait + warmup + active
    recorded = []
    for step in range(skip_first, steps):
        k = step - skip_first
        if repeat and k // cycle >= repeat:
            break
        if k % cycle >= wait + warmup:
            recorded.append(step)
    return recorded


def trace_files(folder: str | os.PathLike) -> list[Path]:
    """The trace files in ``folder`` (``*.pt.trace.json``, gzipped or not), in the
    order they were written.

    Raises:
        ValueError: ``folder`` is not a directory.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(
            f"{root} is not a folder; pass the folder given to "
            "tensorboard_trace_handler"
        )
    found = [*root.glob("*.pt.trace.json"), *root.glob("*.pt.trace.json.gz")]

    def written(path: Path) -> tuple[int, float, str]:
        match = _HANDLER_NAME.match(path.name)
        return (int(match["time"]) if match else 0, path.stat().st_mtime, path.name)

    return sorted(found, key=written)


def trace_steps(path: str | os.PathLike) -> list[int]:
    """The step numbers a trace file recorded (its ``ProfilerStep#N`` events), sorted.

    Raises:
        ValueError: the file is not a trace (not JSON, or no ``traceEvents``).
    """
    import gzip

    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path} is not a torch.profiler trace (JSON with 'traceEvents'): {e}"
        ) from e
    steps = set()
    for event in events:
        match = _STEP.match(str(event.get("name", "")))
        if match:
            steps.add(int(match[1]))
    return sorted(steps)


def stable_trace_name(path: str | os.PathLike) -> str:
    """A trace file's name with the default worker name ``<host>_<pid>`` and the
    time replaced (they change from run to run); other names as they are.

    Example:
        >>> stable_trace_name("log/node7_4242.1795661088284050921.pt.trace.json")
        'HOST_PID.TIME.pt.trace.json'
    """
    name = Path(path).name
    match = _HANDLER_NAME.match(name)
    if not match:
        return name
    worker = match["worker"]
    if re.fullmatch(r".+_\d+", worker):
        worker = "HOST_PID"
    return f"{worker}.TIME.pt.trace.json{match['gz'] or ''}"
