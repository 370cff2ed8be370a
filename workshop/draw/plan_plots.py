"""Pictures of a layout plan: memory per GPU against the GPU's capacity, and the step
time split into compute, communication on each mesh dimension, and the bubble.

Drawn from the planner's ``Estimate`` read as plain data, without importing the
planner, so a saved estimate draws the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .diagrams import HEIGHT_IN, WIDTH_IN
from .plots import COLOURS, FONT

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "MAX_LAYOUTS",
    "MEMORY_TERMS",
    "TIME_TERMS",
    "layout_label",
    "plot_layouts",
    "plot_plan",
]

#: The memory terms an estimate holds, bottom to top of a bar.
MEMORY_TERMS = ("parameters", "gradients", "optimizer", "activations", "buffers")
#: The time terms, bottom to top.
TIME_TERMS = ("compute", "dp comm", "tp comm", "pp comm", "bubble")
_MEMORY_COLOURS = dict(
    zip(MEMORY_TERMS, [COLOURS[i] for i in (0, 1, 2, 5, 4)], strict=True)
)
_TIME_COLOURS = dict(
    zip(TIME_TERMS, [*(COLOURS[i] for i in (0, 1, 4, 5)), "0.72"], strict=True)
)
# The framework's bytes: a diamond, in the legend as on the bar.
_DIAMOND = {"marker": "D", "ms": 9, "mec": "black", "mew": 1.2, "ls": "none"}
_OVER, _FITS = COLOURS[3], "0.3"  # vermillion when over capacity, dark grey when not
MAX_LAYOUTS = 6  #: layouts plot_layouts shows side by side on a projector
GB = 1e9


def _terms(
    values: Any, known: Sequence[str], what: str, owner: str
) -> dict[str, float]:
    """``values`` as {term: finite value >= 0}, only known terms; a clear error else."""
    if not isinstance(values, Mapping):
        raise ValueError(
            f"{owner}: {what} must be a dict {{term: value}} with terms among "
            f"{list(known)}; got {type(values).__name__}"
        )
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ValueError(
            f"{owner}: {what} has terms {unknown} that are not among {list(known)}"
        )
    checked = {}
    for key, value in values.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value >= 0)
        ):
            raise ValueError(
                f"{owner}: {what}[{key!r}] = {value!r}; every term must be a finite "
                "number, 0 or more"
            )
        checked[key] = float(value)
    return checked


def _read(estimate: Any, owner: str) -> tuple[dict, dict, float, float, str]:
    """(memory, time, step, capacity, GPU name) of an estimate, checked."""
    try:
        memory, time, step = estimate.memory, estimate.time, estimate.step
        capacity, gpu = estimate.gpu.memory_bytes, estimate.gpu.name
    except AttributeError as error:
        raise ValueError(
            f"{owner} draws a planner estimate "
            "(workshop.planner.estimator.Estimate: "
            f"memory, time, step, gpu); got {type(estimate).__name__}: {error}"
        ) from error
    memory = _terms(memory, MEMORY_TERMS, "estimate.memory", owner)
    time = _terms(time, TIME_TERMS, "estimate.time", owner)
    for name, value in (("step", step), ("gpu.memory_bytes", capacity)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value > 0)
        ):
            raise ValueError(f"{owner}: estimate.{name} = {value!r} must be above 0")
    return memory, time, float(step), float(capacity), str(gpu)


def _time_unit(seconds: float) -> tuple[float, str]:
    return (1.0, "s") if seconds >= 1 else (1e3, "ms")


def layout_label(layout: Any) -> str:
    """A short two-line name of a layout, dp x tp x pp over the ZeRO stage.

    Example:
        >>> from types import SimpleNamespace
        >>> layout_label(SimpleNamespace(dp=64, tp=8, pp=2, zero=3))
        '64x8x2\\nZeRO-3'
    """
    stage = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}.get(
        getattr(layout, "zero", 0), "DDP"
    )
    return f"{layout.dp}x{layout.tp}x{layout.pp}\n{stage}"


def _stack(
    ax: Axes,
    x: float,
    values: dict[str, float],
    order: Sequence[str],
    colours: dict[str, str],
    scale: float,
    width: float,
    labelled: set[str],
) -> list[float]:
    """Stack ``values`` at ``x`` in ``order``; the bottom of each term, scaled."""
    bottom, bottoms = 0.0, []
    for term in order:
        height = values.get(term, 0.0) * scale
        bottoms.append(bottom)
        label = term if term not in labelled and height > 0 else None
        if label:
            labelled.add(term)
        ax.bar(
            x,
            height,
            width,
            bottom=bottom,
            color=colours[term],
            label=label,
            edgecolor="white",
            lw=0.8,
            hatch="//" if term == "bubble" else None,
        )
        bottom += height
    return bottoms


def _beside_the_bar(ax: Any, handles: list, labels: list) -> None:
    """One bar at the left of ``ax``, its legend to the right of it, top term first."""
    ax.legend(handles[::-1], labels[::-1], loc="center left",
              bbox_to_anchor=(0.33, 0.5), fontsize=12, framealpha=0.9)  # fmt: skip
    ax.set_xlim(-0.45, 2.4)
    ax.set_xticks([0], ["estimate"])


def plot_plan(
    estimate: Any, fake: Mapping[str, float] | None = None, title: str = ""
) -> Figure:
    """One layout's plan: memory per GPU (left) and one step's time (right).

    Left: the memory terms of one GPU stacked against its capacity (vermillion when
    over); with ``fake``, the framework's bytes per term as a diamond beside the bar
    (on the segment's top edge when the two agree). Right: the time terms stacked,
    with the step (only what does not overlap) as a dashed line.

    Args:
        estimate: the planner's ``Estimate`` (memory and time by term, step, gpu).
        fake: the framework's bytes per term on one GPU (the fake-backend run),
            ``{"parameters": ..., "gradients": ..., "optimizer": ...}``.
        title: the figure's title; by default the model, layout and GPU.

    Returns:
        The Figure, whole on a 1280x720 projector; closed in pyplot.

    Raises:
        ValueError: an estimate without memory/time/step/gpu, a term outside
            :data:`MEMORY_TERMS` / :data:`TIME_TERMS`, a negative or non-finite
            value, or a ``fake`` term that is not a memory term.

    Example:
        >>> fig = plot_plan(estimate, fake={"parameters": 2.0e9})  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    memory, time, step, capacity, gpu = _read(estimate, "plot_plan")
    measured = {} if fake is None else _terms(fake, MEMORY_TERMS, "fake", "plot_plan")
    total = sum(memory.values())
    scale_t, unit = _time_unit(max(step, sum(time.values())))
    with plt.rc_context(FONT):
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        bottoms = _stack(
            left, 0, memory, MEMORY_TERMS, _MEMORY_COLOURS, 1 / GB, 0.5, set()
        )
        marks = [0.0]  # where each framework diamond sits, in GB
        for term, bottom in zip(MEMORY_TERMS, bottoms, strict=True):
            if term in measured:
                marks.append(bottom + measured[term] / GB)
                left.plot(0.38, marks[-1], color=_MEMORY_COLOURS[term], **_DIAMOND)
        over = total > capacity
        colour = _OVER if over else _FITS
        left.axhline(capacity / GB, color=colour, lw=2.5, ls="-")
        verdict = (
            f"over by {(total - capacity) / GB:.1f} GB"
            if over
            else f"{total / capacity:.0%} used"
        )
        left.set_title(
            f"Memory per GPU: {total / GB:.1f} GB, {verdict}",
            color=_OVER if over else "black",
        )
        handles, labels = left.get_legend_handles_labels()
        handles.append(Line2D([], [], color=colour, lw=2.5))
        labels.append(f"{gpu}: {capacity / GB:g} GB")
        if measured:
            handles.append(Line2D([], [], color="white", **_DIAMOND))
            labels.append("framework (fake backend)")
        _beside_the_bar(left, handles, labels)
        left.set_ylim(0, 1.12 * max(total / GB, capacity / GB, *marks))
        left.set_ylabel("GB per GPU")

        _stack(right, 0, time, TIME_TERMS, _TIME_COLOURS, scale_t, 0.5, set())
        step_label = f"step: {step * scale_t:.3g} {unit}"
        right.axhline(step * scale_t, color="black", lw=2, ls="--", label=step_label)
        handles, labels = right.get_legend_handles_labels()
        _beside_the_bar(right, handles, labels)
        right.set_ylim(0, 1.12 * max(step, sum(time.values())) * scale_t)
        right.set_ylabel(f"time per step ({unit})")
        right.set_title("One step, term by term")
        for ax in (left, right):
            ax.grid(True, axis="y", alpha=0.4)
        layout = getattr(estimate, "layout", None)
        model = getattr(getattr(estimate, "model", None), "name", "")
        where = layout.describe() if hasattr(layout, "describe") else ""
        fig.suptitle(title or f"{model} {where} on {gpu}".strip())
    plt.close(fig)  # shown once, as the cell's value
    return fig


def plot_layouts(
    estimates: Sequence[Any], labels: Sequence[str] | None = None, title: str = ""
) -> Figure:
    """Several layouts side by side: memory per GPU against capacity (left) and step
    time with the step as a black tick (right).

    Args:
        estimates: 1 to :data:`MAX_LAYOUTS` planner estimates.
        labels: a short name per layout; by default :func:`layout_label`'s
            ``"64x8x2\\nZeRO-3"`` (dp x tp x pp, then the ZeRO stage).
        title: the figure's title.

    Returns:
        The Figure, whole on a 1280x720 projector; closed in pyplot.

    Raises:
        ValueError: no estimate, more than :data:`MAX_LAYOUTS`, labels that do not
            match them one to one, or an estimate :func:`plot_plan` would refuse.

    Example:
        >>> fig = plot_layouts([fsdp, tp_pp])                      # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if isinstance(estimates, (str, bytes)) or not isinstance(estimates, Sequence):
        raise ValueError(
            f"plot_layouts takes a list of estimates, got {type(estimates).__name__}"
        )
    if not 1 <= len(estimates) <= MAX_LAYOUTS:
        raise ValueError(
            f"plot_layouts draws 1 to {MAX_LAYOUTS} layouts to fit a projector; got "
            f"{len(estimates)}: compare fewer at a time"
        )
    read = [_read(e, f"plot_layouts (estimate {i})") for i, e in enumerate(estimates)]
    default = labels is None
    if labels is None:
        labels = [
            layout_label(e.layout) if hasattr(e, "layout") else f"layout {i}"
            for i, e in enumerate(estimates)
        ]
    elif len(labels) != len(estimates):
        raise ValueError(
            f"{len(labels)} labels for {len(estimates)} estimates; give one per layout"
        )
    slowest = max(max(step, sum(time.values())) for _, time, step, _, _ in read)
    scale_t, unit = _time_unit(slowest)
    xs = list(range(len(read)))
    with plt.rc_context(FONT):
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        seen_m: set[str] = set()
        seen_t: set[str] = set()
        top_m = 0.0
        for x, (memory, time, step, capacity, _) in zip(xs, read, strict=True):
            total = sum(memory.values())
            _stack(left, x, memory, MEMORY_TERMS, _MEMORY_COLOURS, 1 / GB, 0.6, seen_m)
            left.hlines(
                capacity / GB,
                x - 0.42,
                x + 0.42,
                lw=3,
                color=_OVER if total > capacity else _FITS,
            )
            top_m = max(top_m, total, capacity)
            _stack(right, x, time, TIME_TERMS, _TIME_COLOURS, scale_t, 0.6, seen_t)
            right.hlines(step * scale_t, x - 0.42, x + 0.42, lw=3, color="black")
        gpus = sorted({gpu for *_, gpu in read})
        handles, names = left.get_legend_handles_labels()
        handles += [
            Line2D([], [], color=_FITS, lw=3),
            Line2D([], [], color=_OVER, lw=3),
        ]
        names += [f"capacity ({', '.join(gpus)})", "capacity, exceeded"]
        left.legend(
            handles, names, loc="upper left", fontsize=12, ncols=2, framealpha=0.9
        )
        left.set_ylim(0, top_m / GB * 1.6)
        left.set_ylabel("GB per GPU")
        left.set_title("Memory per GPU")
        handles, names = right.get_legend_handles_labels()
        handles.append(Line2D([], [], color="black", lw=3))
        names.append("step")
        right.legend(
            handles, names, loc="upper left", fontsize=12, ncols=2, framealpha=0.9
        )
        right.set_ylim(0, slowest * scale_t * 1.6)
        right.set_ylabel(f"time per step ({unit})")
        right.set_title("Step time")
        for ax in (left, right):
            ax.set_xticks(xs, list(labels))
            ax.set_xlim(-0.6, len(xs) - 0.4)
            ax.set_xlabel("layout: dp x tp x pp" if default else "layout")
            ax.grid(True, axis="y", alpha=0.4)
        fig.suptitle(title or "Layouts side by side")
    plt.close(fig)  # shown once, as the cell's value
    return fig
