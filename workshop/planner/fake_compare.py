"""The estimate beside the framework: formula against fake-backend measurement.

:func:`compare` sets an :class:`~workshop.planner.estimator.Estimate` beside a
:class:`~workshop.planner.fake_world.FakeReport`, term by term, and names why a term
differs where it can count the cause (padding, a dtype, a split collective); any
other difference is said to be unexplained, never hidden.

    from workshop.planner.estimator import estimate
    layout = Layout(dp=128, tp=8, zero=3)
    report = fake_run("transformer-8b", layout, rank=5)
    print(compare(estimate("transformer-8b", layout, stage=0), report))
"""

from __future__ import annotations

import itertools
import math
import re
import textwrap
from dataclasses import dataclass

from ..checks import message, positive_number
from .estimator import Estimate
from .fake_world import FakeReport
from .layout import Layout

__all__ = ["TOLERANCE", "ComparedTerm", "Comparison", "compare"]

#: Relative difference below which a term agrees (3 %).
TOLERANCE = 0.03
_MEMORY = ("parameters", "gradients", "optimizer")


@dataclass(frozen=True)
class ComparedTerm:
    """One term: the estimate's figure, the framework's, their ratio, and why they
    differ (empty when within the tolerance)."""

    term: str
    estimate: float
    framework: float
    reason: str = ""

    @property
    def ratio(self) -> float:
        """framework / estimate (1 when both are 0, inf when only the estimate is)."""
        if self.estimate == 0:
            return 1.0 if self.framework == 0 else math.inf
        return self.framework / self.estimate


@dataclass(frozen=True)
class Comparison:
    """The rows of :func:`compare`, and the tolerance they were judged with."""

    rows: list[ComparedTerm]
    tolerance: float
    title: str

    def row(self, term: str) -> ComparedTerm:
        """The row of ``term`` ("parameters", "all_gather dp calls", ...)."""
        for r in self.rows:
            if r.term == term:
                return r
        raise ValueError(
            f"no term {term!r}; the terms are " + ", ".join(r.term for r in self.rows)
        )

    def differing(self) -> list[ComparedTerm]:
        """The rows outside the tolerance."""
        return [r for r in self.rows if abs(r.ratio - 1) > self.tolerance]

    def table(self) -> str:
        """The table, at most 88 columns; each differing term's reason below it."""
        lines = [
            *textwrap.wrap(self.title, 88),
            f"{'term':<26}{'estimate':>18}{'framework':>18}{'ratio':>9}  ok",
        ]
        for r in self.rows:
            ok = "yes" if abs(r.ratio - 1) <= self.tolerance else "NO"
            ratio = "inf" if math.isinf(r.ratio) else f"{r.ratio:.3f}"
            lines.append(
                f"{r.term:<26}{_fmt(r.estimate):>18}{_fmt(r.framework):>18}"
                f"{ratio:>9}  {ok}"
            )
            if ok == "NO":
                lines += textwrap.wrap(
                    r.reason, 88, initial_indent="    ", subsequent_indent="    "
                )
        lines.append(
            f"(ok: within {self.tolerance:.0%}; bytes per rank; collectives per "
            "step, bytes of the full tensors)"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) < 1e13 else f"{value:.4g}"


def compare(
    estimate: Estimate, report: FakeReport, tolerance: float = TOLERANCE
) -> Comparison:
    """The estimate's memory and collectives against the framework's, term by term.

    Args:
        estimate: the estimator's record for the same model, layout and pipeline
            stage as the report (``estimate(model, layout, stage=report's pp)``).
        report: what :func:`~workshop.planner.fake_world.fake_run` measured.
        tolerance: relative difference below which a term agrees.

    Returns:
        A :class:`Comparison`; ``print`` it for the table.

    Raises:
        ValueError: a tolerance outside (0, 1), or an estimate of another model,
            layout or stage than the report's.

    Example:
        >>> print(compare(est, report))  # doctest: +SKIP
    """
    if positive_number("tolerance", tolerance, 1, "a fraction", "e.g. 0.03") >= 1:
        raise ValueError(message("tolerance", "a fraction below 1", tolerance))
    layout = estimate.layout
    if layout.describe() != report.layout or estimate.model.name != report.model:
        raise ValueError(
            f"the estimate is of {estimate.model.name} with {layout.describe()}, the "
            f"report of {report.model} with {report.layout}: compare the same layout"
        )
    stage = report.coordinates["pp"]
    said = re.search(r"stage (\d+) of", estimate.formulas.get("stage", ""))
    if said and int(said.group(1)) != stage:
        raise ValueError(
            f"the estimate is of pipeline stage {said.group(1)}, rank {report.rank} is "
            f"on stage {stage}: estimate(..., stage={stage})"
        )
    rows = []
    for term in _MEMORY:
        est, got = float(estimate.memory.get(term, 0.0)), float(report.held[term])
        rows.append(
            ComparedTerm(term, est, got, _memory_reason(term, est, got, layout, report))
        )
    est = sum(float(estimate.memory.get(t, 0.0)) for t in _MEMORY)
    got = float(sum(report.held[t] for t in _MEMORY))
    reason = _memory_reason("state total", est, got, layout, report)
    rows.append(ComparedTerm("state total", est, got, reason))
    for key in sorted(set(estimate.collectives) | set(report.collectives)):
        e_n, e_b = estimate.collectives.get(key, (0, 0.0))
        f_n, f_b = report.collectives.get(key, (0, 0))
        for what, e, f in (("calls", e_n, f_n), ("bytes", e_b, f_b)):
            reason = _collective_reason(key, what, float(e), float(f), layout, report)
            rows.append(ComparedTerm(f"{key} {what}", float(e), float(f), reason))
    title = (
        f"{report.model}, {report.layout}, rank {report.rank} of "
        f"{report.world_size} (stage {stage}): estimate against {report.wrapper}"
    )
    return Comparison(rows, tolerance, title)


#: Bytes by which a difference may miss the sum of its computed causes and still be
#: explained by them: the estimate rounds each term up to a whole byte, and the
#: even share Ψ/dp of a count that does not divide is a fraction.
SLACK = 8
#: Bytes of Adam's ``step`` per parameter tensor: a float32 scalar tensor in torch
#: 2.15 when neither ``capturable`` nor ``fused`` (measured:
#: ``Adam([p]).step(); state[p]["step"]`` is ``torch.float32``, shape ``()``).
ADAM_STEP_BYTES = 4


def _tensors(layout: Layout, report: FakeReport) -> list[tuple[float, float, int]]:
    """Each parameter tensor of the stage as (padded storage, even share, local
    values), from the report's shard shapes: FSDP2 pads dim 0 to ``ceil(rows / dp)``."""
    blocks = report.stage_layers[1] - report.stage_layers[0]
    tied = any("tied embedding" in n for n in report.notes)
    fsdp = "FSDP" in report.wrapper and layout.dp > 1
    out = []
    for name, (whole, local) in report.shards.items():
        rest = math.prod(local[1:])
        if not fsdp:
            rows, dp = local[0], 1
        elif len(whole) > 1 and local[1] < whole[1]:  # tp cut the columns
            rows, dp = whole[0], layout.dp
        elif len(whole) > 1 and layout.tp > 1 and not (tied and "embed" in name):
            rows, dp = whole[0] // layout.tp, layout.dp  # tp cut the rows
        else:
            rows, dp = whole[0], layout.dp
        entry = (-(-rows // dp) * rest, rows * rest / dp, local[0] * rest)
        out += [entry] * (blocks if name.startswith("blocks.0.") else 1)
    return out


def _owned_by_zero1(sizes: list[int], dp: int, rank: int) -> list[int]:
    """The tensors ZeroRedundancyOptimizer gives dp rank ``rank``: largest first,
    each to the rank holding the fewest values so far (its _partition_parameters)."""
    held, owned = [0] * dp, []
    for size in sorted(sizes, reverse=True):
        least = held.index(min(held))
        held[least] += size
        if least == rank:
            owned.append(size)
    return owned


def _memory_causes(
    term: str, layout: Layout, report: FakeReport
) -> list[tuple[str, float]]:
    """The computed causes of a memory term's difference, as (cause, bytes)."""
    tensors = _tensors(layout, report)
    fsdp = "FSDP" in report.wrapper and layout.dp > 1
    even = sum(e for _, e, _ in tensors)
    causes: list[tuple[str, float]] = []
    if term in ("parameters", "gradients"):
        # PyTorch keeps fp32 parameters and gradients (bf16 only for compute);
        # FSDP2 shards them on dp with zero 2 and 3, DDP keeps them whole.
        causes.append(("formula", 4 * even))
        if fsdp:
            padding = 4 * sum(p - e for p, e, _ in tensors)
            causes.append(
                (
                    f"FSDP2's padding: dim 0 of each of the {len(tensors)} tensors "
                    f"cut into ceil(rows / {layout.dp}) rows, every rank's storage "
                    "padded to that",
                    padding,
                )
            )
        return causes
    # optimizer: Adam's two fp32 moments of what this rank steps, and a step each
    if layout.zero == 1 and layout.dp > 1:
        sizes = [int(v) for _, _, v in tensors]
        owned = _owned_by_zero1(sizes, layout.dp, report.coordinates["dp"])
        causes.append(("formula", 8 * sum(sizes) / layout.dp))
        causes.append(
            (
                f"ZeroRedundancyOptimizer gives each rank whole tensors, largest "
                f"first to the emptiest rank: this one steps {len(owned)} tensors, "
                f"{sum(owned):,} values against the even {sum(sizes) / layout.dp:,.0f}",
                8 * (sum(owned) - sum(sizes) / layout.dp),
            )
        )
        count = len(owned)
    else:
        causes.append(("formula", 8 * even))
        if fsdp:
            causes.append(
                (
                    "Adam's moments take the shape of this rank's unpadded chunk "
                    "(ceil(rows / dp) rows, fewer or none on the last ranks)",
                    8 * sum(v - e for _, e, v in tensors),
                )
            )
        count = len(tensors)
    causes.append(
        (
            f"Adam's step counters: {count} tensors x {ADAM_STEP_BYTES} B (a float32 "
            "scalar each)",
            ADAM_STEP_BYTES * count,
        )
    )
    return causes


def _explain(
    est: float, start: float, got: float, causes: list[tuple[str, float]], base: str
) -> str:
    """Name the causes when they add up to ``got - start`` (within :data:`SLACK`);
    else say how much is unexplained."""
    named = [(c, b) for c, b in causes if round(b) != 0]
    left = got - start - sum(b for _, b in named)
    if base:
        named.insert(0, (base, 0.0))
    if abs(left) <= SLACK:
        return "; ".join(f"{c}: {b:+,.0f} B" if b else c for c, b in named)
    share = f"{left / est:+.1%}" if est else "of 0"
    said = "; ".join(f"{c}: {b:+,.0f} B" if b else c for c, b in named)
    return (said + "; " if said else "") + f"unexplained: {left:+,.0f} B ({share})"


def _booked(term: str, est: float, layout: Layout, report: FakeReport) -> bool:
    """Whether ``est`` is a bytes-per-parameter table times this rank's parameters:
    only then is the difference put down to the bytes per parameter."""
    tensors = _tensors(layout, report)
    fsdp = "FSDP" in report.wrapper and layout.dp > 1
    values = sum(e for _, e, _ in tensors) * (layout.dp if fsdp else 1)
    cuts = (1, layout.dp)
    options = {
        "parameters": [(b,) for b in (2, 4)],
        "gradients": [(b,) for b in (2, 4)],
        "optimizer": [(b,) for b in (8, 12)],
        "state total": [(2, 2, 12), (4, 4, 8)],
    }[term]
    for sizes in options:
        for split in itertools.product(cuts, repeat=len(sizes)):
            booked = sum(-(-b * values // d) for b, d in zip(sizes, split, strict=True))
            if abs(est - booked) <= SLACK * len(sizes):
                return True
    return False


def _memory_reason(
    term: str, est: float, got: float, layout: Layout, report: FakeReport
) -> str:
    terms = _MEMORY if term == "state total" else (term,)
    causes = [c for t in terms for c in _memory_causes(t, layout, report)]
    framework = sum(b for c, b in causes if c == "formula")
    causes = [c for c in causes if c[0] != "formula"]
    base = ""
    sharded = "FSDP" in report.wrapper or "Zero" in report.wrapper
    shard = f", sharded as {report.wrapper} does" if sharded else ""
    if round(framework - est) != 0 and _booked(term, est, layout, report):
        # the state's own layout: what PyTorch keeps, evenly shared, against the
        # formula's bytes per parameter
        base = (
            f"{_keeper(report)} keeps fp32 parameters and gradients and Adam's two "
            f"fp32 moments (4 + 4 + 8 B per parameter){shard}: {framework:,.0f} B "
            f"evenly shared, where the formula books {est:,.0f} B"
        )
    return _explain(est, framework if base else est, got, causes, base)


def _keeper(report: FakeReport) -> str:
    if "FSDP" in report.wrapper:
        return "FSDP2 (MixedPrecisionPolicy(param_dtype=bf16))"
    if "DDP" in report.wrapper:
        return (
            f"PyTorch's {report.wrapper.replace(' + ', ' with ')} under bf16 autocast"
        )
    return "PyTorch under bf16 autocast"


def _collective_reason(
    key: str, what: str, est: float, got: float, layout: Layout, report: FakeReport
) -> str:
    """A collective's difference, put down to a cause only where the cause's own
    count gives the framework's figure; otherwise the part left unexplained."""
    kind, dim = key.split()
    unit = "B" if what == "bytes" else "calls"
    if got == 0 and est:
        return f"{report.wrapper} does not call {kind} on {dim}: {-est:+,.0f} {unit}"
    if what == "bytes" and abs(got - 2 * est) <= SLACK and est:
        return (
            f"{report.wrapper} sends fp32 (4 B) where the formula books bf16 (2 B): "
            f"{got - est:+,.0f} B"
        )
    mb = layout.micro_batches
    values = sum(v for _, _, v in _tensors(layout, report))
    ddp = "DDP" in report.wrapper and key == "all_reduce dp" and what == "bytes"
    if ddp and abs(got - 4 * values * mb) <= SLACK:
        return (
            f"DDP all-reduces fp32 gradients, {values:,} values x 4 B in each of "
            f"{mb} micro-batch(es): {got - est:+,.0f} B"
        )
    if "ZeroRedundancy" in report.wrapper and key == "broadcast dp":
        count = len(_tensors(layout, report)) if what == "calls" else 4 * values
        if got == count:
            return (
                "ZeroRedundancyOptimizer broadcasts each fp32 parameter tensor from "
                f"its owner after the step: {got - est:+,.0f} {unit}"
            )
    if mb > 1 and dim == "dp" and est and abs(got - mb * est) <= SLACK:
        return (
            f"PyTorch synchronises gradients in each of the {mb} micro-batches "
            f"(no no_sync), the formula once a step: {got - est:+,.0f} {unit}"
        )
    share = f"{(got - est) / est:+.1%}" if est else "of 0"
    return f"unexplained: {got - est:+,.0f} {unit} ({share})"
