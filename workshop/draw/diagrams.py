"""Diagrams of work on one node's devices, drawn from plain data.

Each function takes what :mod:`workshop.lessons.notebook01_devices` or
:mod:`workshop.lessons.notebook01_pipeline` measured (objects, or dicts with the same
keys) and returns a Figure sized for a projector, in Okabe-Ito colours (distinct with
every common colour-vision deficiency). No torch here: a picture redraws anywhere.
Figures are closed in pyplot once drawn, so a cell that ends with one shows it once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PHASE_COLOURS", "draw_data_parallel_step", "draw_schedule", "draw_timeline"]

#: Colour of each phase (Okabe-Ito), in the order a data-parallel step runs them.
PHASE_COLOURS = {
    "scatter": "#56B4E9",  # sky blue
    "replicate": "#F0E442",  # yellow
    "forward": "#0072B2",  # blue
    "gather": "#009E73",  # bluish green
    "loss": "#CC79A7",  # reddish purple
    "backward": "#E69F00",  # orange
    "reduce": "#D55E00",  # vermillion
}
_UNKNOWN = "#999999"
# Label text that reads on each fill: white on the dark ones, black elsewhere.
_WHITE_TEXT = {"forward", "reduce"}
_IDLE_EDGE = "0.55"
_CENTRE = {"ha": "center", "va": "center"}

# fmt: off
DIAGRAM_FONT = {"font.size": 16, "axes.titlesize": 18, "axes.labelsize": 17,
        "xtick.labelsize": 15, "ytick.labelsize": 15, "legend.fontsize": 15}
# The lane diagrams' type: 12 points is 16.7 px at the inline backend's 100 dpi, well
# above the projector's 12 px floor (workshop.draw.projector), and it leaves room.
FIT_FONT = {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13,
            "xtick.labelsize": 12, "ytick.labelsize": 12, "legend.fontsize": 12}
# fmt: on
_LABEL_SIZES = (16, 14, 12)  # tried in turn until a label fits; 12 still reads
# A cell's output area on a 1280x720 projector is 1085 x 456 px, 10.85 x 4.56 inches
# at the inline backend's 100 dpi (workshop.draw.projector, whose test checks every
# figure); figures are drawn a little inside it: a tight bounding box adds pixels.
WIDTH_IN, HEIGHT_IN = 10.6, 4.4
# Inches of a figure's width taken by lane labels and margins, not by the plot.
_MARGIN_IN = 2.6
# A lane's height in inches: at most 1 (few lanes make no wall of colour), at least
# 0.3 (a bar and a one-line label); past MAX_LANES the figure grows too tall.
_LANE_IN = (0.3, 1.0)
MAX_LANES = 10  #: lanes draw_timeline shows whole (8 under a two-line title)


def draw_data_parallel_step(record: Any, title: str | None = None) -> Figure:
    """Draw one data-parallel step: a lane per device, a bar per phase (at least
    0.4 % of the step wide, so each keeps its colour; the legend gives true times).

    Args:
        record: a :class:`workshop.lessons.notebook01_devices.StepRecord`, or a dict
            with its ``events``, ``devices``, ``chunk_sizes`` and ``parallel``.
        title: replaces the first line of the title.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: the record has no events.

    Example:
        >>> forward = {"phase": "forward", "device": 0, "start": 0.0, "end": 0.002}
        >>> record = {"events": [forward], "devices": ["cpu"], "chunk_sizes": [8],
        ...           "parallel": False}
        >>> len(draw_data_parallel_step(record).axes[0].patches)
        1
    """
    plt = _pyplot()
    if record is None:
        raise TypeError(
            "record is None; pass what data_parallel_step returned (a StepRecord) or "
            "a dict with its events, devices, chunk_sizes and parallel"
        )
    events = [_event(e) for e in _field(record, "events")]
    if not events:
        raise ValueError("the record has no events; pass what data_parallel_step made")
    devices = list(_field(record, "devices"))
    chunks = list(_field(record, "chunk_sizes"))
    parallel = bool(_field(record, "parallel"))
    span = max(e["end"] for e in events) * 1e3
    with plt.rc_context(FIT_FONT):
        fig, ax = plt.subplots(
            figsize=lane_figsize(len(devices), 2, 2), layout="constrained"
        )
        # Longest first, so a sliver drawn at its minimum width stays on top.
        for e in sorted(events, key=lambda e: e["start"] - e["end"]):
            width = max((e["end"] - e["start"]) * 1e3, span * 0.004)
            _bar(ax, e["device"], e["start"] * 1e3, width, e["phase"])
        labels = []
        two_lines = lane_height(len(devices), 2, 2) >= 0.5
        for i, name in enumerate(devices):
            samples = f"{chunks[i]} samples" if i < len(chunks) else "no samples"
            labels.append(
                f"device {i} ({name})" + ("\n" if two_lines else ", ") + samples
            )
        _lanes(ax, labels, "device")
        ax.set_xlim(0, span * 1.02)
        ax.set_xlabel("time since the step began (ms)")
        how = "replicas at the same time" if parallel else "replicas one after another"
        first = title or "One data-parallel step, phase by phase"
        ax.set_title(f"{first}\n{len(devices)} devices, {how}")
        phases = [p for p in PHASE_COLOURS if any(e["phase"] == p for e in events)]
        phases += sorted({e["phase"] for e in events} - set(phases))
        handles = [
            patch(
                PHASE_COLOURS.get(p, _UNKNOWN),
                f"{p} {_wall_ms([e for e in events if e['phase'] == p]):.2f} ms",
            )
            for p in phases
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=4, frameon=False)
    plt.close(fig)
    return fig


def draw_timeline(
    events: Any, title: str, lanes: Sequence[str] | None = None
) -> Figure:
    """Draw measured work per device over time; blank where a device waited. A bar
    is labelled with its micro-batch where the number fits at 12 points, a lane with
    its idle share; whole on a projector up to :data:`MAX_LANES` lanes.

    Args:
        events: events with ``device``, ``phase``, ``start``, ``end`` (seconds) and
            ``micro_batch``; or a
            :class:`workshop.lessons.notebook01_pipeline.Timeline` (its ``devices``
            name the lanes).
        title: the figure's title.
        lanes: a name per lane (device), e.g. ``["cuda:0", "cuda:1"]``.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: no events, or fewer lane names than lanes used.

    Example:
        >>> f0 = dict(phase="forward", device=0, start=0, end=1, micro_batch=0)
        >>> [t.get_text() for t in draw_timeline([f0], "one").axes[0].texts]
        ['0']
    """
    plt = _pyplot()
    if events is None:
        raise TypeError(
            "events is None; pass what pipeline_forward_backward made (a Timeline) or "
            "a list of events with device, phase, start, end and micro_batch"
        )
    if not isinstance(events, Sequence | Mapping) and hasattr(events, "events"):
        lanes = lanes if lanes is not None else list(events.devices)
        events = events.events
    events = [_event(e) for e in events]
    if not events:
        raise ValueError("no events to draw; pass what pipeline_forward_backward made")
    used = max(e["device"] for e in events) + 1
    lanes = list(lanes) if lanes is not None else ["" for _ in range(used)]
    if len(lanes) < used:
        raise ValueError(
            f"events use {used} lanes but {len(lanes)} lane names were given "
            f"({lanes}); pass one name per device"
        )
    t0 = min(e["start"] for e in events)
    span = (max(e["end"] for e in events) - t0) * 1e3
    with plt.rc_context(FIT_FONT):
        fig, ax = plt.subplots(
            figsize=lane_figsize(len(lanes), 1, 1), layout="constrained"
        )
        points_per_ms = (WIDTH_IN - _MARGIN_IN) * 72 / (span * 1.02)
        # A bar is 0.6 of its lane high; a label no taller than the bar.
        bar_points = 0.6 * 72 * lane_height(len(lanes), 1, 1)
        for e in events:
            left, width = (e["start"] - t0) * 1e3, (e["end"] - e["start"]) * 1e3
            _bar(ax, e["device"], left, width, e["phase"])
            label = "" if e["micro_batch"] is None else str(e["micro_batch"])
            size = fitting_size(label, width * points_per_ms, bar_points)
            if size:
                colour = "white" if e["phase"] in _WHITE_TEXT else "black"
                x = left + width / 2
                ax.text(x, e["device"], label, **_CENTRE, fontsize=size, color=colour)
        names = []
        for i, name in enumerate(lanes):
            busy = _busy_ms([e for e in events if e["device"] == i])
            idle = 1 - busy / span if span else 0.0
            head = f"device {i} ({name})" if name else f"device {i}"
            two_lines = lane_height(len(lanes), 1, 1) >= 0.5
            names.append(f"{head}" + ("\n" if two_lines else ", ") + f"idle {idle:.0%}")
        _lanes(ax, names, "device")
        ax.set_xlim(0, span * 1.02)
        ax.set_xlabel("time (ms)")
        ax.set_title(title)
        phases = [p for p in PHASE_COLOURS if any(e["phase"] == p for e in events)]
        handles = [patch(PHASE_COLOURS[p], p) for p in phases]
        handles.append(patch("white", "idle (waiting)", edge=_IDLE_EDGE))
        fig.legend(handles=handles, loc="outside lower center", ncols=6, frameon=False)
    plt.close(fig)
    return fig


def draw_schedule(schedule: Sequence[Any], title: str | None = None) -> Figure:
    """Draw an idealised pipeline schedule: a row per stage, a column per time step,
    cells ``F<m>``/``B<m>`` where that fits at 12 points; empty cells are bubbles.

    Args:
        schedule: ``(step, stage, micro_batch, phase)`` rows, e.g.
            :func:`workshop.lessons.notebook01_pipeline.pipeline_schedule`.
        title: replaces the first line of the title.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: an empty schedule, or two pieces of work in one cell.

    Example:
        >>> fig = draw_schedule([(0, 0, 0, "forward"), (1, 0, 0, "backward")])
        >>> print(fig.axes[0].get_title())
        GPipe schedule: 1 stage, 1 micro-batch
        bubbles: 0 of 2 slots idle = 0%
    """
    plt = _pyplot()
    slots = [_slot(s) for s in schedule]
    if not slots:
        raise ValueError("the schedule is empty; pass pipeline_schedule(2, 4)")
    cells = {(s[0], s[1]) for s in slots}
    if len(cells) != len(slots):
        raise ValueError(
            "two pieces of work share a (step, stage) cell; a stage does one thing "
            "per time step: check the schedule's steps"
        )
    steps = max(s[0] for s in slots) + 1
    stages = max(s[1] for s in slots) + 1
    micro_batches = max(s[2] for s in slots) + 1
    total = steps * stages
    idle = total - len(slots)
    width_in = min(max(0.6 * steps + _MARGIN_IN, 7.0), WIDTH_IN)
    cell_points = (width_in - _MARGIN_IN) * 72 / steps
    with plt.rc_context(FIT_FONT):
        fig, ax = plt.subplots(
            figsize=(width_in, lane_figsize(stages, 2, 1, 0.7)[1]),
            layout="constrained",
        )
        for step, stage, mb, phase in slots:
            _bar(ax, stage, step, 1, phase, height=1, linewidth=1)
            label = f"{phase[:1].upper()}{mb}"
            # A cell too narrow for its label at 12 points keeps just its colour.
            if size := fitting_size(label, cell_points):
                colour = "white" if phase in _WHITE_TEXT else "black"
                ax.text(
                    step + 0.5, stage, label, **_CENTRE, fontsize=size, color=colour
                )
        # Cell borders as grid lines, so empty cells (bubbles) read as cells.
        ax.set_xticks([i + 0.5 for i in range(steps)])
        every = 1 if steps <= 24 else 2
        ax.set_xticklabels([str(i) if i % every == 0 else "" for i in range(steps)])
        ax.set_xticks(range(steps + 1), minor=True)
        ax.set_yticks([i + 0.5 for i in range(-1, stages)], minor=True)
        ax.grid(which="minor", color=_IDLE_EDGE, linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.set_xlim(0, steps)
        _lanes(ax, [f"stage {s}" for s in range(stages)], "pipeline stage", grid=False)
        ax.set_xlabel("time step")
        first = title or (
            f"GPipe schedule: {_count(stages, 'stage')}, "
            f"{_count(micro_batches, 'micro-batch')}"
        )
        ax.set_title(
            f"{first}\nbubbles: {idle} of {total} slots idle = {idle / total:.0%}"
        )
        phases = [p for p in PHASE_COLOURS if any(s[3] == p for s in slots)]
        handles = [patch(PHASE_COLOURS[p], p) for p in phases]
        handles.append(patch("white", "bubble (idle)", edge=_IDLE_EDGE))
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
    plt.close(fig)
    return fig


# --- private helpers -------------------------------------------------------------


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "workshop's diagrams need matplotlib, which is not installed here; "
            "pip install 'scaling-pytorch-hpc[lab]' (or matplotlib>=3.7)"
        ) from e
    return plt


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("h") else "s")


def _field(item: Any, name: str) -> Any:
    return item[name] if isinstance(item, Mapping) else getattr(item, name)


def _event(item: Any) -> dict[str, Any]:
    """An event as a dict, from an Event, a dict or anything with those fields."""
    get = (
        item.get if isinstance(item, Mapping) else lambda k, d=None: getattr(item, k, d)
    )
    event = {k: get(k) for k in ("phase", "device", "start", "end")}
    if any(v is None for v in event.values()):
        raise ValueError(
            f"{item!r} is not an event: it needs phase, device, start and end"
        )
    event["micro_batch"] = get("micro_batch", None)
    return event


def _slot(item: Any) -> tuple[int, int, int, str]:
    if isinstance(item, Mapping):
        return item["step"], item["stage"], item["micro_batch"], item["phase"]
    step, stage, micro_batch, phase = item
    return step, stage, micro_batch, phase


def _lanes(ax: Any, labels: Sequence[str], ylabel: str, grid: bool = True) -> None:
    """A lane per label, the first at the top."""
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_ylabel(ylabel)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if grid:
        ax.grid(axis="x", color="0.85")
        ax.set_axisbelow(True)
        # A thin line between lanes, so a blank stretch reads as that lane's idle time.
        for i in range(len(labels) - 1):
            ax.axhline(i + 0.5, color="0.85", linewidth=1)


def lane_height(
    lanes: int, title_lines: int, legend_rows: int, most: float = _LANE_IN[1]
) -> float:
    """Inches per lane of a lane diagram: as much as the projector's height leaves
    after the title, the time axis and the legend, between 0.3 and ``most``."""
    fixed = 0.28 * title_lines + 0.62 + 0.27 * legend_rows
    return min(most, max(_LANE_IN[0], (HEIGHT_IN - fixed) / max(lanes, 1)))


def lane_figsize(lanes: int, *layout: Any) -> tuple[float, float]:
    """(width, height) in inches of a lane diagram (``layout``: title lines, legend
    rows and the most inches a lane, as for :func:`lane_height`): whole on a 1280x720
    projector up to :data:`MAX_LANES` lanes; taller past that."""
    fixed = 0.28 * layout[0] + 0.62 + 0.27 * layout[1]
    return WIDTH_IN, fixed + lanes * lane_height(lanes, *layout)


def _bar(ax: Any, lane: int, left: float, width: float, phase: str, **style) -> None:
    """A bar in ``lane`` coloured by its phase, outlined in black."""
    style = {"height": 0.6, "linewidth": 0.8, **style}
    colour = PHASE_COLOURS.get(phase, _UNKNOWN)
    ax.barh(lane, width, left=left, color=colour, edgecolor="black", **style)


def patch(colour: str, label: str, edge: str = "black") -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor=edge, label=label)


def _wall_ms(events: Sequence[dict[str, Any]]) -> float:
    return (max(e["end"] for e in events) - min(e["start"] for e in events)) * 1e3


def _busy_ms(events: Sequence[dict[str, Any]]) -> float:
    """Time covered by at least one event, in ms (overlaps counted once)."""
    busy, reach = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e["start"]):
        start = max(e["start"], reach)
        if e["end"] > start:
            busy += e["end"] - start
        reach = max(reach, e["end"])
    return busy * 1e3


def fitting_size(
    label: str, room_points: float, height_points: float = 99.0
) -> int | None:
    """Largest label size whose text fits in ``room_points`` wide and
    ``height_points`` high; None if none fits (or the label is empty)."""
    if not label:
        return None
    for size in (s for s in _LABEL_SIZES if s <= height_points):
        # Digits and capitals are about 0.62 em wide; 4 points keep it off the edges.
        if 0.62 * size * len(label) + 4 <= room_points:
            return size
    return None
