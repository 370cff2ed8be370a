"""Profile training steps with ``torch.profiler``: which operators cost the most, and a
trace file to open in Perfetto (https://ui.perfetto.dev) or TensorBoard.

Used by notebook 01, section 6::

    report = workshop.training.profile_steps(one_step, steps=3, trace_dir="traces")
    print(report.table)

Over a long training loop: which steps a ``schedule`` records, and what
``tensorboard_trace_handler`` wrote. :func:`profile_steps` profiles a few steps in one
go. In a real training loop the profiler runs inside the loop, ``prof.step()`` marks
each step, and ``schedule(wait=, warmup=, active=, repeat=)`` picks the steps to record:
each cycle skips ``wait`` steps, runs ``warmup`` steps with the profiler on but the
results dropped, records ``active`` steps, and hands them to ``on_trace_ready``.
Used by notebook 05, section 5::

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
        activities: what was recorded ("CPU", and "CUDA" when the step used the
            GPU).
        steps: how many steps were recorded (after the warm-up).
        top: the costliest operators, most expensive first, as plain data.
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
    """Run ``step`` ``warmup + steps`` times and profile the last ``steps`` runs.

    The warm-up steps run first, unrecorded: the first step of a model pays one-off
    costs (memory allocation, kernel selection) that would mislead the table.

    GPU work is recorded when the step uses the GPU: by default, when CUDA is in
    use in this process once the warm-up has run. A step on the CPU of a GPU node
    is then profiled on the CPU alone, and CUDA stays untouched, so a notebook
    kernel can still fork ranks afterwards.

    Args:
        step: one training step (forward, backward, optimizer step), no arguments.
        steps: steps recorded.
        warmup: steps run before recording.
        trace_dir: where to write the trace (a ``.pt.trace.json`` file that Perfetto
            and TensorBoard's profiler plugin open); no trace when omitted.
        row_limit: operators kept in ``top`` and ``table``.
        cuda: record GPU work too (True), or not (False); None decides from
            whether CUDA is in use after the warm-up (pass True for a step that
            first touches the GPU with ``warmup=0``).

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
    """Keep two kinds of noise out of a notebook cell that profiles with a schedule:
    Kineto's log lines (an error per run on a machine without a GPU,
    "gpuGetDeviceCount failed") and torch's warning, from 2.5 on, that each cycle's
    events are cleared once its trace is written (what a schedule is for).

    Call it before the first profiler of the process. A ``KINETO_LOG_LEVEL`` you set
    yourself is kept.
    """
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
    """The steps (0, 1, ... ``steps`` - 1) that ``torch.profiler.schedule`` records.

    Step ``s`` is the work between the ``s``-th and the ``s+1``-th ``prof.step()``
    call; the trace names it ``ProfilerStep#s``. After ``skip_first`` steps, cycles
    of ``wait + warmup + active`` steps follow, the last ``active`` of each recorded;
    ``repeat`` cycles at most (0: as many as the loop runs).

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
    whole("steps", steps, 0)
    for name, value in (
        ("wait", wait),
        ("warmup", warmup),
        ("repeat", repeat),
        ("skip_first", skip_first),
    ):
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
    """A trace file's name with what changes from run to run replaced: the default
    worker name ``<host>_<pid>`` and the time, e.g.
    ``HOST_PID.TIME.pt.trace.json``; other names are returned as they are.

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
