"""What an all-reduce sweep measured, as plain data: the table, the ring model's fit,
the files (``save_allreduce``, ``load_allreduce``, so a notebook can show a batch
job's run) and the picture. Bandwidths are in bytes/s, as nccl-tests defines them."""

from __future__ import annotations

import csv
import json
import re
import statistics
import textwrap
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..comm.costmodel import AlphaBeta, algbw, busbw, fit_alpha_beta
from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
from ..draw.plots import COLOURS, FONT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "FIT_TOLERANCE",
    "AllreduceResult",
    "human_size",
    "load_allreduce",
    "message_sizes",
    "parse_size",
    "plot_allreduce",
    "save_allreduce",
]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: The ring model must predict every measured size within this relative error.
FIT_TOLERANCE = 0.30
DTYPE_BYTES = 4  # float32
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB}
_CSV_COLUMNS = ["size_bytes", "repetition", "seconds", "algbw", "busbw"]


def parse_size(text: str | int) -> int:
    """Bytes from ``"4096"``, ``"4K"``, ``"4KiB"``, ``"64M"`` or ``"1G"`` (binary).

    Raises:
        ValueError: not a whole number with an optional K, M or G.

    Example:
        >>> parse_size("64M")
        67108864
    """
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(
            f"cannot read the size {text!r}; write bytes as a whole number with an "
            "optional K, M or G (binary units), e.g. 4096, 4K or 64M"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def human_size(size: int) -> str:
    """``4096`` -> ``"4 KiB"``: the largest binary unit that divides evenly.

    Example:
        >>> human_size(64 << 20)
        '64 MiB'
    """
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def message_sizes(
    min_size: int = 4 * KiB, max_size: int = 64 * MiB, factor: int = 4
) -> list[int]:
    """Sizes in bytes from ``min_size`` up to ``max_size``, each ``factor`` times
    the last.

    Raises:
        ValueError: ``max_size`` below ``min_size``, a size that is not a positive
            multiple of 4 bytes (one float32), or ``factor`` below 2.

    Example:
        >>> message_sizes(4096, 65536)
        [4096, 16384, 65536]
    """
    for name, value in (("min_size", min_size), ("max_size", max_size)):
        if value < DTYPE_BYTES or value % DTYPE_BYTES:
            raise ValueError(
                f"{name}={value} bytes is not a whole number of float32 values; "
                f"give a positive multiple of {DTYPE_BYTES} bytes, e.g. 4K"
            )
    if max_size < min_size:
        raise ValueError(
            f"max_size={max_size} bytes ({human_size(max_size)}) is smaller than "
            f"min_size={min_size} bytes ({human_size(min_size)}); raise max_size or "
            "lower min_size"
        )
    if factor < 2:
        raise ValueError(f"factor={factor}: give 2 or more, so that the sizes grow")
    sizes = [min_size]
    while sizes[-1] * factor <= max_size:
        sizes.append(sizes[-1] * factor)
    return sizes


@dataclass
class AllreduceResult:
    """One all-reduce sweep: every repetition's time per size, and where it ran.

    Attributes:
        launcher: who started the ranks ("workshop", "torchrun", "srun", "mpirun").
        seconds: for each size, every timed repetition (the slowest rank's time).
        warmup: untimed calls made for each size first.
        reference: the memory copy: ``what``, ``bytes`` and ``seconds`` (each copy).
        machine: hostname, cpu_count, platform, threads, gpu, load_average.
        versions: python, torch, workshop (and nccl on GPUs).
        skipped_sizes: sizes left out because they would not fit in memory.
        created: when the sweep ended (ISO 8601, local time).
    """

    backend: str
    world_size: int
    launcher: str
    device: str
    sizes: list[int]
    seconds: list[list[float]]
    warmup: int
    reference: dict[str, Any]
    machine: dict[str, Any]
    versions: dict[str, Any]
    dtype: str = "float32"
    skipped_sizes: list[int] = field(default_factory=list)
    created: str = ""

    @property
    def medians(self) -> list[float]:
        """Median seconds per size."""
        return [statistics.median(times) for times in self.seconds]

    @property
    def algbw(self) -> list[float]:
        """Algorithm bandwidth (bytes/s) of each size's median time."""
        return [algbw(s, t) for s, t in zip(self.sizes, self.medians, strict=True)]

    @property
    def busbw(self) -> list[float]:
        """Bus bandwidth (bytes/s) of each size's median time."""
        n = self.world_size
        return [busbw(s, t, n) for s, t in zip(self.sizes, self.medians, strict=True)]

    @property
    def reference_bandwidth(self) -> float:
        """Bytes/s of the reference copy: its size over its fastest repetition."""
        return self.reference["bytes"] / min(self.reference["seconds"])

    @property
    def peak_busbw(self) -> float:
        """The highest busbw over the sizes (bytes/s)."""
        return max(self.busbw)

    def fit(self) -> AlphaBeta:
        """The ring model fitted to the median times.

        Raises:
            ValueError: world_size 1, or fewer than two sizes.
        """
        return fit_alpha_beta(self.sizes, self.medians, self.world_size)

    def _fit_or_none(self) -> AlphaBeta | None:
        """The fit, or None where there is none (one rank, or one size)."""
        if self.world_size < 2 or len(set(self.sizes)) < 2:
            return None
        return self.fit()

    def errors(self) -> list[float]:
        """The fit's relative error at each size: predicted / measured - 1."""
        fit = self.fit()
        return [
            fit.predict(s) / t - 1
            for s, t in zip(self.sizes, self.medians, strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready plain data, the derived figures included."""
        data = asdict(self)
        del data["seconds"]
        fit = self._fit_or_none()
        rows = zip(
            self.sizes, self.seconds, self.medians, self.algbw, self.busbw, strict=True
        )
        data["sizes"] = [
            {"size_bytes": size, "count": size // DTYPE_BYTES, "seconds": times}
            | {"median_seconds": median, "algbw": a, "busbw": b}
            | {"predicted_seconds": fit.predict(size) if fit else None}
            for size, times, median, a, b in rows
        ]
        data["fit"] = None  # one rank or one size: nothing to fit
        if fit is not None:
            data["fit"] = asdict(fit) | {
                "tolerance": FIT_TOLERANCE,
                "within_tolerance": fit.max_rel_error <= FIT_TOLERANCE,
            }
        data["reference"] = self.reference | {"bandwidth": self.reference_bandwidth}
        data["peak_busbw"] = self.peak_busbw
        data["peak_fraction_of_reference"] = self.peak_busbw / self.reference_bandwidth
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AllreduceResult:
        """The result :meth:`to_dict` wrote; derived figures are recomputed.

        Raises:
            ValueError: a required key is missing.
        """
        required = [
            f.name
            for f in fields(cls)
            if f.default is MISSING
            and f.default_factory is MISSING
            and f.name != "seconds"  # kept in each entry of sizes
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(
                f"not an all-reduce result: {', '.join(missing)} missing; load a "
                "JSON file written by `python -m workshop.bench allreduce`"
            )
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        try:
            kwargs["sizes"] = [int(row["size_bytes"]) for row in data["sizes"]]
            kwargs["seconds"] = [list(row["seconds"]) for row in data["sizes"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"not an all-reduce result: each entry of sizes needs size_bytes "
                f"and seconds ({exc!r} is wrong); load a file written by "
                "`python -m workshop.bench allreduce`"
            ) from exc
        kwargs["reference"] = {
            k: v for k, v in data["reference"].items() if k != "bandwidth"
        }
        return cls(**kwargs)

    def table(self) -> str:
        """The nccl-tests style table, a line per size: time in microseconds,
        bandwidths in GB/s, the model's time and error; 88 characters wide up to 16 GiB
        and 10 s."""
        fit = self._fit_or_none()
        lines = [
            f"{'size':>11} {'count':>11} {'type':>7} {'reps':>5} {'time us':>10} "
            f"{'algbw GB/s':>10} {'busbw GB/s':>10} {'model us':>10} {'error':>6}"
        ]
        rows = zip(
            self.sizes, self.seconds, self.medians, self.algbw, self.busbw, strict=True
        )
        for size, times, t, a, b in rows:
            model = f"{fit.predict(size) * 1e6:>10.1f}" if fit else f"{'-':>10}"
            # (+ 0.0 turns a rounded -0.0 into 0.0, printed "+0%", not "-0%")
            error = round(fit.predict(size) / t - 1, 3) + 0.0 if fit else None
            error = f"{error:>+6.0%}" if fit else f"{'-':>6}"
            lines.append(
                f"{size:>11} {size // DTYPE_BYTES:>11} {self.dtype:>7} "
                f"{len(times):>5} {t * 1e6:>10.1f} {a / 1e9:>10.3f} {b / 1e9:>10.3f} "
                f"{model} {error}"
            )
        return "\n".join(lines)

    def summary(self) -> str:
        """The fit, its worst error, and peak busbw against the copy, in three lines."""
        fit = self._fit_or_none()
        if fit is None:
            model = (
                "no ring model: fitting alpha and beta needs 2 ranks or more and 2 "
                "sizes or more\n"
            )
        else:
            errors = [abs(e) for e in self.errors()]
            worst = self.sizes[errors.index(max(errors))]
            within = fit.max_rel_error <= FIT_TOLERANCE
            model = (
                f"ring model: alpha = {fit.alpha * 1e6:.1f} us per step, "
                f"beta = {fit.beta / 1e9:.3f} GB/s per link\n"
                f"the model {'predicts' if within else 'does NOT predict'} every "
                f"measured size within {FIT_TOLERANCE:.0%}: worst error "
                f"{fit.max_rel_error:.1%} at {human_size(worst)}\n"
            )
        ref = self.reference_bandwidth
        text = model + (
            f"peak busbw {self.peak_busbw / 1e9:.3f} GB/s = "
            f"{self.peak_busbw / ref:.1%} of the reference: {self.reference['what']} "
            f"at {ref / 1e9:.3f} GB/s"
        )
        # At most 88 characters a line, as every table and text a notebook prints.
        return "\n".join(
            textwrap.fill(line, 88, subsequent_indent="  ", break_on_hyphens=False)
            for line in text.splitlines()
        )


def save_allreduce(result: AllreduceResult, prefix: str | Path) -> tuple[Path, Path]:
    """Write ``PREFIX.json`` (everything) and ``PREFIX.csv`` (a row per size and
    repetition: size_bytes, repetition, seconds, algbw, busbw; bytes/s).

    Returns:
        The JSON and CSV paths.

    Example:
        >>> save_allreduce(result, "runs/allreduce-gloo-N2")          # doctest: +SKIP
    """
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = Path(f"{prefix}.json"), Path(f"{prefix}.csv")
    json_path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(_CSV_COLUMNS)
        for size, times in zip(result.sizes, result.seconds, strict=True):
            for i, t in enumerate(times):
                bus = busbw(size, t, result.world_size)
                writer.writerow([size, i, repr(t), repr(algbw(size, t)), repr(bus)])
    return json_path, csv_path


def load_allreduce(path: str | Path) -> AllreduceResult:
    """Read a result written by :func:`save_allreduce` (``PREFIX.json`` or
    ``PREFIX``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not an all-reduce result.

    Example:
        >>> print(load_allreduce("allreduce-nccl-N8.json").summary())  # doctest: +SKIP
    """
    path = Path(path)
    if not path.exists() and Path(f"{path}.json").exists():
        path = Path(f"{path}.json")
    if not path.exists():
        raise FileNotFoundError(
            f"no all-reduce result at {path}; pass the .json file that "
            "`python -m workshop.bench allreduce --out PREFIX` wrote"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not JSON ({exc}); pass the .json file, not the .csv"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("sizes"), list):
        raise ValueError(
            f"{path} is not an all-reduce result (it has no list of sizes); pass a "
            "file written by `python -m workshop.bench allreduce`"
        )
    return AllreduceResult.from_dict(data)


_FONT = FONT | {"axes.titlesize": 13, "legend.fontsize": 11}  # smaller titles, legends
_BLUE, _ORANGE, _GREEN, _SKY = COLOURS[0], COLOURS[1], COLOURS[2], COLOURS[5]


def plot_allreduce(result: Any, title: str = "") -> Figure:
    """Time (left) and busbw (right) against message size, with the fitted ring
    model and its :data:`FIT_TOLERANCE` band; busbw under the reference copy's line.

    Args:
        result: an :class:`AllreduceResult`.
        title: the figure's title; by default the backend, ranks and device.

    Returns:
        The matplotlib Figure.

    Raises:
        ValueError: a result of one rank or one size, which has no fit.

    Example:
        >>> plot_allreduce(load_allreduce("allreduce-gloo-N2.json"))  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FixedLocator, NullLocator

    fit = result.fit()
    sizes = np.array(result.sizes, dtype=float)
    grid = np.geomspace(sizes[0], sizes[-1], 200)
    model = np.array([fit.predict(s) for s in grid])
    factor = 2 * (result.world_size - 1) / result.world_size
    reference = result.reference_bandwidth / 1e9
    device = result.machine.get("gpu") or result.device
    with plt.rc_context(_FONT):
        # Side by side: whole on a 1280x720 projector (workshop.draw.projector).
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        for size, times in zip(result.sizes, result.seconds, strict=True):
            label = "each repetition" if size == result.sizes[0] else None
            dots = dict(s=7, color=_SKY, alpha=0.25, lw=0, label=label)
            left.scatter([size] * len(times), np.array(times) * 1e3, **dots)
        low, high = model * 1e3 * (1 - FIT_TOLERANCE), model * 1e3 * (1 + FIT_TOLERANCE)
        band = dict(
            color=_ORANGE, alpha=0.18, lw=0, label=f"model ± {FIT_TOLERANCE:.0%}"
        )
        left.fill_between(grid, low, high, **band)
        left.plot(
            grid,
            model * 1e3,
            color=_ORANGE,
            lw=2.5,
            label=f"ring model: $\\alpha$ = {fit.alpha * 1e6:.0f} µs, "
            f"$\\beta$ = {fit.beta / 1e9:.2f} GB/s",
        )
        medians = np.array(result.medians) * 1e3
        left.plot(sizes, medians, "o", ms=7, color=_BLUE, label="measured (median)")
        left.set_yscale("log")
        left.set_ylabel("time per all-reduce (ms)")
        left.set_title(f"Time: worst model error {fit.max_rel_error:.0%}")

        busbw_gbs = np.array(result.busbw) / 1e9
        line = dict(lw=2.2, ms=7, color=_BLUE, label="measured busbw (median)")
        right.plot(sizes, busbw_gbs, "o-", **line)
        ring = grid * factor / model / 1e9
        right.plot(grid, ring, "--", lw=2.5, color=_ORANGE, label="ring model")
        label = f"{result.reference['what']}: {reference:.2f} GB/s"
        right.axhline(reference, color=_GREEN, lw=3, ls=":", label=label)
        right.set_yscale("log")
        right.set_ylabel("bus bandwidth (GB/s)")
        peak = result.peak_busbw / 1e9
        right.set_title(f"busbw: peak {peak:.2f} GB/s = {peak / reference:.0%} of copy")
        step = max(1, len(result.sizes) // 8)
        # Room for each legend outside the data, on the log axis: above the times
        # (which rise to the right), below the busbw (which rises from the left).
        low, high = left.get_ylim()
        left.set_ylim(low, high * (high / low) ** 0.6)
        low, high = right.get_ylim()
        right.set_ylim(low / (high / low) ** 0.5, high)
        for ax, corner in ((left, "upper left"), (right, "lower right")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(result.sizes[::step]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([human_size(s) for s in result.sizes[::step]])
            ax.tick_params(axis="x", labelrotation=35)
            ax.set_xlabel("message size")
            ax.grid(True, which="major", alpha=0.4)
            ax.legend(loc=corner, framealpha=0.9)
        fig.suptitle(
            title
            or f"All-reduce of float32 on {result.world_size} ranks, "
            f"{result.backend} on {device}"
        )
    plt.close(fig)  # shown once, as the cell's value
    return fig
