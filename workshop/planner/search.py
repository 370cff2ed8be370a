"""Reading estimates and searching layouts: :func:`describe_estimate` and :func:`table`
print :class:`~workshop.planner.estimator.Estimate` records in 88 columns, and
:func:`best_layouts` tries every layout of a number of GPUs with
:func:`~workshop.planner.estimator.estimate` and ranks those that fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from .estimator import Estimate, estimate
from .hardware import GPU, Network
from .layout import Layout, ModelShape, check_counts, model_shape
from .step_time import gpu_record, network_record

__all__ = ["best_layouts", "describe_estimate", "table"]


def _throughput(est: Estimate) -> float:
    """Tokens (a module: samples) per second per GPU."""
    per_sample = est.model.seq if est.model.kind == "transformer" else 1
    return est.layout.global_batch * per_sample / est.step / est.layout.world_size


def describe_estimate(est: Estimate) -> str:
    """A text summary of one estimate, at most 88 columns: memory by term against the
    GPU's capacity, time by term against the step, and the throughput.

    Example:
        >>> from workshop.planner.estimator import estimate
        >>> print(describe_estimate(estimate("tiny", Layout(dp=2))).splitlines()[0])
        tiny on 2 x H100 80GB (8 per node), NVLink 4 + NDR 400G
    """
    lay, cap = est.layout, est.gpu.memory_bytes
    capacity = f"% of {est.gpu.memory_gb:g} GB"
    unit = "tokens" if est.model.kind == "transformer" else "samples"
    stage = _stage_label(est)
    lines = [
        f"{est.model.name} on {lay.world_size} x {est.gpu.name} "
        f"({est.gpus_per_node} per "
        f"node), {est.network.name}"[:88],
        f"{lay.describe()}{stage}"[:88],
        f"{'memory per GPU':<22}{'GB':>10}{capacity:>14}",
    ]
    for name, value in est.memory.items():
        lines.append(f"  {name:<20}{value / 1e9:>10.2f}{100 * value / cap:>14.1f}")
    verdict = "fits" if est.fits else "DOES NOT FIT"
    lines.append(
        f"  {'total':<20}{est.memory_total / 1e9:>10.2f}"
        f"{100 * est.memory_total / cap:>14.1f}  {verdict}"
    )
    lines.append(f"{'time per step':<22}{'ms':>10}{'% of step':>14}")
    for name, value in est.time.items():
        lines.append(f"  {name:<20}{value * 1e3:>10.2f}{100 * value / est.step:>14.1f}")
    lines.append(
        f"  {'step':<20}{est.step * 1e3:>10.2f}{100.0:>14.1f}"
        "  (dp comm: only what outlasts compute)"
    )
    lines.append(f"{_throughput(est):,.0f} {unit}/s per GPU")
    return "\n".join(line[:88] for line in lines)


def _stage_label(est: Estimate) -> str:
    """``  [stage i of p]`` for a pipeline, else empty."""
    if est.layout.pp == 1:
        return ""
    text = est.formulas["stage"]
    here = text[text.index("Here: stage ") + len("Here: stage ") :].split(" ")[0]
    return f"  [stage {here} of {est.layout.pp}]"


def table(estimates: Sequence[Estimate]) -> str:
    """One line per estimate, at most 88 columns: layout, memory per GPU (GB and % of
    the GPU), step (ms), throughput per GPU.

    Example:
        >>> from workshop.planner.estimator import estimate
        >>> print(table([estimate("tiny", Layout(dp=2))]).splitlines()[0].split())
        ['layout', 'GB', 'mem', '%', 'fits', 'step', 'ms', 'tok/s/GPU']
    """
    kinds = {e.model.kind for e in estimates}
    rate = {frozenset({"transformer"}): "tok/s/GPU", frozenset({"module"}): "smp/s/GPU"}
    head = (
        f"{'layout':<44}{'GB':>6}{'mem %':>8}{'fits':>6}{'step ms':>9}"
        f"{rate.get(frozenset(kinds), 'per s/GPU'):>11}"
    )
    lines = [head]
    for est in estimates:
        lines.append(
            f"{est.layout.describe()[:44]:<44}{est.memory_total / 1e9:>6.1f}"
            f"{100 * est.memory_total / est.gpu.memory_bytes:>8.1f}"
            f"{'yes' if est.fits else 'no':>6}{est.step * 1e3:>9.1f}"
            f"{_throughput(est):>11,.0f}"
        )
    return "\n".join(lines)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_layouts(
    model: str | ModelShape,
    gpus: int,
    gpu: str | GPU = "H100 80GB",
    network: str | Network = "NVLink 4 + NDR 400G",
    gpus_per_node: int = 8,
    global_batch: int = 64,
    *,
    precision: str = "bf16",
    zero: Iterable[int] = (0, 1, 2, 3),
    checkpointing: Iterable[str] = ("none", "full"),
    max_micro_batch: int = 16,
    top: int | None = 10,
    mfu: float | None = None,
) -> list[Estimate]:
    """Every layout of ``gpus`` GPUs that fits, fastest step first.

    Tries each ``dp x tp x pp = gpus`` the model can be split by, each ZeRO stage in
    ``zero`` (only DDP when ``dp`` is 1), each micro-batch size up to
    ``max_micro_batch`` that divides ``global_batch / dp`` (the rest of it becomes
    micro-batches), and each checkpointing choice ("selective" is left out by default:
    with a fused attention kernel it saves no memory and costs a little compute, so it
    never wins); keeps those whose memory fits the
    GPU and sorts them by step time, which for a fixed global batch and number of GPUs
    is the same order as throughput per GPU (ties: less memory first).

    Args:
        model, gpu, network, gpus_per_node, mfu: as for :func:`estimate`.
        gpus: the number of GPUs, ``world_size``.
        global_batch: sequences (a module: samples) per step over all replicas.
        precision: "bf16" or "fp32".
        zero, checkpointing, max_micro_batch: the choices to try.
        top: how many to return (None: all that fit).

    Returns:
        The estimates that fit, fastest first (empty if none fits).

    Raises:
        ValueError: ``gpus``, ``global_batch`` or ``max_micro_batch`` below 1; and as
            :func:`estimate`.

    Example:
        >>> best = best_layouts("transformer-8b", 64, global_batch=256, top=1)[0]
        >>> best.fits, best.layout.world_size
        (True, 64)
    """
    shape = model_shape(model)
    check_counts(
        "best_layouts",
        gpus=gpus,
        global_batch=global_batch,
        max_micro_batch=max_micro_batch,
    )
    Layout(precision=precision)  # checks the precision
    gpu, network = gpu_record(gpu), network_record(network)
    if shape.kind == "module":
        checkpointing = ("none",)
    found: list[Estimate] = []
    for dp, tp in itertools.product(_divisors(gpus), repeat=2):
        if gpus % (dp * tp) or global_batch % dp:
            continue
        pp = gpus // (dp * tp)
        try:
            Layout(dp=dp, tp=tp, pp=pp).check_fits(shape)
        except ValueError:
            continue
        per_replica = global_batch // dp
        sizes = [d for d in _divisors(per_replica) if d <= max_micro_batch]
        stages = [z for z in zero if dp > 1 or z == 0]
        for z, mb, ckpt in itertools.product(stages, sizes, checkpointing):
            layout = Layout(
                dp=dp,
                tp=tp,
                pp=pp,
                zero=z,
                micro_batch=mb,
                micro_batches=per_replica // mb,
                checkpointing=ckpt,
                precision=precision,
            )
            est = estimate(shape, layout, gpu, network, gpus_per_node, mfu=mfu)
            if est.fits:
                found.append(est)
    found.sort(key=lambda e: (e.step, e.memory_total))
    return found if top is None else found[:top]
