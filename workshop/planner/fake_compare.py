"""The estimate beside the framework: formula against fake-backend measurement.

:func:`compare` puts an :class:`~workshop.planner.estimator.Estimate` (the
estimator's formulas, :mod:`workshop.planner.estimator`) next to a
:class:`~workshop.planner.fake_world.FakeReport` (what FSDP2, DTensor and DDP
really held and sent on one rank of the fake world), term by term, and says why each
term that differs by more than the tolerance differs: padding, a dtype the framework
keeps, a collective it splits in two. A difference no known reason covers is said to
be unexplained, never hidden.

    from workshop.planner.estimator import estimate
    layout = Layout(dp=128, tp=8, zero=3)
    report = fake_run("transformer-8b", layout, rank=5)
    print(compare(estimate("transformer-8b", layout, stage=0), report))
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass

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
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float))
        or not (0 < tolerance < 1)
    ):
        raise ValueError(f"tolerance={tolerance!r}: give a fraction, e.g. 0.03 for 3 %")
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


def _near(value: float, target: float, slack: float = 0.05) -> bool:
    return abs(value - target) <= slack * abs(target)


def _memory_reason(
    term: str, est: float, got: float, layout: Layout, report: FakeReport
) -> str:
    ratio = got / est if est else math.inf
    reasons = []
    if (
        layout.tp > 1
        and layout.dp == 1
        and term in ("gradients", "state total")
        and ratio > 1
    ):
        reasons.append(
            "DTensor hands the vocabulary-parallel embedding its gradient whole "
            "(placement Replicate, V x h on every tp rank) where the formula splits it "
            "by tp; FSDP would reduce-scatter it, here nothing does"
        )
    if (
        layout.pp > 1
        and report.coordinates["pp"] == layout.pp - 1
        and ratio > 1
        and "tied" in " ".join(report.notes)
    ):
        reasons.append(
            "a tied model's last stage holds its own copy of the embedding as the head"
        )
    if layout.zero == 2 and term in ("parameters", "state total") and ratio < 1:
        reasons.append(
            "FSDP2's reshard_after_forward=False keeps the gathered parameters "
            "from the forward to the backward pass only; after it they are sharded "
            "again, so between steps it holds 1/dp like ZeRO-3. The ZeRO paper's "
            "stage 2 keeps all parameters (fp16) and gathers the updated ones after "
            "the step"
        )
    if layout.zero >= 2 and layout.dp > 1 and 1 < ratio < 1.25:
        reasons.append(
            "FSDP2 shards each parameter by rows, ceil(rows / dp) per rank, and pads "
            "the storage of the last ranks to that: a matrix whose rows do not divide "
            "by dp holds a little more than 1/dp"
        )
    if term == "optimizer" and layout.zero >= 2 and layout.dp > 1 and 0.75 < ratio < 1:
        reasons.append(
            "Adam's moments take the shape of this rank's shard without FSDP's "
            "padding: with ceil(rows / dp) rows per rank, the last ranks get fewer "
            "rows (or none), so they hold less than 1/dp of the optimizer state "
            "while their padded parameter storage is full size"
        )
    if term == "optimizer" and 1 < ratio < 1.25:
        reasons.append(
            "Adam keeps a step counter (4 B) per parameter tensor beside "
            "its two moments"
        )
    if (
        layout.precision == "bf16"
        and layout.zero < 3
        and term != "state total"
        and (_near(ratio, 2) or _near(ratio, 8 / 12))
    ):
        reasons.append(
            f"{_keeper(report)} keeps fp32 parameters and gradients and Adam's two "
            "fp32 moments (4 + 4 + 8 B per parameter, bf16 only for compute), where "
            "the formula books the ZeRO paper's mixed precision, 2 + 2 + 12 B (fp16 "
            "parameters and gradients; the fp32 master copy with the optimizer)"
        )
    if layout.precision == "bf16" and layout.zero == 1 and term == "state total":
        reasons.append(
            "with the optimizer sharded, where the fp32 master copy sits matters: the "
            "paper keeps it in each rank's optimizer shard (12 B / dp), PyTorch keeps "
            "fp32 parameters whole on every rank (4 B) and shards only the moments"
        )
    if not reasons:
        return (
            "not explained by a known rule: read the estimate's formula for "
            f"{term!r} and the report's notes"
        )
    return "; ".join(reasons)


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
    kind, dim = key.split()
    ratio = got / est if est else math.inf
    bf16 = layout.precision == "bf16"
    if key == "send_recv pp":
        return "counted from the split on both sides (the fake step runs one stage)"
    reasons = []
    if layout.zero == 1 and kind in ("broadcast", "all_reduce") and est == 0:
        reasons.append(
            "ZeroRedundancyOptimizer is not the paper's stage 1: DDP all-reduces the "
            "whole gradient, and after the step each rank broadcasts the parameters "
            "it owns (one broadcast per parameter tensor), where ZeRO reduce-scatters "
            "the gradients and all-gathers the parameters"
        )
    if layout.zero == 1 and kind in ("reduce_scatter", "all_gather") and got == 0:
        reasons.append(
            "ZeroRedundancyOptimizer sends no reduce-scatter or all-gather: it "
            "all-reduces (DDP) and broadcasts instead"
        )
    if layout.zero == 2 and kind in ("all_gather", "reduce_scatter"):
        reasons.append(
            "FSDP2 with reshard_after_forward=False gathers each block once per "
            "micro-batch (forward) and reduce-scatters each block's gradient; the "
            "ZeRO paper's stage 2 reduce-scatters bucket by bucket and gathers the "
            "updated parameters once a step"
        )
        if kind == "reduce_scatter" and what == "bytes" and bf16:
            reasons.append(
                "FSDP2 reduces in fp32 here (4 B), the formula's stage 2 in bf16 (2 B)"
            )
    if key == "all_reduce dp" and what == "calls":
        reasons.append(
            "DDP's buckets: after its first step DDP rebuilds them in the order the "
            "gradients became ready, the first one small (1 MiB), and a bucket of "
            "fp32 gradients holds half as many values as the formula's bf16 one"
        )
    if key == "all_reduce dp" and what == "bytes" and bf16 and "DDP" in report.wrapper:
        reasons.append(
            "DDP under bf16 autocast all-reduces fp32 gradients (4 B, not 2)"
        )
    if (
        kind == "all_reduce"
        and dim == "tp"
        and what == "bytes"
        and 1 < ratio < 2
        and bf16
        and "FSDP" not in report.wrapper
    ):
        reasons.append(
            "without FSDP, bf16 is autocast: the forward all-reduces carry bf16 "
            "outputs, but the backward ones carry gradients of the residual stream, "
            "which autocast keeps in fp32 (4 B)"
        )
    if (
        kind == "all_reduce"
        and dim == "tp"
        and layout.checkpointing == "full"
        and ratio < 1
    ):
        reasons.append(
            "PyTorch's non-reentrant checkpoint stops recomputing as soon as it has "
            "every tensor the backward pass needs (early stop, its default): the "
            "all-reduce after each block's last layer is not run again, so the "
            "recompute adds 1 all-reduce per block, not Megatron's 2"
        )
    if layout.micro_batches > 1 and dim == "dp" and ratio > 1:
        reasons.append(
            "PyTorch synchronises gradients in every micro-batch unless told not to "
            "(no_sync, set_requires_gradient_sync(False)); the report counts that"
        )
    if not reasons:
        return (
            "not explained by a known rule: read the estimate's formula and the "
            "report's notes"
        )
    return "; ".join(reasons)
