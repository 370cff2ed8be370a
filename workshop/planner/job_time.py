"""A planned job's step time beside the estimate made from the calibrated machine
(:func:`job_step_time`, printed by :func:`job_time_against_estimate`)::

    cal = calibrate()
    job = write_job("tiny", Layout(dp=2, micro_batch=256, precision="fp32"),
                    "runs/timed", nodes=2, gpus_per_node=0, ranks_per_node=1,
                    steps=10)
    workshop.cluster.submit(job.script, output_dir=job.folder).wait()
    print(job_time_against_estimate(job_figures(job), cal))
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from .calibration import calibration_from
from .estimator import estimate
from .layout import Layout, ModelShape

if TYPE_CHECKING:
    from .calibration import Calibration

__all__ = ["job_step_time", "job_time_against_estimate"]


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _timed_steps(fig: dict[str, Any], key: str = "step_s") -> list[float]:
    """A rank's timed steps less the last, which ran under the dispatch mode that
    counts collectives (a Python call per operation it would not otherwise make);
    the last alone when it is the only one. ``key``: "step_s" (wall clock) or
    "step_cpu_s" (the rank's CPU time)."""
    times = fig.get(key)
    if not times:
        raise ValueError(
            f"rank {fig.get('rank')}'s figures have no {key}: written by an older "
            "job_train; run the job again"
        )
    return times[:-1] if len(times) > 1 else times


def _clock_key(figures: list[dict[str, Any]], calibration: Calibration) -> str:
    """The times to set beside the estimate: a CPU calibration is timed in CPU
    time, so the ranks' CPU time where they recorded it; else the wall clock."""
    cpu = calibration.device == "cpu" and all(f.get("step_cpu_s") for f in figures)
    return "step_cpu_s" if cpu else "step_s"


def job_step_time(
    figures: list[dict[str, Any]], calibration: Calibration | None = None
) -> dict[str, Any]:
    """The job's measured step beside :func:`~workshop.planner.estimator.estimate`
    of its layout on the calibrated machine; without ``calibration``, on each rank's
    own (``write_job(..., calibrate=True)``), the slowest rank's estimate kept.

    A rank's step is the median of its timed steps, the job's the slowest rank's. A
    CPU job is timed in CPU time, which another process's load does not stretch; the
    wall time is returned beside it.

    Returns:
        ``{"measured_s", "per_rank_s", "wall_s", "clock" ("cpu" or "wall"),
        "timed_steps", "estimate_s", "ratio" (estimate / measured), "estimate",
        "calibration", "threads"}``.

    Raises:
        ValueError: no figures, figures without step times, or no calibration
            given and none in the figures.
    """
    if not figures:
        raise ValueError("job_step_time needs the ranks' figures: job_figures(job)")
    first = figures[0]
    if calibration is None:
        own = [f.get("calibration") for f in figures]
        if not all(own):
            raise ValueError(
                "job_step_time: no calibration given and the job's ranks measured "
                "none; write the job with calibrate=True, or pass calibrate()'s"
            )
        paths = [f"rank {f['rank']}'s figures" for f in figures]
        found = [
            job_step_time(figures, calibration_from(data, path))
            for data, path in zip(own, paths, strict=True)
        ]
        return max(found, key=lambda f: f["estimate_s"])
    per_node = sum(1 for f in figures if f["node"] == first["node"]) or 1
    key = _clock_key(figures, calibration)
    per_rank = [statistics.median(_timed_steps(f, key)) for f in figures]
    wall = max(statistics.median(_timed_steps(f)) for f in figures)
    est = estimate(
        ModelShape(**first["model"]),
        Layout(**first["layout"]),
        gpu=calibration.gpu(),
        network=calibration.network(),
        gpus_per_node=per_node,
        optimizer="pytorch",  # the job's loop: torch.optim.Adam, zero_grad, DDP
    )
    measured = max(per_rank)
    threads = {f.get("threads") for f in figures}
    return {
        "measured_s": measured,
        "per_rank_s": per_rank,
        "wall_s": wall,
        "clock": "cpu" if key == "step_cpu_s" else "wall",
        "timed_steps": len(_timed_steps(first)),
        "estimate_s": est.step,
        "ratio": est.step / measured,
        "estimate": est,
        "calibration": calibration,
        "threads": threads.pop() if len(threads) == 1 else sorted(threads, key=str),
    }


def job_time_against_estimate(
    figures: list[dict[str, Any]], calibration: Calibration | None = None
) -> str:
    """:func:`job_step_time` as a table of 88 columns: the measured step, the
    calibrated estimate and its parts, and estimate / measured.

    Raises:
        ValueError: as :func:`job_step_time`.

    Example:
        >>> cal = Calibration.load("calibration.json")           # doctest: +SKIP
        >>> print(job_time_against_estimate(job_figures(job), cal))  # doctest: +SKIP
    """
    found = job_step_time(figures, calibration)
    est, first = found["estimate"], figures[0]
    own = calibration is None
    calibration = found["calibration"]
    threads = found["threads"]
    lines = [
        f"{first['model']['name']}, {est.layout.describe()}: step time on "
        f"{_count(len(figures), 'rank')} ({first['backend']}"
        + (f", {_count(threads, 'thread')} each" if isinstance(threads, int) else "")
        + ")",
        (
            "  estimate from the calibration each rank made before its steps "
            if own
            else f"  estimate from {calibration.name} "
        )
        + f"({calibration.precision}, {_count(calibration.threads, 'thread')})",
        f"  measured: median of {found['timed_steps']} timed steps per rank, "
        f"{'CPU' if found['clock'] == 'cpu' else 'wall'} time, slowest rank: "
        + ", ".join(f"{t * 1e3:.1f}" for t in found["per_rank_s"])
        + " ms",
        f"  {'':<28}{'ms':>10}",
    ]
    parts = est.parts or {k: v for k, v in est.time.items() if v}
    for name, seconds in parts.items():
        lines.append(f"  {'estimate: ' + name:<28}{seconds * 1e3:>10.1f}")
    lines += [
        f"  {'estimate: step':<28}{found['estimate_s'] * 1e3:>10.1f}",
        f"  {'measured: step':<28}{found['measured_s'] * 1e3:>10.1f}"
        + (
            f"  (wall clock {found['wall_s'] * 1e3:.1f})"
            if found["clock"] == "cpu"
            else ""
        ),
        f"  {'estimate / measured':<28}{found['ratio']:>10.2f}",
    ]
    return "\n".join(line[:88] for line in lines)
