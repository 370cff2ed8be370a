"""Results of the scaling benchmark: speed-up and efficiency, rows, JSON and CSV.
:func:`assemble` turns the workers' plain dicts into :class:`ScalingRow` s."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..checks import positive_number, whole
from ..comm.costmodel import fit_alpha_beta, ring_all_reduce_time

__all__ = [
    "MODES",
    "ScalingResult",
    "ScalingRow",
    "add_speedups",
    "assemble",
    "check_baseline",
    "strong_scaling",
    "weak_scaling",
    "why_not_comparable",
]

#: Scaling modes: fixed batch per rank, fixed global batch.
MODES = ("weak", "strong")
KIND = "workshop.scaling"


# ------------------------------------------------------------------ formulas
def _check_pair(value_1: float, value_n: float, world_size: int, base: int) -> None:
    positive_number("baseline", value_1)
    positive_number("measured value", value_n)
    whole("world_size", world_size)
    whole("base_world_size", base)


def weak_scaling(
    throughput_1: float, throughput_n: float, world_size: int, base_world_size: int = 1
) -> tuple[float, float]:
    """Speed-up and efficiency of weak scaling (fixed batch per rank).

    Args:
        throughput_1: global samples per second at ``base_world_size`` ranks.
        throughput_n: global samples per second at ``world_size`` ranks.
        world_size: ranks of the measurement.
        base_world_size: ranks of the baseline; 1 unless no 1-rank run exists.

    Returns:
        (throughput_n / throughput_1, that divided by the growth in ranks).

    Raises:
        ValueError: a throughput that is not > 0, or a world size below 1.

    Example:
        >>> weak_scaling(100.0, 360.0, 4)
        (3.6, 0.9)
    """
    _check_pair(throughput_1, throughput_n, world_size, base_world_size)
    speedup = throughput_n / throughput_1
    return speedup, speedup * base_world_size / world_size


def strong_scaling(
    seconds_1: float, seconds_n: float, world_size: int, base_world_size: int = 1
) -> tuple[float, float]:
    """Speed-up and efficiency of strong scaling (fixed global batch).

    Args:
        seconds_1: seconds per step at ``base_world_size`` ranks.
        seconds_n: seconds per step of the same global batch at ``world_size`` ranks.
        world_size: ranks of the measurement.
        base_world_size: ranks of the baseline; 1 unless no 1-rank run exists.

    Returns:
        (T_1 / T_N, that divided by the growth in ranks).

    Raises:
        ValueError: a time that is not > 0, or a world size below 1.

    Example:
        >>> strong_scaling(0.4, 0.125, 4)
        (3.2, 0.8)
    """
    _check_pair(seconds_1, seconds_n, world_size, base_world_size)
    speedup = seconds_1 / seconds_n
    return speedup, speedup * base_world_size / world_size


def add_speedups(rows: list[ScalingRow], baselines: Sequence[ScalingRow] = ()) -> None:
    """Set each row's speed-up and efficiency against the smallest world size of its
    mode among ``rows`` and ``baselines`` (an earlier run's rows)."""
    for mode in MODES:
        mine = [r for r in rows if r.mode == mode]
        if not mine:
            continue
        base = min([*mine, *(b for b in baselines if b.mode == mode)], key=_ranks)
        formula, name = _FORMULAS[mode]
        for r in mine:
            r.base_world_size = base.world_size
            pair = getattr(base, name), getattr(r, name)
            r.speedup, r.efficiency = formula(*pair, r.world_size, base.world_size)


# Each mode's formula and the row's figure it compares.
_FORMULAS = {
    "weak": (weak_scaling, "samples_per_second"),
    "strong": (strong_scaling, "step_seconds"),
}


def why_not_comparable(
    first: tuple[str, int, Sequence[ScalingRow]],
    second: tuple[str, int, Sequence[ScalingRow]],
) -> str | None:
    """Why two runs, each ``(model, image_size, rows)``, cannot share a baseline (weak
    scaling keeps the batch per rank, strong the global batch); None if they can."""
    (model_a, size_a, rows_a), (model_b, size_b, rows_b) = first, second
    if (model_a, size_a) != (model_b, size_b):
        return f"{model_a} at {size_a}px against {model_b} at {size_b}px"
    for a in rows_a:
        batch = "batch_per_rank" if a.mode == "weak" else "global_batch"
        for b in (b for b in rows_b if b.mode == a.mode):
            if getattr(a, batch) != getattr(b, batch):
                return (
                    f"{a.mode} scaling with {batch} {getattr(a, batch)} against "
                    f"{getattr(b, batch)}"
                )
    return None


# ------------------------------------------------------------------ results
@dataclass
class ScalingRow:
    """One world size in one mode; times are seconds per step, the median of the
    slowest rank's.

    Attributes:
        step_seconds: a DDP step; compute_seconds: the same under ``no_sync()``.
        comm_seconds: ``step_seconds - compute_seconds``: communication waited for.
        allreduce_seconds: time some bucket's all-reduce was in flight (rank 0).
        predicted_allreduce_seconds: the alpha-beta model's all-reduce of the
            gradient (0 on one rank; None without alpha and beta).
        speedup, efficiency: against ``base_world_size``, the mode's smallest.
        step_times, compute_times: every timed step, a list per rank.
        fit_sizes, fit_seconds: all-reduces timed for the alpha-beta fit.
    """

    mode: str
    world_size: int
    batch_per_rank: int
    global_batch: int
    threads_per_rank: int
    samples_per_second: float
    step_seconds: float
    compute_seconds: float
    comm_seconds: float
    allreduce_seconds: float
    predicted_allreduce_seconds: float | None = None
    alpha: float | None = None
    beta: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    base_world_size: int = 1
    step_times: list[list[float]] = field(default_factory=list)
    compute_times: list[list[float]] = field(default_factory=list)
    allreduce_times: list[float] = field(default_factory=list)
    fit_sizes: list[int] = field(default_factory=list)
    fit_seconds: list[float] = field(default_factory=list)


@dataclass
class ScalingResult:
    """Rows of a scaling run and what they were measured on: ``table()``,
    ``explain()``, ``save(prefix)``; drawn by
    :func:`workshop.bench.scaling_plots.plot_scaling`."""

    rows: list[ScalingRow]
    model: str
    image_size: int
    parameters: int
    gradient_bytes: int
    steps: int
    warmup: int
    backend: str
    device: str
    launcher: str
    alpha_beta_source: str
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""

    def row(self, mode: str, world_size: int) -> ScalingRow:
        """The row of ``mode`` at ``world_size`` ranks.

        Raises:
            KeyError: no such row; the message lists those there are.
        """
        for row in self.rows:
            if row.mode == mode and row.world_size == world_size:
                return row
        there = [(r.mode, r.world_size) for r in self.rows]
        raise KeyError(
            f"no row for mode={mode!r}, world_size={world_size}; have {there}"
        )

    def table(self) -> str:
        """The rows as a table at most 88 characters wide, times in ms per step."""
        names = [f"{n:>{w}}" for n, w in _TABLE_COLUMNS]  # all right-aligned but mode
        lines = [f"{'':49}{'ms per step':^22}{'all-reduce ms':>17}", "".join(names)]
        lines[1] = f"{'mode':<6}" + lines[1][6:]
        for r in self.rows:
            p = r.predicted_allreduce_seconds
            lines.append(
                f"{r.mode:<6}{r.world_size:>6}{r.batch_per_rank:>11}"
                f"{r.samples_per_second:>10,.0f}{_fmt(r.speedup, '.2f'):>9}"
                f"{_fmt(r.efficiency, '.0%'):>7}{r.step_seconds * 1e3:>7.1f}"
                f"{r.compute_seconds * 1e3:>8.1f}{r.comm_seconds * 1e3:>7.1f}"
                f"{_fmt(None if p is None else p * 1e3, '.1f'):>7}"
                f"{r.allreduce_seconds * 1e3:>10.1f}"
            )
        return "\n".join(lines)

    def explain(self) -> list[str]:
        """Sentences that explain the rows with the gradient's size and the model."""
        lines = [
            f"gradients: {self.gradient_bytes / 1e6:.2f} MB ({self.parameters:,} "
            f"parameters); alpha and beta: {self.alpha_beta_source}"
        ]
        for r in self.rows:
            if r.world_size == 1:
                continue
            comm, step = r.comm_seconds, r.step_seconds
            p = r.predicted_allreduce_seconds
            text = f"{r.mode}, {r.world_size} ranks: "
            if p is not None:
                text += (
                    f"predicted all-reduce {p * 1e3:.2f} ms vs compute "
                    f"{r.compute_seconds * 1e3:.2f} ms per step -> communication at "
                    f"most {p / (p + r.compute_seconds):.0%} of a step; "
                )
            text += (
                f"measured: {comm * 1e3:.2f} ms of each {step * 1e3:.2f} ms step "
                f"waited for communication ({comm / step:.0%}), all-reduce in flight "
                f"{r.allreduce_seconds * 1e3:.2f} ms"
            )
            if p is not None and comm > 2 * p + 1e-3:
                text += (
                    "; more than the model predicts, because a step also waits for "
                    "the slowest rank, and ranks that share cores slow each other"
                )
            lines.append(text)
        bases = sorted({r.base_world_size for r in self.rows})
        if bases != [1]:
            lines.append(
                f"speed-up and efficiency are relative to {', '.join(map(str, bases))} "
                "rank(s), the smallest world size measured, not to one rank"
            )
        lines += self._noise()
        cores = self.machine.get("cpu_count") or 0
        least = min(self.rows, key=_ranks)
        most = max(self.rows, key=_ranks)
        n = most.world_size
        if self.device == "CPU" and cores and n > 1:
            threads = ranks_text(least.threads_per_rank, "thread")
            if least.world_size == n:  # one world size: a step of a batch job
                text = (
                    f"on the CPU the {n} ranks share this machine's {cores} cores, "
                    f"each computing with {threads}"
                )
            else:
                text = (
                    f"on the CPU the ranks share this machine's {cores} cores: with "
                    f"{ranks_text(least.world_size)}, each rank computes with "
                    f"{threads}; with {n} ranks, with "
                    f"{ranks_text(most.threads_per_rank, 'thread')}"
                )
            if (
                least.world_size < n
                and least.world_size * least.threads_per_rank >= cores
            ):
                text += (
                    f"; {ranks_text(least.world_size)} already "
                    f"{'keeps' if least.world_size == 1 else 'keep'} all {cores} cores "
                    "busy, so more ranks split the same cores and the throughput "
                    "cannot grow much"
                )
            if n > cores:
                text += f"; {n} ranks on {cores} cores also take turns"
            lines.append(
                text + ". That measures this machine, not DDP: give each rank its "
                "own GPU, or its own cores, to see DDP scale"
            )
        return lines

    def _noise(self) -> list[str]:
        """Lines for rows of both modes that did the same work in times that differ."""
        lines = []
        for weak in (r for r in self.rows if r.mode == "weak"):
            for strong in self.rows:
                work = strong.world_size, strong.batch_per_rank
                if strong.mode != "strong" or work != (
                    weak.world_size,
                    weak.batch_per_rank,
                ):
                    continue
                fast, slow = sorted([weak.step_seconds, strong.step_seconds])
                if slow > 1.25 * fast:
                    lines.append(
                        f"check: at {ranks_text(weak.world_size)} the weak and "
                        "strong runs did the same work but took "
                        f"{weak.step_seconds * 1e3:.1f} and "
                        f"{strong.step_seconds * 1e3:.1f} ms per step; something "
                        "else was using the machine, so run again when it is idle"
                    )
        return lines

    def report(self) -> str:
        """What the command prints: what was measured, the table, the explanation."""
        v, m = self.versions, self.machine
        head = (
            f"DDP scaling of {self.model} ({self.parameters:,} parameters, "
            f"{self.image_size}px synthetic images), {self.backend} on {self.device}, "
            f"{m.get('cpu_count')} cores, torch {v.get('torch')}; {self.steps} timed "
            f"steps after {self.warmup} warm-up, per world size and mode"
        )
        # Each sentence wrapped at 88 columns: a notebook's output, a batch job's
        # log and a projector all show that much without wrapping it mid-word.
        wrapped = [
            textwrap.fill(line, _WIDTH, subsequent_indent="  ", break_on_hyphens=False)
            for line in [head, *self.explain()]
        ]
        return "\n".join([wrapped[0], "", self.table(), "", *wrapped[1:]])

    def to_json(self) -> str:
        """What :meth:`save` writes to ``prefix.json``, which ``load_scaling`` reads."""
        return json.dumps({"kind": KIND, **asdict(self)}, indent=1)

    def save(self, prefix: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``prefix.json`` and ``prefix.csv`` (a row per world size and mode)."""
        prefix = Path(prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        json_path = prefix.with_name(prefix.name + ".json")
        csv_path = prefix.with_name(prefix.name + ".csv")
        json_path.write_text(self.to_json())
        with open(csv_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(_CSV_COLUMNS)
            for r in self.rows:
                writer.writerow(self._csv_row(r))
        return json_path, csv_path

    def _csv_row(self, r: ScalingRow) -> list[Any]:
        m, v = self.machine, self.versions
        return [
            r.mode, r.world_size, r.samples_per_second, r.speedup, r.efficiency,
            r.batch_per_rank, r.global_batch, r.threads_per_rank, r.step_seconds,
            r.compute_seconds, r.comm_seconds, r.allreduce_seconds,
            r.predicted_allreduce_seconds, r.alpha, r.beta, self.alpha_beta_source,
            self.model, self.image_size, self.gradient_bytes, self.backend,
            self.device, m.get("host"), m.get("cpu_count"), v.get("python"),
            v.get("torch"), json.dumps(r.step_times), json.dumps(r.compute_times),
        ]  # fmt: skip


_WIDTH = 88  # characters of a printed line
# The table's columns: (heading, width); times in ms, grouped by a heading above.
_TABLE_COLUMNS = [("mode", 6), ("ranks", 6), ("batch/rank", 11), ("samples/s", 10),
                  ("speed-up", 9), ("effic.", 7), ("step", 7), ("compute", 8),
                  ("comm", 7), ("pred.", 7), ("in flight", 10)]  # fmt: skip

_CSV_COLUMNS = [
    "mode", "ranks", "throughput", "speedup", "efficiency", "batch_per_rank",
    "global_batch", "threads_per_rank", "step_s", "compute_s", "comm_s",
    "allreduce_s", "predicted_allreduce_s", "alpha", "beta", "alpha_beta_source",
    "model", "image_size", "gradient_bytes", "backend", "device", "host",
    "cpu_count", "python", "torch", "step_times_s", "compute_times_s",
]  # fmt: skip


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ranks(row: ScalingRow) -> int:
    return row.world_size


def ranks_text(n: int, what: str = "rank") -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


# ------------------------------------------------------------------ assembling
def _row(raw: dict[str, Any], ab: tuple[float, float] | None) -> ScalingRow:
    n = raw["world_size"]
    step = max(statistics.median(t) for t in raw["step_seconds"])
    compute = max(statistics.median(t) for t in raw["compute_seconds"])
    predicted = None
    if n == 1:
        predicted = 0.0
    elif ab is not None:
        predicted = ring_all_reduce_time(raw["gradient_bytes"], n, ab[0], ab[1])
    return ScalingRow(
        mode=raw["mode"],
        world_size=n,
        batch_per_rank=raw["batch_per_rank"],
        global_batch=raw["global_batch"],
        threads_per_rank=raw["threads_per_rank"],
        samples_per_second=raw["global_batch"] / step,
        step_seconds=step,
        compute_seconds=compute,
        comm_seconds=max(0.0, step - compute),
        allreduce_seconds=statistics.median(raw["allreduce_seconds"]),
        predicted_allreduce_seconds=predicted,
        alpha=ab[0] if ab and n > 1 else None,
        beta=ab[1] if ab and n > 1 else None,
        step_times=raw["step_seconds"],
        compute_times=raw["compute_seconds"],
        allreduce_times=raw["allreduce_seconds"],
        fit_sizes=raw["fit_sizes"],
        fit_seconds=raw["fit_seconds"],
    )


def check_baseline(
    baseline: ScalingResult, first: dict, rows: list[ScalingRow]
) -> None:
    """A baseline must have measured the same thing at another world size."""
    why = why_not_comparable(
        (baseline.model, baseline.image_size, baseline.rows),
        (first["model"], first["image_size"], rows),
    )
    if why:
        raise ValueError(
            f"the baseline cannot be compared with this run: it measured {why}; "
            "pass a baseline of the same model and image size, or --batch and "
            "--global-batch to match it"
        )


def assemble(
    raws: list[dict[str, Any]],
    *,
    steps: int,
    warmup: int,
    launcher: str,
    given: tuple[float, float, str] | None,
    baseline: ScalingResult | None = None,
) -> ScalingResult:
    """A :class:`ScalingResult` from rank 0's dict of each launch of ``scaling_worker``.

    Args:
        given: (alpha, beta, where from), or None to fit them, one fit per world
            size, to the all-reduces the workers timed.
        baseline: an earlier run whose rows may hold the smallest world size.
    """
    import torch

    fits: dict[int, tuple[float, float]] = {}
    for raw in raws:
        n = raw["world_size"]
        if given is None and raw["fit_seconds"] and n not in fits:
            fit = fit_alpha_beta(raw["fit_sizes"], raw["fit_seconds"], n)
            fits[n] = (fit.alpha, fit.beta)
    rows = [_row(r, given[:2] if given else fits.get(r["world_size"])) for r in raws]
    if baseline is not None:
        check_baseline(baseline, raws[0], rows)
    add_speedups(rows, baseline.rows if baseline else ())
    if given is not None:
        source = given[2]
    elif fits:
        source = "fitted in this run to all-reduces of 4 sizes at each world size"
    else:
        source = "none (pass --alpha and --beta for a prediction)"
    machine = {"host": platform.node(), "system": platform.platform()}
    machine["processor"] = platform.processor() or platform.machine()
    machine["cpu_count"] = os.cpu_count()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["cuda"] = str(torch.version.cuda)
    same = ("model", "image_size", "parameters", "gradient_bytes", "backend", "device")
    return ScalingResult(
        **{name: raws[0][name] for name in same},
        rows=rows,
        steps=steps,
        warmup=warmup,
        launcher=launcher,
        alpha_beta_source=source,
        machine=machine,
        versions=versions,
        created=datetime.datetime.now().isoformat(timespec="seconds"),
    )
