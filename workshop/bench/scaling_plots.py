"""Scaling runs read back and drawn: throughput, speed-up and efficiency against ranks.

:func:`load_scaling` reads the benchmark's JSON files back, several (a batch job's
steps, one world size each) as one ``ScalingResult``. The plots take plain numbers, so
a learner's run and a published table, its source in the label, appear side by side::

    plot_scaling(result, {"Horovod ResNet-50 (paper, Fig. N)": [(2, ...), (64, ...)]})
    plot_efficiency(document_table("cpu-batch50"), load_scaling("docs/results/..."))

Nothing here needs torch: the results can be drawn on a login node.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checks import positive_number, whole
from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import COLOURS, FONT
from ..sources.doc_table import DocumentTable
from .scaling_results import (
    KIND,
    MODES,
    ScalingResult,
    ScalingRow,
    add_speedups,
    why_not_comparable,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "efficiency_series",
    "load_scaling",
    "plot_efficiency",
    "plot_scaling",
    "relative_efficiency",
    "scaling_series",
]

_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]  # shape as well as colour tells lines


def series_style(i: int) -> dict[str, Any]:
    """The ``i``-th series' colour and marker: both change, for black and white too."""
    return {
        "color": COLOURS[i % len(COLOURS)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "lw": 2.2,
        "ms": 7,
    }


Points = list[tuple[int, float]]
PathLike = str | os.PathLike[str]


def _checked(label: Any, points: Any) -> Points:
    """``points`` as sorted (ranks, samples per second) pairs, or a clear error."""
    if not isinstance(label, str) or not label:
        raise ValueError(f"series labels must be non-empty strings, got {label!r}")
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence):
        raise ValueError(
            f"series {label!r} must be a list of (ranks, samples per second) pairs, "
            f"got {type(points).__name__}"
        )
    if not points:
        raise ValueError(
            f"series {label!r} has no points; give at least one (ranks, samples per "
            "second) pair"
        )
    out: Points = []
    for point in points:
        pair = isinstance(point, Sequence) and not isinstance(point, (str, bytes))
        if not pair or len(point) != 2:
            raise ValueError(
                f"series {label!r}: {point!r} is not a (ranks, samples per second) pair"
            )
        ranks, rate = point
        if isinstance(ranks, float) and ranks.is_integer():
            ranks = int(ranks)
        ranks = whole(f"series {label!r}: ranks", ranks)
        fix = f"at {ranks} ranks; leave out counts with no measurement"
        rate = positive_number(f"series {label!r}: samples per second", rate, fix=fix)
        out.append((ranks, rate))
    out.sort()
    repeated = sorted({n for n, _ in out if sum(1 for m, _ in out if m == n) > 1})
    if repeated:
        raise ValueError(
            f"series {label!r} gives more than one throughput for {repeated} ranks; "
            "keep one (the median of repeated runs, say)"
        )
    return out


def _read_csv(path: Path) -> dict[str, Points]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        missing = [c for c in ("ranks", "throughput") if c not in header]
        if missing:
            raise ValueError(
                f"{str(path)!r} needs columns 'ranks' and 'throughput' (samples per "
                f"second); it has {header}, missing {missing}"
            )
        group = next((c for c in ("label", "mode") if c in header), None)
        series: dict[str, list[tuple[Any, Any]]] = {}
        for line, row in enumerate(reader, start=2):
            row = {k.strip().lower(): (v or "").strip() for k, v in row.items() if k}
            label = path.stem + (f" {row[group]}" if group == "mode" else "")
            label = row[group] if group == "label" else label
            try:
                point = (float(row["ranks"]), float(row["throughput"]))
            except ValueError:
                raise ValueError(
                    f"{str(path)!r} line {line}: ranks={row['ranks']!r} and "
                    f"throughput={row['throughput']!r} must both be numbers"
                ) from None
            series.setdefault(label, []).append(point)
    if not series:
        raise ValueError(f"{str(path)!r} has a header but no rows")
    return series


def load_scaling(*paths: PathLike) -> ScalingResult:
    """Read scaling runs back from the JSON files :meth:`ScalingResult.save` wrote.

    Several files (or folders) become one result, rows ordered by mode and world size,
    speed-up and efficiency against the smallest world size of each mode among them all.

    Args:
        *paths: ``.json`` files, or folders whose scaling files are all read (other
            JSON files in a folder are passed over).

    Returns:
        The :class:`ScalingResult`; with several files, the descriptive fields (steps,
        launcher, machine, ...) are the first file's.

    Raises:
        FileNotFoundError: no such file, or a folder with no scaling file in it.
        ValueError: a file that is not a scaling run's JSON; files that measured
            different models, backends or batches; a mode and world size held twice.

    Example:
        >>> job = load_scaling("runs/scaling-1234")            # doctest: +SKIP
        >>> both = load_scaling("base.json", "two_nodes.json")  # doctest: +SKIP
    """
    if not paths:
        raise TypeError(
            "load_scaling needs at least one path: a .json file that "
            "`python -m workshop.bench scaling --out PREFIX` wrote, or its folder"
        )
    found = [run for p in paths for run in _runs(Path(p))]
    files, runs = [f for f, _ in found], [run for _, run in found]
    if len(runs) == 1:
        return runs[0]
    return _merge(runs, files)


def _runs(path: Path) -> list[tuple[Path, ScalingResult]]:
    """The file's run, or the runs of a folder's scaling files in name order."""
    if path.is_dir():
        found = []
        for f in sorted(path.glob("*.json")):
            try:
                found.append((f, _read(f)))
            except (OSError, ValueError):
                continue
        if not found:
            raise FileNotFoundError(
                f"no scaling results in the folder {str(path)!r}; it holds no .json "
                "file that `python -m workshop.bench scaling --out PREFIX` wrote"
            )
        return found
    if not path.is_file():
        raise FileNotFoundError(
            f"no scaling results at {str(path)!r}; write them with "
            "`python -m workshop.bench scaling --out PREFIX` (PREFIX.json)"
        )
    return [(path, _read(path))]


def _read(path: Path) -> ScalingResult:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(
            f"{str(path)!r} is not JSON ({exc}); pass the .json file that "
            "`--out PREFIX` wrote, not the .csv"
        ) from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(
            f"{str(path)!r} is not a scaling run (its 'kind' is "
            f"{data.get('kind') if isinstance(data, dict) else None!r}, not {KIND!r})"
        )
    names = {f.name for f in fields(ScalingRow)}
    rows = [
        ScalingRow(**{k: v for k, v in r.items() if k in names}) for r in data["rows"]
    ]
    names = {f.name for f in fields(ScalingResult)}
    return ScalingResult(
        **{k: v for k, v in data.items() if k in names} | {"rows": rows}
    )


def _merge(runs: list[ScalingResult], files: list[Path]) -> ScalingResult:
    """One result from runs of the same benchmark at different world sizes."""
    first, name = runs[0], str(files[0])
    held: dict[tuple[str, int], str] = {}
    for run, path in zip(runs, files, strict=True):
        if (run.backend, run.device) != (first.backend, first.device):
            raise ValueError(
                f"{name!r} measured {first.backend} on {first.device} but "
                f"{str(path)!r} {run.backend} on {run.device}; load runs of one "
                "backend and device together"
            )
        why = why_not_comparable(
            (first.model, first.image_size, first.rows),
            (run.model, run.image_size, run.rows),
        )
        if why:
            raise ValueError(
                f"{name!r} and {str(path)!r} measured different things: {why}; "
                "load runs of one model, image size and batch together"
            )
        for row in run.rows:
            key = (row.mode, row.world_size)
            if key in held:
                raise ValueError(
                    f"{held[key]!r} and {str(path)!r} both hold {row.mode} scaling at "
                    f"{row.world_size} rank(s); load only one of them"
                )
            held[key] = str(path)
    rows = sorted(
        (row for run in runs for row in run.rows),
        key=lambda r: (MODES.index(r.mode), r.world_size),
    )
    add_speedups(rows)
    # A 1-rank step fits no alpha and beta (there is no all-reduce): say where the
    # other steps' came from, not that there are none.
    sources = sorted({run.alpha_beta_source for run in runs})
    sources = [s for s in sources if not s.startswith("none")] or sources
    return ScalingResult(
        **{f.name: getattr(first, f.name) for f in fields(ScalingResult)}
        | {"rows": rows, "alpha_beta_source": "; ".join(sources)}
    )


def scaling_series(source: Any) -> dict[str, Points]:
    """One source of measurements as ``{label: [(ranks, samples/s), ...]}``, sorted.

    Args:
        source: a ``ScalingResult`` (a series per mode), a mapping of label to (ranks,
            samples per second) pairs, or the path of a CSV (columns ``ranks``,
            ``throughput``; a ``label`` or ``mode`` column splits it), of the
            benchmark's JSON, or of a folder of them.

    Returns:
        Each series' points, checked and sorted by rank count.

    Raises:
        TypeError: a source of another kind.
        ValueError: no points, ranks below 1, a throughput not above 0, a rank count
            given twice, missing CSV columns.
        FileNotFoundError: no such file.

    Example:
        >>> scaling_series({"mine": [(2, 190.0), (1, 100.0)]})
        {'mine': [(1, 100.0), (2, 190.0)]}
    """
    if hasattr(source, "rows") and hasattr(source, "model"):
        raw: dict[str, Any] = {}
        for row in source.rows:
            label = f"{row.mode} scaling, {source.model} ({source.device})"
            raw.setdefault(label, []).append((row.world_size, row.samples_per_second))
    elif isinstance(source, Mapping):
        raw = dict(source)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir() or path.suffix.lower() == ".json":
            # A batch job's results: one JSON file per world size, in one folder.
            return scaling_series(load_scaling(path))
        if not path.is_file():
            raise FileNotFoundError(f"no table at {str(path)!r}")
        raw = _read_csv(path)
    else:
        raise TypeError(
            "plot_scaling takes a ScalingResult, a dict {label: [(ranks, "
            "samples_per_sec), ...]}, or the path of a CSV (columns ranks, "
            f"throughput) or JSON file; got {type(source).__name__}"
        )
    return {label: _checked(label, points) for label, points in raw.items()}


def relative_efficiency(points: Points) -> Points:
    """Efficiency of each point against the first: ``(X_N / X_0) * (N_0 / N)``.

    With a 1-rank first point that is weak scaling's X_N / (N X_1), and for a fixed
    global batch strong scaling's (T_1 / T_N) / N.

    Example:
        >>> relative_efficiency([(1, 100.0), (4, 360.0)])
        [(1, 1.0), (4, 0.9)]
    """
    n0, x0 = points[0]
    return [(n, (x / x0) * (n0 / n)) for n, x in points]


def _add(series: dict[str, Points], label: str, points: Points) -> None:
    """``series[label] = points``, the label numbered " (2)", ... if already there."""
    unique, k = label, 2
    while unique in series:
        unique, k = f"{label} ({k})", k + 1
    series[unique] = points


def _count_axes(axes: Any, counts: list[int], xlabel: str, log: bool = True) -> None:
    """The counts drawn, and only they, as ticks of each panel's x axis."""
    from matplotlib.ticker import NullLocator

    for ax in axes:
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.4)


def _efficiency_and_legend(
    fig: Figure, ax_e: Any, handles: list, labels: list[str], title: str
) -> None:
    """The efficiency panel in percent from 0, and one legend below both panels."""
    from matplotlib.ticker import PercentFormatter

    longest = max(len(text) for text in labels)
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=3 if longest <= 30 else 2 if longest <= 56 else 1,
        frameon=False,
    )
    top = max(max(line.get_ydata()) for line in ax_e.get_lines())
    ax_e.set_ylim(0, max(110, 1.1 * top))
    ax_e.yaxis.set_major_formatter(PercentFormatter())
    ax_e.set_ylabel("efficiency (of ideal)")
    ax_e.set_title(title)


def plot_scaling(
    *sources: Any,
    title: str = "",
    xlabel: str = "ranks (processes or GPUs)",
    log: bool = True,
) -> Figure:
    """Throughput (left) and efficiency (right) against ranks, each with its ideal.

    Each series has a dashed ideal line of its own colour from its first point;
    efficiency is against its smallest rank count, which the legend names where it is
    not 1: "(vs 2 ranks)".

    Args:
        *sources: ``ScalingResult`` s, dicts ``{label: [(ranks, samples_per_sec),
            ...]}``, or CSV or JSON paths; see :func:`scaling_series`.
        xlabel: what the ranks are.
        log: logarithmic throughput axes, so a CPU's hundreds and a cluster's
            thousands fit in one panel.

    Returns:
        The matplotlib Figure; ``fig.axes`` is (throughput, efficiency).

    Raises:
        ValueError: no source, or a bad table (see :func:`scaling_series`).
        TypeError: a source of another kind.

    Example:
        >>> published = {"published (source)": [(2, 180.0), (8, 650.0)]}
        >>> fig = plot_scaling(result, published)          # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullFormatter

    if not sources:
        raise ValueError(
            "nothing to draw; pass a ScalingResult, a dict {label: [(ranks, "
            "samples_per_sec), ...]} or a CSV path"
        )
    series: dict[str, Points] = {}
    for source in sources:
        for label, points in scaling_series(source).items():
            _add(series, label, points)
    ranks_drawn = sorted({n for points in series.values() for n, _ in points})

    with plt.rc_context(FONT):
        fig, (ax_t, ax_e) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        handles, labels = [], []
        for i, (label, points) in enumerate(series.items()):
            style = series_style(i)
            ranks, rates = zip(*points, strict=True)
            (line,) = ax_t.plot(ranks, rates, label=label, **style)
            (n0, x0), last = points[0], ranks[-1]
            (ideal,) = ax_t.plot(
                [n0, last], [x0, x0 * last / n0], ls="--", lw=1.6,
                color=style["color"], alpha=0.8, label="_ideal",
            )  # fmt: skip
            ideal.set_gid(f"ideal: {label}")
            efficiency = [100 * e for _, e in relative_efficiency(points)]
            relative = "" if n0 == 1 else f" (vs {n0} ranks)"
            ax_e.plot(ranks, efficiency, label=label + relative, **style)
            handles.append(line)
            labels.append(label + ("" if n0 == 1 else f" (efficiency vs {n0} ranks)"))
        ax_e.axhline(100, ls="--", lw=1.8, color="0.35", label="ideal", gid="ideal")
        _count_axes((ax_t, ax_e), ranks_drawn, xlabel, log)
        if log:
            ax_t.set_yscale("log")
        ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        # A log axis labels its minor ticks in scientific notation (4x10^3) beside
        # plain major ones; write them all the same way, and label minor ticks only
        # when the range holds no more than a few of them.
        low, high = ax_t.get_ylim()
        if log and high / max(low, 1e-12) < 30:
            ax_t.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        elif log:
            ax_t.yaxis.set_minor_formatter(NullFormatter())
        ax_t.set_ylabel("samples/s (all ranks)")
        ax_t.set_title("Throughput")
        handles.append(Line2D([], [], ls="--", lw=1.6, color="0.35"))
        labels.append("ideal (linear from the first point)")
        _efficiency_and_legend(fig, ax_e, handles, labels, "Scaling efficiency")
        fig.suptitle(title or "Scaling: throughput and efficiency against ranks")
    plt.close(fig)  # shown once, as the cell's value; no figure left open
    return fig


def efficiency_series(*sources: Any) -> dict[str, Points]:
    """Each source's speed-up over its smallest count, as ``{label: [(N, x)]}``.

    Args:
        *sources: a :class:`~workshop.sources.tables.DocumentTable` (each measured
            column a series), or anything :func:`scaling_series` reads; a dict of
            speed-ups reads as rates too.

    Returns:
        Speed-ups, sorted by count; each series starts at 1.

    Raises:
        ValueError: no source, a bad table, or a document table of single runs.
        TypeError: a source of another kind.

    Example:
        >>> efficiency_series({"mine": [(1, 100.0), (4, 300.0)]})
        {'mine': [(1, 1.0), (4, 3.0)]}
    """
    if not sources:
        raise ValueError(
            "nothing to draw; pass a document table "
            "(workshop.sources.document_table(name)), "
            "a ScalingResult or a dict {label: [(ranks, samples_per_sec), ...]}"
        )
    out: dict[str, Points] = {}
    for source in sources:
        if isinstance(source, DocumentTable):
            raw = source.speedups()
        else:
            raw = scaling_series(source)
        for label, points in scaling_series(raw).items():
            x0 = points[0][1]
            _add(out, label, [(n, x / x0) for n, x in points])
    return out


def plot_efficiency(
    *sources: Any,
    title: str = "",
    xlabel: str = "CPU cores, GPUs or ranks",
) -> Figure:
    """Speed-up (left) and efficiency (right) against the count, with the ideal.

    Speed-up is over each series' smallest count N0 (a time's ratio for a table in
    seconds, a rate's for rates); efficiency is speed-up / (N / N0).

    Args:
        *sources: document tables, runs or tables of rates; see
            :func:`efficiency_series`.
        xlabel: what is counted.

    Returns:
        The Figure, ``fig.axes`` (speed-up, efficiency); closed in pyplot.

    Raises:
        ValueError, TypeError: as :func:`efficiency_series`.

    Example:
        >>> fig = plot_efficiency(document_table("cpu-batch50"))  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullLocator

    series = efficiency_series(*sources)
    counts = sorted({n for points in series.values() for n, _ in points})
    with plt.rc_context(FONT):
        fig, (ax_s, ax_e) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        handles, labels = [], []
        for i, (label, points) in enumerate(series.items()):
            style = series_style(i)
            ns, gains = zip(*points, strict=True)
            n0 = ns[0]
            (line,) = ax_s.plot(ns, gains, **style)
            ax_e.plot(ns, [100 * g * n0 / n for n, g in points], **style)
            handles.append(line)
            labels.append(label + ("" if n0 == 1 else f" (vs {n0})"))
        ideal_x = [counts[0], counts[-1]]
        ax_s.plot(ideal_x, [1, counts[-1] / counts[0]], ls="--", lw=1.8,
                  color="0.35", gid="ideal")  # fmt: skip
        ax_e.axhline(100, ls="--", lw=1.8, color="0.35", gid="ideal")
        _count_axes((ax_s, ax_e), counts, xlabel)
        ax_s.set_yscale("log", base=2)
        ax_s.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax_s.yaxis.set_minor_locator(NullLocator())
        ax_s.set_ylabel("speed-up over the first count")
        ax_s.set_title("Speed-up")
        handles.append(Line2D([], [], ls="--", lw=1.8, color="0.35"))
        labels.append("ideal (N / N0, 100 %)")
        _efficiency_and_legend(
            fig, ax_e, handles, labels, "Efficiency = speed-up / (N / N0)"
        )
        fig.suptitle(title or "Speed-up and efficiency against the ideal")
    plt.close(fig)
    return fig
