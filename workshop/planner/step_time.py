"""The estimator's time terms: seconds of one training step of a parallel layout.

The formulas of :func:`workshop.planner.estimator.estimate`'s "compute", "dp comm",
"tp comm", "pp comm" and "bubble" and its ``collectives`` (memory terms:
:mod:`workshop.planner.memory`). Notation as there; m micro-batches, v virtual stages.

- compute: the stage's operations (:func:`~workshop.planner.operations.stage_record`)
  for m micro-batches, each at its own shape: a product at the rate read off
  ``GPU.matmul_points`` by size, else the best measured rate (or peak x ``mfu``, or
  :data:`DEFAULT_MFU` x peak) times the filled share of the last wave of :data:`TILE`
  tiles, never faster than its bytes allow; a memory-bound operation at
  ``GPU.memory_gbs``; each plus ``GPU.launch_s``. The optimizer: the bytes Adam
  touches (:data:`~workshop.planner.operations.OPTIMIZER_BYTES`) at the memory
  bandwidth. A pipeline goes at its slowest stage's pace. A module: its
  :data:`MEASURED` samples per second, else 3 x forward FLOPs at ResNet-50's MFU.
- collectives: at the bus bandwidth for the message size (nccl-tests' ``busbw``),
  else the alpha-beta ring model (Thakur, Rabenseifner and Gropp, 2005; Patarasuk
  and Yuan, 2009: :func:`ring_time`), on the within-node link when every group of
  that kind lies in one node (ranks tp fastest, then dp, then pp).
- dp comm: DDP all-reduces in buckets
  (:func:`workshop.comm.bucket_plan.plan_buckets`) during the last backward pass;
  ZeRO-1 reduce-scatters once and all-gathers once a step, ZeRO-2 reduce-scatters
  every micro-batch; FSDP gathers each block twice and reduce-scatters it once per
  micro-batch (:func:`~workshop.planner.memory.fsdp_reduce_bytes`). ``step`` counts
  only what the backward pass (DDP, ZeRO) or the compute (FSDP) does not hide.
- tp comm: Megatron-LM's split (Shoeybi et al., 2019, section 3): two forward
  all-reduces per block, one backward per column-parallel layer (two with fused
  layers), two more under full checkpointing, one each for the vocabulary-parallel
  embedding and head. Sequence parallelism (Korthikanti et al., 2022, section
  4.2.2) makes each a reduce-scatter and an all-gather. Only ``tp_overlap`` hides it.
- pp comm: per micro-batch an activation forward and a gradient back, e s b h each
  (1/t of it with sequence parallelism), v times with v virtual stages.
- bubble: (p - 1) / (v m) x compute (Narayanan et al., 2021, sections 2.2.1-2.2.2).
- step: compute + tp comm (its excess with ``tp_overlap``) + pp comm + bubble + the
  data-parallel communication that does not overlap.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable

from ..comm.bucket_plan import plan_buckets
from ..training.models import module_figures
from .layout import GPU, GPUS, MODELS, Layout, ModelShape, Network, check_counts
from .memory import bytes_of, fsdp_reduce_bytes
from .operations import (
    GRADIENT_BYTES,
    OPTIMIZER_BYTES,
    Operation,
    StageRecord,
    family,
)

__all__ = [
    "DEFAULT_MFU",
    "MEASURED",
    "MFU_SOURCE",
    "collective_time",
    "compute_rate",
    "matmul_rate",
    "operation_time",
    "ring_time",
]

#: The fraction of a GPU's peak that its matrix products reach, where the GPU record
#: has no measured figure (``GPU.matmul_bf16_tflops`` is None, or fp32 training).
#: Assumed: 0.40, within the 38-43% BF16 MFU that Meta report for Llama 3 405B on
#: 8,192 and 16,384 H100 GPUs (Dubey et al., "The Llama 3 Herd of Models", 2024,
#: Table 4): a whole run's figure, so it counts more than the matrix products.
DEFAULT_MFU = 0.40
MFU_SOURCE = (
    "assumed 0.40: Dubey et al., The Llama 3 Herd of Models, 2024, Table 4 report "
    "38-43% BF16 MFU on H100 (Narayanan et al. 2021: 52% of A100 peak, Megatron-LM)"
)

#: Training throughput measured by the workshop: (model, GPU, precision) ->
#: (samples per second, where). ResNet-50: a bare eager loop with bf16 autocast and
#: channels_last, batch 256, 3,971-3,989 images/s on one H100 (shared/GPU-NODE.md).
MEASURED: dict[tuple[str, str, str], tuple[float, str]] = {
    ("resnet50", "H100 80GB", "bf16"): (
        3980.0,
        "GPU-NODE.md: ResNet-50 on one H100 80GB, bf16 autocast, channels_last, "
        "batch 256, a bare eager loop: 3,971-3,989 images/s",
    ),
}


def ring_time(
    kind: str, n: int, nbytes: float, bandwidth_gbs: float, alpha: float
) -> float:
    """Seconds of one ring collective over ``n`` GPUs on ``nbytes`` (the whole tensor):
    "all_reduce" 2 (n-1)/n S/B + 2 (n-1) alpha, "all_gather" or "reduce_scatter" half
    that, "send" S/B + alpha; B in GB/s (Thakur et al., 2005).

    Raises:
        ValueError: an unknown kind or a group below 1.

    Example:
        >>> round(ring_time("all_reduce", 8, 1e9, 450.0, 5e-6) * 1e3, 3)  # ms
        3.959
    """
    check_counts("ring_time", " of GPUs", n=n)
    if kind == "send":
        return nbytes / (bandwidth_gbs * 1e9) + alpha
    if kind not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise ValueError(
            f"ring_time: kind={kind!r}; use 'all_reduce', 'all_gather', "
            "'reduce_scatter' or 'send'"
        )
    if n == 1:
        return 0.0
    steps = 2 if kind == "all_reduce" else 1
    return steps * ((n - 1) / n * nbytes / (bandwidth_gbs * 1e9) + (n - 1) * alpha)


def compute_rate(gpu: GPU, precision: str, mfu: float | None) -> tuple[float, str]:
    """FLOP/s the compute term divides by, and where from: peak x ``mfu`` if given,
    else the GPU's measured bf16 rate, else :data:`DEFAULT_MFU` of its peak.

    Example:
        >>> from workshop.planner.layout import GPUS
        >>> rate, why = compute_rate(GPUS["H100 80GB"], "bf16", None)
        >>> rate / 1e12, why.split(":")[0]
        (794.5, 'measured matrix products')
    """
    peak = (gpu.bf16_tflops if precision == "bf16" else gpu.fp32_tflops) * 1e12
    if mfu is not None:
        return peak * mfu, f"{peak / 1e12:g} TFLOP/s x MFU {mfu:.2f} (given)"
    if precision == "bf16" and gpu.matmul_bf16_tflops is not None:
        return gpu.matmul_bf16_tflops * 1e12, (
            f"measured matrix products: {gpu.matmul_bf16_tflops:g} TFLOP/s, "
            f"{gpu.matmul_bf16_tflops / gpu.bf16_tflops:.1%} of peak "
            f"({gpu.matmul_source})"
        )
    return peak * DEFAULT_MFU, (
        f"{peak / 1e12:g} TFLOP/s x MFU {DEFAULT_MFU:.2f} ({MFU_SOURCE})"
    )


def _module_mfu() -> float:
    """The MFU ResNet-50 reached on the node of :data:`MEASURED` (bf16, H100)."""
    per_s, _ = MEASURED[("resnet50", "H100 80GB", "bf16")]
    resnet50 = MODELS["resnet50"]
    flops = 3 * module_figures(resnet50.builder, resnet50.sample, "bf16")[1]
    return per_s * flops / (GPUS["H100 80GB"].bf16_tflops * 1e12)


# --- placement ----------------------------------------------------------------------
def _crosses_nodes(layout: Layout, dim: str, gpus_per_node: int) -> bool:
    """Whether some group along ``dim`` spans two nodes (ranks tp fastest, dp, pp)."""
    return _crosses(layout.dp, layout.tp, layout.pp, dim, gpus_per_node)


@functools.lru_cache(maxsize=4096)
def _crosses(dp: int, tp: int, pp: int, dim: str, gpus_per_node: int) -> bool:
    # A group's ranks rise from its first to its last and a node holds consecutive
    # ranks, so the group lies within one node if its first and last rank do.
    size = {"tp": tp, "dp": dp, "pp": pp}[dim]
    if size == 1:
        return False
    if dim == "tp":
        firsts: Iterable[int] = range(0, dp * tp * pp, tp)
        stride = 1
    elif dim == "dp":
        firsts = (t + tp * dp * p for p in range(pp) for t in range(tp))
        stride = tp
    else:
        firsts = range(tp * dp)
        stride = tp * dp
    return any(
        f // gpus_per_node != (f + stride * (size - 1)) // gpus_per_node for f in firsts
    )


def _link(network: Network, crosses: bool) -> tuple[float, float]:
    if crosses:
        return network.inter_node_gbs, network.alpha_inter
    return network.intra_node_gbs, network.alpha_intra


# --- one operation at its own shape -----------------------------------------------
#: The output tile of one thread block in a matrix product: 128 x 256 (CUTLASS's and
#: cuBLAS's largest bf16 tile on A100 and H100). A product of M x N runs as
#: ceil(M / 128) ceil(N / 256) tiles in waves over the SMs: a last wave that fills a
#: few SMs costs as much as a full one (NVIDIA, Matrix Multiplication Background
#: User's Guide, "Wave Quantization").
TILE = (128, 256)


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """y at ``x`` on a log-log line through ``points`` (ascending x), clamped."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            if x1 == x0:
                return y1
            w = math.log(x / x0) / math.log(x1 / x0)
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    return points[-1][1]


def matmul_rate(gpu: GPU, op: Operation, precision: str, mfu: float | None) -> float:
    """FLOP/s one matrix product reaches at its own shape: read off
    ``GPU.matmul_points`` by FLOPs, else :func:`compute_rate` times the filled share
    of the last wave of :data:`TILE` tiles, capped by the roofline."""
    if gpu.matmul_points and precision == gpu.matmul_precision and mfu is None:
        points = sorted((2.0 * m * n * k, rate) for m, n, k, rate in gpu.matmul_points)
        return _interpolate(points, 2.0 * op.m * op.n * op.k)
    best, _ = compute_rate(gpu, precision, mfu)
    if gpu.sms:
        tiles = math.ceil(op.m / TILE[0]) * math.ceil(op.n / TILE[1]) * op.batch
        waves = math.ceil(tiles / gpu.sms)
        best *= tiles / (waves * gpu.sms)
    if gpu.memory_gbs:
        e = bytes_of(precision)
        moved = e * (op.m * op.k + op.k * op.n + op.m * op.n) * op.batch
        best = min(
            best, 2.0 * op.m * op.n * op.k * op.batch / (moved / (gpu.memory_gbs * 1e9))
        )
    return best


def operation_time(
    op: Operation,
    gpu: GPU,
    network: Network,
    precision: str,
    mfu: float | None,
    links: dict[str, tuple[int, bool]],
) -> float:
    """Seconds of one run of ``op``, plus the GPU's per-operation overhead;
    ``links``: group -> (ranks, whether it crosses nodes)."""
    rates = dict(gpu.operation_rates)
    measured = rates.get(family(op))
    if op.kind == "matmul":
        if measured and family(op) == "attention":
            return op.flops / measured
        # Points measured through autograd already hold the cost of the call.
        launch = 0.0 if gpu.operation_rates else gpu.launch_s
        return op.flops / matmul_rate(gpu, op, precision, mfu) + launch
    if op.kind == "memory":
        if measured:
            return op.nbytes / measured
        if not gpu.memory_gbs:
            return 0.0
        return op.nbytes / (gpu.memory_gbs * 1e9) + gpu.launch_s
    n, crosses = links[op.group]
    return collective_time(network, op.collective, n, op.nbytes, crosses)


def collective_time(
    network: Network, kind: str, n: int, nbytes: float, crosses: bool
) -> float:
    """Seconds of one collective over ``n`` GPUs on ``nbytes`` (the whole tensor):
    the bytes each GPU moves over the link's bus bandwidth at that size, or
    :func:`ring_time` where the network has no curve."""
    curve = network.busbw_inter if crosses else network.busbw_intra
    bw, alpha = _link(network, crosses)
    if not curve or (n == 1 and kind != "send"):
        return ring_time(kind, n, nbytes, bw, alpha)
    factor = {"all_reduce": 2 * (n - 1) / n, "send": 1.0}.get(kind, (n - 1) / n)
    smallest, rate = curve[0]
    if nbytes < smallest:
        # Below the smallest message measured, latency rules: no quicker than it.
        return factor * smallest / (rate * 1e9)
    return factor * nbytes / (_interpolate(list(curve), nbytes) * 1e9)


# --- all time terms -------------------------------------------------------------------
def _stage_times(record, gpu, network, precision, mfu, links):
    """(products, memory-bound, tp comm, its exposed part, pp comm) of a micro-batch."""
    layout = record.layout
    matmul = memory = tp_comm = tp_exposed = pp = 0.0
    for per, times in (("block", record.layers), ("micro-batch", 1)):
        ops = record.of(per)
        compute = {"matmul": 0.0, "memory": 0.0}
        comm = 0.0
        for op in ops:
            seconds = op.count * operation_time(op, gpu, network, precision, mfu, links)
            if op.kind in compute:
                compute[op.kind] += seconds
            elif op.group == "tp":
                comm += seconds
            else:
                pp += times * seconds
        busy = compute["matmul"] + compute["memory"]
        exposed = max(0.0, comm - busy) if layout.tp_overlap else comm
        matmul += times * compute["matmul"]
        memory += times * compute["memory"]
        tp_comm += times * comm
        tp_exposed += times * exposed
    return matmul, memory, tp_comm, tp_exposed, pp


def time_terms(
    shape: ModelShape,
    layout: Layout,
    stage: int,
    gpu: GPU,
    network: Network,
    gpus_per_node: int,
    mfu: float | None,
    samples_per_s: float | None,
    record: StageRecord,
    records: list[StageRecord] | None = None,
    optimizer: str = "fused",
):
    """``estimate``'s time terms, collectives, step, notes and parts for one GPU of
    ``stage``; ``records``: every stage's, for the pace of the slowest."""
    b, m = layout.micro_batch, layout.micro_batches
    pbytes = bytes_of(layout.precision)
    peak = (gpu.bf16_tflops if layout.precision == "bf16" else gpu.fp32_tflops) * 1e12
    psi = record.psi
    notes: dict[str, str] = {}
    links = {
        dim: (getattr(layout, dim), _crosses_nodes(layout, dim, gpus_per_node))
        for dim in ("tp", "dp", "pp")
    }
    matmul = memory = tp_time = tp_exposed = pp_time = bubble = 0.0
    if shape.kind == "module":
        measured = MEASURED.get((shape.name, gpu.name, layout.precision))
        if samples_per_s is None and mfu is None and measured is not None:
            samples_per_s = measured[0]
            notes["compute"] = (
                f"{b * m} samples / {samples_per_s:,.0f} per s ({measured[1]})"
            )
        if samples_per_s is not None:
            compute = b * m / samples_per_s
            notes.setdefault("compute", f"{b * m} samples / {samples_per_s:,.0f} per s")
        else:
            used = mfu if mfu is not None else _module_mfu()
            flops = 3 * module_figures(shape.builder, shape.sample, layout.precision)[1]
            compute = b * m * flops / (peak * used)
            notes["compute"] = (
                f"{b * m} samples x {flops / 1e9:.3g} GFLOP / "
                f"({peak / 1e12:g} TFLOP/s x MFU {used:.3f})"
            )
        matmul = compute
        optimizer_s = 0.0
    else:
        per_mb = _stage_times(record, gpu, network, layout.precision, mfu, links)
        matmul, memory, tp_time, tp_exposed, pp_time = (m * x for x in per_mb)
        # A pipeline goes at the pace of its slowest stage.
        paces = [
            sum(_stage_times(r, gpu, network, layout.precision, mfu, links)[i]
                for i in (0, 1, 3, 4))
            for r in (records or [record])
        ]  # fmt: skip
        v = layout.virtual_stages
        slowest = max(paces)
        mine = per_mb[0] + per_mb[1] + per_mb[3] + per_mb[4]
        # The stage waits for the slowest one every micro-batch: counted in the bubble.
        bubble = m * (slowest - mine) + (layout.pp - 1) / v * slowest
        compute = matmul + memory
        per_param, why = OPTIMIZER_BYTES[optimizer]
        shards = layout.dp if layout.zero >= 1 else 1
        adam = dict(gpu.operation_rates).get("optimizer")
        bandwidth = adam or (gpu.memory_gbs or 0) * 1e9
        optimizer_s = psi / shards * per_param / bandwidth if bandwidth else 0.0
        # The plain loop's gradient traffic (GRADIENT_BYTES), at the memory rate.
        loop, ddp = GRADIENT_BYTES[optimizer]
        moved = psi * (loop + (ddp if layout.dp > 1 and layout.zero == 0 else 0))
        if moved and gpu.memory_gbs:
            optimizer_s += moved / (gpu.memory_gbs * 1e9)
        notes["compute"] = (
            f"{m} micro-batches x {record.layers} blocks: products "
            f"{matmul * 1e3:.1f} ms, memory-bound {memory * 1e3:.1f} ms, each "
            f"operation at its own shape; optimizer {optimizer_s * 1e3:.1f} ms "
            f"({per_param} B a parameter: {why})"
        )
        if layout.pp > 1:
            wait = m * (slowest - mine)
            notes["bubble"] = (
                f"({layout.pp} - 1) / {v} x {slowest * 1e3:.1f} ms of the slowest stage"
                + (f" + {wait * 1e3:.0f} ms waiting for it" if wait > 0 else "")
            )
    collectives: dict[str, tuple[int, float]] = {}
    for op in record.operations:
        if op.kind != "collective":
            continue
        per = m * (record.layers if op.per == "block" else 1)
        kinds = (
            ["reduce_scatter", "all_gather"]
            if op.collective == "all_reduce"
            and layout.sequence_parallel
            and op.group == "tp"
            else [op.collective]
        )
        for kind in kinds:
            key = f"{'send_recv' if kind == 'send' else kind} {op.group}"
            count, size = collectives.get(key, (0, 0.0))
            collectives[key] = (
                count + per * op.count,
                size + per * op.count * op.nbytes,
            )

    # data parallelism
    dp_time = dp_exposed = 0.0
    n = layout.dp
    if n > 1:
        bw, _ = _link(network, links["dp"][1])
        crosses = links["dp"][1]
        backward = 2 / 3 * (matmul + memory) / m  # the last micro-batch's backward
        size = psi * pbytes
        if layout.zero == 0:
            # DDP fills buckets in the order backward makes gradients: the last first.
            grads = [v * pbytes for v in reversed(record.tensor_sizes)]
            count = len(plan_buckets(grads))
            dp_time = count * collective_time(
                network, "all_reduce", n, size / count, crosses
            )
            dp_exposed = max(0.0, dp_time - backward)
            collectives["all_reduce dp"] = (count, float(size))
        elif layout.zero in (1, 2):
            reductions = m if layout.zero == 2 else 1
            scatter = collective_time(network, "reduce_scatter", n, size, crosses)
            gather = collective_time(network, "all_gather", n, size, crosses)
            dp_time = reductions * scatter + gather
            dp_exposed = reductions * max(0.0, scatter - backward) + gather
            collectives["reduce_scatter dp"] = (reductions, float(reductions * size))
            collectives["all_gather dp"] = (1, float(size))
        else:
            has_root = record.root > 0
            blocks, root = record.block, record.root
            gathers = [blocks] * (2 * record.layers) + ([root] if has_root else [])
            scatters = [blocks] * record.layers + ([root] if has_root else [])
            rbytes = fsdp_reduce_bytes(layout.precision)
            dp_time = m * (
                sum(collective_time(network, "all_gather", n, c * pbytes, crosses)
                    for c in gathers)
                + sum(collective_time(network, "reduce_scatter", n, c * rbytes, crosses)
                      for c in scatters)
            )  # fmt: skip
            dp_exposed = max(0.0, dp_time - (matmul + memory))
            collectives["all_gather dp"] = (
                m * len(gathers),
                float(m * sum(gathers) * pbytes),
            )
            collectives["reduce_scatter dp"] = (
                m * len(scatters),
                float(m * sum(scatters) * rbytes),
            )
        curve = network.busbw_inter if crosses else network.busbw_intra
        speed = "the bus bandwidth by size" if curve else f"{bw:g} GB/s"
        notes["dp comm"] = (
            f"n = {n} at {speed}, {dp_time * 1e3:.2f} ms, "
            f"{dp_exposed * 1e3:.2f} ms not overlapped"
        )
    if layout.tp > 1:
        notes["tp comm"] = f"{tp_time * 1e3:.2f} ms over {layout.tp}" + (
            f"; {tp_exposed * 1e3:.2f} ms exposed" if layout.tp_overlap else ""
        )
    if layout.pp > 1:
        notes["pp comm"] = f"{pp_time * 1e3:.2f} ms of sends"
    time = {
        "compute": matmul + memory + optimizer_s,
        "dp comm": dp_time,
        "tp comm": tp_time,
        "pp comm": pp_time,
        "bubble": bubble,
    }
    parts = {
        "matrix products": matmul,
        "memory-bound": memory,
        "optimizer": optimizer_s,
        "exposed comm": tp_exposed + pp_time + dp_exposed,
        "bubble": bubble,
    }
    step = sum(parts.values())
    notes["step"] = f"{step * 1e3:.1f} ms"
    return time, collectives, step, notes, parts
