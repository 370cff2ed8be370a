"""``torch.profiler`` over a long training loop: which steps a ``schedule`` records,
and what ``tensorboard_trace_handler`` wrote.

:func:`workshop.training.profile_steps` (notebook 01) profiles a few steps in one
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
from pathlib import Path

__all__ = [
    "quiet_profiler",
    "recorded_steps",
    "stable_trace_name",
    "trace_files",
    "trace_steps",
]

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


def _whole(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")


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
    _whole("steps", steps, 0)
    for name, value in (
        ("wait", wait),
        ("warmup", warmup),
        ("repeat", repeat),
        ("skip_first", skip_first),
    ):
        _whole(name, value, 0)
    _whole("active", active, 1)
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
