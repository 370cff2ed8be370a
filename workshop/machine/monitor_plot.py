"""The picture of a monitored run, drawn from plain data (:class:`Sample` s, step
times, named phases): a cell's recording, a batch job's CSV, or numbers typed in."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..draw.diagrams import HEIGHT_IN, WIDTH_IN

__all__ = [
    "COLUMNS",
    "PANELS",
    "Sample",
    "load_samples",
    "plot_monitor",
    "save_samples",
    "step_gaps",
]

#: Panel titles, in the order drawn (the GPU panels only with GPU values).
PANELS = {
    "steps": "time per training step, ms (ticks: the steps)",
    "gpu": "GPU utilisation, %",
    "gpu_memory": "GPU memory in use, GiB",
    "cpu": "CPU busy, % of all cores",
    "memory": "host memory in use, GiB",
    "io": "disk reads and network, MB/s",
}
_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9"]
_FONT = {"font.size": 10, "axes.titlesize": 10.5, "legend.fontsize": 9.5}
_LEGEND = {"frameon": False, "handlelength": 1.5, "columnspacing": 1.0}
# The lines drawn from each sample: (panel, Sample field, colour, label).
_LINES = [
    ("cpu", "cpu_percent", "0.35", "whole machine"),
    ("cpu", "process_cpu_percent", _COLOURS[0], "this process + children"),
    ("memory", "memory_gib", _COLOURS[2], "in use"),
    ("io", "disk_read_mb_s", _COLOURS[3], "disk read"),
    ("io", "network_mb_s", _COLOURS[4], "network in+out"),
]
# Past this many steps, one line per step in every panel is a grey wall.
_MAX_STEP_LINES = 150


@dataclass(frozen=True)
class Sample:
    """One sample of the machine: averages over the interval that ended at ``time``.

    Attributes:
        time: seconds since the monitor started.
        cpu_percent: CPU busy, in % of all cores together, whatever ran.
        process_cpu_percent: the monitored process's (and its children's) CPU time,
            in % of all cores.
        memory_gib: host memory in use (total less available).
        disk_read_mb_s, network_mb_s: MB/s (10**6 bytes) read from disks, and
            received and sent over the network.
        gpu_percent: per GPU, NVML's utilisation; empty without GPUs.
        gpu_memory_gib: per GPU, memory in use; empty without GPUs.
    """

    time: float
    cpu_percent: float
    process_cpu_percent: float
    memory_gib: float
    disk_read_mb_s: float
    network_mb_s: float
    gpu_percent: tuple[float, ...] = ()
    gpu_memory_gib: tuple[float, ...] = ()

    def with_gpus(
        self, percent: Sequence[float], memory_gib: Sequence[float]
    ) -> Sample:
        """This sample with GPU values added."""
        return dataclasses.replace(
            self, gpu_percent=tuple(percent), gpu_memory_gib=tuple(memory_gib)
        )


def _check(samples: Sequence[Sample], steps: Sequence[float], phases) -> None:
    if not samples:
        raise ValueError(
            "no samples to draw: the recording ended before its first interval; "
            "record for longer, or pass a smaller Monitor(interval=...)"
        )
    times = [s.time for s in samples]
    for name, values in (("sample times", times), ("steps", list(steps))):
        if any(b < a for a, b in itertools.pairwise(values)):
            raise ValueError(
                f"the {name} are not in time order (first values {values[:5]}); "
                "pass them as recorded, earliest first"
            )
    for phase in phases:
        if len(phase) != 3 or not phase[1] <= phase[2]:
            raise ValueError(
                f"phase {phase!r} is not (name, start, end) with start <= end"
            )


def plot_monitor(
    samples: Sequence[Sample],
    steps: Sequence[float] = (),
    phases: Sequence[tuple[str, float, float]] = (),
    title: str = "",
):
    """Panels over time: step times, (GPU utilisation and memory,) CPU, host memory,
    disk reads and network; phases shaded, steps as thin lines.

    Args:
        samples: the samples, earliest first.
        steps: seconds at which each step ended, earliest first.
        phases: (name, start, end) in seconds: named stretches, shaded.

    Returns:
        The matplotlib Figure, whole on a 1280x720 projector.

    Raises:
        ValueError: no samples, samples or steps out of time order, or a phase that
            is not (name, start, end).

    Example:
        >>> fig = plot_monitor([Sample(0.2, 50.0, 40.0, 3.1, 0.0, 0.1)], steps=[0.1])
        >>> [ax.get_title(loc="left") for ax in fig.axes][:2]
        ['time per training step, ms (ticks: the steps)', 'CPU busy, % of all cores']
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    _check(samples, steps, phases)
    gpus = max(len(s.gpu_percent) for s in samples)
    names = ["steps", "gpu", "gpu_memory"] if gpus else ["steps"]
    names += ["cpu", "memory", "io"]
    t = [s.time for s in samples]
    end = max([t[-1], *steps[-1:], *(p[2] for p in phases)])
    with plt.rc_context(_FONT):
        shape = dict(sharex=True, layout="constrained", squeeze=False)
        fig, grid = plt.subplots(
            2, len(names) // 2, figsize=(WIDTH_IN, HEIGHT_IN), **shape
        )
        axes = dict(zip(names, grid.flat, strict=True))
        for name, ax in axes.items():
            ax.set_title(PANELS[name], loc="left")
            ax.grid(True, alpha=0.35)
            ax.set_xlim(0, end * 1.01 if end > 0 else 1)
            for i, (_, start, stop) in enumerate(phases):
                ax.axvspan(start, stop, color=_COLOURS[i % 6], alpha=0.12, lw=0)
            if name != "steps" and len(steps) <= _MAX_STEP_LINES:
                where = ax.get_xaxis_transform()
                ax.vlines(steps, 0, 1, transform=where, color="0.55", lw=0.6, alpha=0.6)
        _draw_steps(axes["steps"], steps, phases)
        for panel, name, colour, label in _LINES:
            values = [getattr(s, name) for s in samples]
            axes[panel].plot(t, values, color=colour, lw=1.8, label=label)
        # Each legend above the data: the axes reach past the data's top (CPU to
        # 135 %, ticks to 100 %) so that no line runs under a legend. Three
        # panels a row (with GPUs) leave room for one name a row only.
        rows = 2 if gpus else 1
        axes["cpu"].set_ylim(0, 135 if rows == 1 else 170)
        axes["cpu"].set_yticks([0, 50, 100])
        axes["memory"].set_ylim(0, max(s.memory_gib for s in samples) * 1.15 or 1)
        io = axes["io"]
        io.set_ylim(0, (1.45 if rows == 1 else 1.9) * max(io.get_ylim()[1], 1e-3))
        for panel in ("cpu", "io"):
            axes[panel].legend(loc="upper right", ncols=3 - rows, **_LEGEND)
        if gpus:
            _draw_gpus(axes["gpu"], axes["gpu_memory"], samples, gpus)
        for ax in grid[-1]:
            ax.set_xlabel("seconds since the monitor started")
        note = "" if gpus else "no GPU here: GPU panels not drawn"
        heading = "  -  ".join(part for part in (title, note) if part)
        if heading:
            fig.suptitle(heading, fontsize=11)
        if phases:
            patches = [
                Patch(color=_COLOURS[i % 6], alpha=0.3, label=name)
                for i, (name, _, _) in enumerate(phases)
            ]
            where = "outside lower center"
            fig.legend(handles=patches, loc=where, ncols=len(patches), frameon=False)
    plt.close(fig)  # shown once by the notebook's display of the return value
    return fig


def step_gaps(
    steps: Sequence[float], phases: Sequence[tuple[str, float, float]] = ()
) -> list[tuple[float, float]]:
    """(time, seconds since the step before) for each step; a phase's first step
    counts from the phase's start, and a first step outside any phase is left out.

    Example:
        >>> step_gaps([1.0, 1.5, 5.0, 5.25], [("a", 0.5, 2), ("b", 4.5, 6)])
        [(1.0, 0.5), (1.5, 0.5), (5.0, 0.5), (5.25, 0.25)]
    """
    gaps = []
    previous = None
    for t in steps:
        start = next((p[1] for p in phases if p[1] <= t <= p[2]), None)
        since = [v for v in (previous, start) if v is not None and v <= t]
        if since:
            gaps.append((t, t - max(since)))
        previous = t
    return gaps


def _draw_steps(ax, steps: Sequence[float], phases) -> None:
    gaps = step_gaps(steps, phases)
    ax.plot(
        [t for t, _ in gaps], [1000 * g for _, g in gaps], "o", color="black", ms=3.5
    )
    # One tick per step along the bottom: gaps between ticks are time not training.
    bottom = ax.get_xaxis_transform()
    ax.plot(steps, [0.03] * len(steps), "|", color="black", ms=8, transform=bottom)
    # A phase's first step also pays one-time costs (workers starting, a first
    # batch): scale to the others and mark a taller one at the top with its value.
    firsts = {_first_in_phase(t, steps, phases) for t in steps} - {None}
    usual = [1000 * g for t, g in gaps if t not in firsts]
    usual = usual or [1000 * g for _, g in gaps]
    top = 1.3 * max(usual, default=1.0) or 1.0
    ax.set_ylim(0, top)
    for t, g in gaps:
        if 1000 * g > top:
            ax.plot([t], [top], "^", color="black", ms=6, clip_on=False)
            label = dict(xytext=(4, -12), textcoords="offset points", fontsize=9)
            ax.annotate(f"{1000 * g:.0f}", (t, top), **label)
    if not steps:
        ax.text(0.5, 0.5, "no steps marked", transform=ax.transAxes, ha="center")


def _first_in_phase(t: float, steps: Sequence[float], phases) -> float | None:
    """``t`` if it is the first step of a phase, else None."""
    for _, start, end in phases:
        if start <= t <= end:
            inside = [v for v in steps if start <= v <= end]
            return t if inside and inside[0] == t else None
    return None


def _draw_gpus(util_ax, mem_ax, samples: Sequence[Sample], gpus: int) -> None:
    for g in range(gpus):
        # A sample whose query failed has NaN (a gap in the line), or no values.
        have = [s for s in samples if len(s.gpu_percent) > g]
        label = f"GPU {g}" if gpus <= 8 else None
        colour = _COLOURS[g % 6]
        for ax, field in ((util_ax, "gpu_percent"), (mem_ax, "gpu_memory_gib")):
            values = [getattr(s, field)[g] for s in have]
            ax.plot([s.time for s in have], values, color=colour, lw=1.8, label=label)
    memory = [v for s in samples for v in s.gpu_memory_gib if not math.isnan(v)]
    mem_ax.set_ylim(0, max(memory, default=1.0) * 1.15 or 1)
    if 1 < gpus <= 8:
        # A row of names above 100 %, as in the CPU panel (two rows past 4 GPUs).
        util_ax.set_ylim(0, 135 if gpus <= 4 else 160)
        util_ax.set_yticks([0, 50, 100])
        util_ax.legend(loc="upper right", ncols=min(gpus, 4), **_LEGEND)
    else:
        util_ax.set_ylim(0, 105)


#: The CSV header of :func:`save_samples`: the fields of :class:`Sample`.
COLUMNS = [f.name for f in dataclasses.fields(Sample)]


def save_samples(samples: Sequence[Sample], path: str | Path) -> None:
    """Write samples to ``path`` as CSV (replaced): a row per sample, GPU values
    joined by ``;``.

    Example:
        >>> save_samples(mon.samples, "monitor.csv")  # doctest: +SKIP
    """
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for s in samples:
            writer.writerow(sample_row(s))


def sample_row(sample: Sample) -> list[str]:
    """One CSV row of :func:`save_samples` (strings, in the order of COLUMNS)."""
    values = []
    for name in COLUMNS:
        value = getattr(sample, name)
        if isinstance(value, tuple):
            values.append(";".join(f"{v:.3f}" for v in value))
        else:
            values.append(f"{value:.3f}")
    return values


def load_samples(path: str | Path) -> list[Sample]:
    """Read samples written by :func:`save_samples` or ``python -m workshop monitor``.

    Raises:
        ValueError: the file is not such a CSV (the message names the header found).

    Example:
        >>> plot_monitor(load_samples("monitor.csv"))  # doctest: +SKIP
    """
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != COLUMNS:
        found = rows[0] if rows else "an empty file"
        raise ValueError(
            f"{path} is not a monitor CSV: its header is {found}, not {COLUMNS}; "
            "write it with save_samples() or `python -m workshop monitor --output`"
        )
    samples = []
    for row in rows[1:]:
        values = dict(zip(COLUMNS, row, strict=True))
        gpu = {
            k: tuple(float(v) for v in values.pop(k).split(";") if v)
            for k in ("gpu_percent", "gpu_memory_gib")
        }
        samples.append(Sample(**{k: float(v) for k, v in values.items()}, **gpu))
    return samples
