"""The planner's estimator: memory per GPU and time per step of a parallel layout.

Every figure of an :class:`Estimate` is a formula derived in
:mod:`workshop.planner.memory` and :mod:`workshop.planner.step_time` and summed up
with its source in :data:`FORMULAS` (notation as there). :func:`best_layouts` tries
every layout of a number of GPUs and ranks those that fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..checks import one_of, positive_number, whole
from .layout import (
    GPU,
    Layout,
    ModelShape,
    Network,
    check_counts,
    gpu_record,
    model_shape,
    network_record,
)
from .memory import memory_terms
from .operations import OPTIMIZER_BYTES, StageRecord, stage_record
from .step_time import time_terms

__all__ = [
    "FORMULAS",
    "Estimate",
    "best_layouts",
    "describe_estimate",
    "estimate",
    "table",
]


@dataclass(frozen=True)
class Estimate:
    """What the estimator says of one layout, per GPU; every figure is a formula's.

    ``memory``: peak bytes by term; ``time``: seconds of one step by term (overlapped
    communication still listed; ``step`` adds only what does not overlap);
    ``collectives``: per step, ``{"all_gather dp": (count, bytes of the full
    tensors)}``, as CommDebugMode counts; ``formulas``: each term's formula and source.
    """

    model: ModelShape
    layout: Layout
    gpu: GPU
    network: Network
    gpus_per_node: int
    memory: dict[str, float]
    time: dict[str, float]
    collectives: dict[str, tuple[int, float]]
    formulas: dict[str, str]
    step: float
    #: The step split into what adds up to it: "matrix products", "memory-bound",
    #: "optimizer", "exposed comm" and "bubble" (seconds).
    parts: dict[str, float] = field(default_factory=dict)
    #: The formula sheet of the reported stage (operations.StageRecord).
    record: StageRecord | None = field(default=None, compare=False, repr=False)

    @property
    def memory_total(self) -> float:
        """Bytes per GPU, all terms."""
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        """Whether the memory per GPU is within the GPU's memory."""
        return self.memory_total <= self.gpu.memory_bytes

    @property
    def mfu(self) -> float | None:
        """The model FLOPs utilisation the estimate implies: the model's FLOPs of one
        step (6 P + 12 L h s per token, no recomputation) / step / (GPUs x peak), as
        Chowdhery et al. (PaLM, 2022, appendix B) define it; None for a module."""
        if self.model.kind != "transformer":
            return None
        tokens = self.layout.global_batch * self.model.seq
        peak = (
            self.gpu.bf16_tflops
            if self.layout.precision == "bf16"
            else self.gpu.fp32_tflops
        )
        flops = tokens * self.model.flops_per_token()
        return flops / self.step / (self.layout.world_size * peak * 1e12)


_SOURCES = {
    "zero": "Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion "
    "Parameter Models, 2020, section 5",
    "fsdp2": "PyTorch FSDP2 fully_shard with MixedPrecisionPolicy(param_dtype=bf16): "
    "fp32 sharded parameters, gradients and Adam state",
    "korthikanti": "Korthikanti et al., Reducing Activation Recomputation in Large "
    "Transformer Models, 2022, section 4 (activation memory) and 5 (selective "
    "recomputation)",
    "narayanan": "Narayanan et al., Efficient Large-Scale Language Model Training on "
    "GPU Clusters Using Megatron-LM, 2021, section 2.2",
    "ring": "Thakur, Rabenseifner and Gropp, Optimization of Collective Communication "
    "Operations in MPICH, 2005; Patarasuk and Yuan, Bandwidth Optimal All-reduce "
    "Algorithms for Clusters of Workstations, 2009",
    "megatron": "Shoeybi et al., Megatron-LM, 2019, section 3",
    "gpipe": "Narayanan et al., 2021, section 2.2.1: the bubble of GPipe's schedule "
    "(Huang et al., GPipe, 2019) and of 1F1B; section 2.2.2: the interleaved schedule",
    "kaplan": "Kaplan et al., Scaling Laws for Neural Language Models, 2020, "
    "section 2.1",
    "ddp": "PyTorch DistributedDataParallel documentation (bucket_cap_mb=25, "
    "gradient_as_bucket_view)",
    "chen": "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016",
}

#: Each term's formula in words and its source; ``Estimate.formulas`` adds the numbers.
FORMULAS: dict[str, str] = {
    "stage": "the pipeline stage reported: the first or the last, whichever needs more "
    "memory (the first holds the embedding and min(p, m) micro-batches in flight, the "
    "last the head and the loss); Ψ = its parameters, matrices split over t ranks",
    "parameters": "Ψ x (4 fp32 | 2 bf16 with ZeRO 0-2 | 4 bf16 with FSDP), / N at "
    f"ZeRO-3. {_SOURCES['zero']}; for FSDP, {_SOURCES['fsdp2']}. (PyTorch's DDP and "
    "ZeroRedundancyOptimizer under bf16 autocast keep fp32 parameters and gradients: "
    "4 + 4 + 8, not the paper's 2 + 2 + 12)",
    "gradients": "Ψ x (4 | 2 | 4 as for the parameters), / N at ZeRO-2 and 3. "
    f"{_SOURCES['zero']}",
    "optimizer": "Ψ x (8 fp32: Adam's two moments | 12 bf16 ZeRO 0-2: fp32 master and "
    "moments | 8 FSDP: the sharded fp32 parameters are the master), / N at ZeRO 1-3; "
    "Adam's step counters (4 B per tensor) left out. "
    f"{_SOURCES['zero']}; {_SOURCES['fsdp2']}",
    "activations": "per layer e s b (6 h + 2) + [e s b (4 h + k f) + 4 s b a] / t, "
    "k = 4 SwiGLU, 2 GELU (this package's Block, a fused attention kernel: no s x s "
    "scores); first stage + 8 s b, last + e s b (3 h + 1) + 4 s b V / t + 8 s b; x "
    "micro-batches in flight, min(p - i, m) on stage i, x (1 + (p - 1) / (p v)) with "
    "v virtual stages; full checkpointing keeps e s b h per layer and one layer's set; "
    "sequence parallelism divides the 6 h + 2 term (and a kept input) by t too. "
    f"{_SOURCES['korthikanti']}; {_SOURCES['narayanan']}; {_SOURCES['chen']}",
    "buffers": "FSDP: 2 gathered blocks + the root's parameters in the parameter "
    "dtype, + 1 block of unsharded gradients in fp32 (the reduce dtype of torchtitan "
    "and of PyTorch from 2.15); DDP: a bucket copy of the gradients "
    f"(25 MiB buckets); ZeRO-1/2: one 25 MiB bucket (assumed); PP: 2 e s b h. "
    f"{_SOURCES['ddp']}",
    "compute": "the sum of the stage's operations (operations.stage_record), each at "
    "its own shape, for m micro-batches: matrix products at their M, N, K (a "
    "calibrated or published rate by size; else the best measured rate x the filled "
    "share of the last wave of tiles, no faster than the bytes allow), memory-bound "
    "operations (norms, softmax, dropout, activation, residual adds, loss) as bytes "
    "over the GPU's memory bandwidth, recomputation as the checkpointing redoes it; "
    "+ the optimizer step: the bytes Adam touches per parameter over the bandwidth. "
    "Sources: each GPU record's",
    "dp comm": "DDP: all-reduce of the gradients once a step, overlapping the last "
    "backward (step counts the excess over 2/3 of one micro-batch's compute); "
    "ZeRO-1/2: reduce-scatter of the gradients (ZeRO-2: each micro-batch) + all-gather "
    "of the parameters; FSDP: per micro-batch 2 all-gathers (parameter dtype) and 1 "
    "reduce-scatter (fp32) per block (root: 1 and 1), overlapping compute (step counts "
    "the excess). PyTorch's own ZeRO-1 "
    "(ZeroRedundancyOptimizer) sends DDP's all-reduce and a broadcast per parameter "
    "tensor instead; FSDP2 with reshard_after_forward=False (its ZeRO-2) gathers each "
    "block in the forward pass only. Ring: all-reduce "
    "2 (n-1)/n S/B + 2 (n-1) alpha, all-gather and reduce-scatter (n-1)/n S/B + (n-1) "
    f"alpha. {_SOURCES['ring']}",
    "tp comm": "per block and micro-batch 2 all-reduces of e s b h forward + one per "
    "column-parallel layer backward (q, k, v, up, gate: 5; GELU 4; fused layers, as "
    "Megatron-LM's: 2), +2 with full checkpointing; +1 for the embedding on the first "
    "stage, +1 for the head on the last; sequence parallelism: a reduce-scatter and "
    "an all-gather for each; each at the link's bus bandwidth for its size "
    "(nccl-tests); with tp_overlap only the excess over the compute counts. "
    f"{_SOURCES['megatron']}; {_SOURCES['korthikanti']}",
    "pp comm": "per micro-batch and virtual stage one activation forward and one "
    "gradient back across a stage boundary: 2 m v (e s b h / B + alpha); send_recv "
    "counts this stage's sends (m (2 v - 1) first and last stage, 2 m v middle)",
    "bubble": "(p - 1) / v x the slowest stage's micro-batch, + the time this stage "
    f"waits for the slowest each micro-batch. {_SOURCES['gpipe']}",
    "step": "compute + tp comm (with tp_overlap: its excess) + pp comm + bubble + "
    "the dp comm that does not overlap; Estimate.parts splits it into matrix "
    "products, memory-bound operations, the optimizer, exposed communication and the "
    "bubble",
}


def estimate(
    model: str | ModelShape,
    layout: Layout,
    gpu: str | GPU = "H100 80GB",
    network: str | Network = "NVLink 4 + NDR 400G",
    gpus_per_node: int = 8,
    mfu: float | None = None,
    samples_per_s: float | None = None,
    stage: int | None = None,
    optimizer: str = "fused",
) -> Estimate:
    """Memory per GPU and time per step of ``model`` trained with ``layout``.

    A group wider than a node runs at the between-node bandwidth.

    Args:
        model: a :class:`~workshop.planner.layout.ModelShape` or a name of ``MODELS``.
        layout: the :class:`~workshop.planner.layout.Layout`.
        gpu, network: records or names of ``GPUS`` and ``NETWORKS``.
        gpus_per_node: GPUs in one node (consecutive ranks).
        mfu: the fraction of peak FLOP/s reached (default
            :data:`.step_time.DEFAULT_MFU`; a module: what ResNet-50 reached).
        samples_per_s: a module's measured throughput on one GPU (default:
            :data:`.step_time.MEASURED`).
        stage: the pipeline stage to report (default: the one needing more memory).
        optimizer: "fused" (Megatron-LM, NeMo) or "pytorch" (torch.optim.Adam in a
            loop: this package's jobs); ``operations.OPTIMIZER_BYTES``.

    Returns:
        The :class:`~workshop.planner.estimator.Estimate`.

    Raises:
        ValueError: an unknown name, a layout that cannot split the model, or an
            argument out of range; the message names it.

    Example:
        >>> e = estimate("transformer-8b", Layout(dp=8, zero=3, checkpointing="full"))
        >>> e.fits, round(e.memory_total / 1e9, 1)
        (True, 28.1)
    """
    shape = model_shape(model)
    if not isinstance(layout, Layout):
        raise ValueError(
            f"layout={layout!r} is not a Layout; build one, e.g. "
            "Layout(dp=8, tp=1, pp=1, zero=3)"
        )
    layout.check_fits(shape)
    gpu, network = gpu_record(gpu), network_record(network)
    check_counts("", gpus_per_node=gpus_per_node)
    if mfu is not None:
        positive_number("mfu", mfu, 1, "a fraction of the GPU's peak", "e.g. mfu=0.4")
    fix = "'fused' is Megatron-LM's and NeMo's, 'pytorch' torch.optim.Adam in a loop"
    one_of("optimizer", optimizer, OPTIMIZER_BYTES, fix)
    if samples_per_s is not None:
        positive_number("samples_per_s", samples_per_s, fix="e.g. samples_per_s=1000")
    if shape.kind == "module" and layout.checkpointing != "none":
        raise ValueError(
            f"checkpointing={layout.checkpointing!r}: the estimator models activation "
            f"checkpointing of transformer blocks only; {shape.name} is a module, use "
            "checkpointing='none'"
        )
    # The formula sheet, once per stage: memory and time both read it.
    records = [stage_record(shape, layout, s) for s in _distinct_stages(layout.pp)]
    by_stage = {r.stage: r for r in records}
    if stage is None:
        last = layout.pp - 1
        first_mem, last_mem = (memory_terms(by_stage[s])[0] for s in (0, last))
        stage = last if sum(last_mem.values()) > sum(first_mem.values()) else 0
    else:
        whole("stage", stage, 0, layout.pp - 1, f"a stage of pp={layout.pp}")
    record = by_stage.get(stage) or stage_record(shape, layout, stage)
    memory, notes = memory_terms(record)
    time, collectives, step, time_notes, parts = time_terms(
        shape,
        layout,
        stage,
        gpu,
        network,
        gpus_per_node,
        mfu,
        samples_per_s,
        record,
        records,
        optimizer,
    )
    formulas = dict(FORMULAS)
    where = "first" if stage == 0 else "last" if stage == layout.pp - 1 else "middle"
    formulas["stage"] += (
        f". Here: stage {stage} of {layout.pp} ({where}), Ψ = {record.psi:,}"
    )
    for key, text in {**notes["text"], **time_notes}.items():
        formulas[key] += f". Here: {text}"
    return Estimate(
        shape,
        layout,
        gpu,
        network,
        gpus_per_node,
        memory,
        time,
        collectives,
        formulas,
        step,
        parts,
        record,
    )


def _distinct_stages(pp: int) -> list[int]:
    """The stages whose records can differ: the first, the middle ones (their
    layers may differ by one), the last."""
    return list(range(pp)) if pp <= 4 else sorted({0, 1, pp // 2, pp - 2, pp - 1})


# --- reading estimates and searching layouts ------------------------------------------
def _throughput(est: Estimate) -> float:
    """Tokens (a module: samples) per second per GPU."""
    per_sample = est.model.seq if est.model.kind == "transformer" else 1
    return est.layout.global_batch * per_sample / est.step / est.layout.world_size


def describe_estimate(est: Estimate) -> str:
    """A text summary of one estimate, at most 88 columns: memory by term against the
    GPU's capacity, time by term against the step, and the throughput.

    Example:
        >>> print(describe_estimate(estimate("tiny", Layout(dp=2))).splitlines()[0])
        tiny on 2 x H100 80GB (8 per node), NVLink 4 + NDR 400G
    """
    lay, cap = est.layout, est.gpu.memory_bytes
    capacity = f"% of {est.gpu.memory_gb:g} GB"
    unit = "tokens" if est.model.kind == "transformer" else "samples"
    stage = _stage_label(est)
    lines = [
        f"{est.model.name} on {lay.world_size} x {est.gpu.name} "
        f"({est.gpus_per_node} per node), {est.network.name}"[:88],
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
    mfu = "" if est.mfu is None else f", MFU {est.mfu:.1%}"
    lines.append(f"{_throughput(est):,.0f} {unit}/s per GPU{mfu}")
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

    Tries each ``dp x tp x pp``, ZeRO stage, micro-batch size dividing
    ``global_batch / dp`` and checkpointing choice ("selective" saves nothing with a
    fused kernel, so it is left out); ties go to less memory.

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
        **({} if top is None else {"top": top}),  # top=0 or -1 would cut silently
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
