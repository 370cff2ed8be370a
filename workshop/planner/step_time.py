"""The estimator's time terms: seconds of one training step of a parallel layout.

The formulas of :func:`workshop.planner.estimator.estimate`'s "compute",
"dp comm", "tp comm", "pp comm" and "bubble" and its ``collectives`` (its memory
terms are in :mod:`workshop.planner.memory`), with the GPU and network
records they read (:data:`~workshop.planner.layout.GPUS`,
:data:`~workshop.planner.layout.NETWORKS`).

Notation: Ψ parameters this GPU holds, L layers, h hidden size, f MLP width, a heads,
V vocabulary, s sequence, b micro-batch (sequences), m micro-batches per step,
t = tp, p = pp, N = dp, e bytes of one activation value (2 for bf16, 4 for fp32).

Time per step (seconds)
-----------------------
- compute: tokens x FLOPs per token / (t p) / the GPU's matrix-product rate,
  tokens = b m s per data-parallel replica, FLOPs per token 6 P + 12 L h s, P the
  model's parameters less an untied embedding
  (:meth:`~workshop.planner.layout.ModelShape.flops_per_token`; Kaplan et al., 2020);
  full checkpointing adds one forward pass (x 4/3), selective the attention scores'
  forward (4 L h s per token); the output head's 6 V h a token is never recomputed.
  A pipeline goes at the pace of its busiest stage, the last, which holds L / p
  blocks and the head (Dubey et al. 2024, section 3.3.2, take a layer off the first
  and last stages for this). The rate: ``mfu`` x peak when a run gives its own
  figure (calibrated); else the bf16 matrix-product rate measured on that GPU
  (``GPU.matmul_bf16_tflops``: S. Bekman's Maximum Achievable Matmul FLOPS, 80.3 %
  of an H100's peak, 86.9 % of an A100's); else :data:`DEFAULT_MFU` x peak
  (assumed). Everything else a step does (norms, softmax, the optimizer, the data)
  is not in this term: a run that spends time there is slower than the estimate.
  A module: samples / measured samples per second where the workshop measured it
  (:data:`MEASURED`), else 3 x forward FLOPs (counted on the meta device) / peak at
  the MFU ResNet-50 reached in that measurement.
- communication, the alpha-beta model with ring algorithms (Thakur, Rabenseifner and
  Gropp, 2005; Patarasuk and Yuan, 2009), for a group of n GPUs and S bytes (the whole
  tensor): all-reduce 2 (n-1)/n S/B + 2 (n-1) alpha; all-gather and reduce-scatter
  (n-1)/n S/B + (n-1) alpha; a send S/B + alpha. B and alpha are the network's
  within-node figures when every group of that kind lies within one node, else its
  between-node ones; ranks are numbered with tp fastest, then dp, then pp
  (:meth:`~workshop.planner.layout.Layout.coordinates`), nodes hold consecutive ranks.
- dp comm: DDP all-reduces the gradients once a step, bucket by bucket
  (:func:`workshop.comm.bucket_plan.plan_buckets`: filled from the last parameter
  back, 1 MiB then 25 MiB each),
  during the last micro-batch's backward pass: ``step`` counts only what exceeds that
  backward (2/3 of its compute). ZeRO-1: a reduce-scatter of the gradients and an
  all-gather of the updated parameters per step; ZeRO-2 reduce-scatters every
  micro-batch (it keeps no whole gradient); the reduce-scatters overlap the backward
  pass as DDP's buckets do, the all-gather is counted whole. FSDP (zero=3) per
  micro-batch: each block all-gathered in the forward and again in the backward pass
  (in the parameter dtype) and its gradients reduce-scattered (in fp32:
  :func:`~workshop.planner.memory.fsdp_reduce_bytes`); the root
  gathered once and reduced once; FSDP2 prefetches, so ``step`` counts only what
  exceeds the compute.
- tp comm: Megatron-LM's split (Shoeybi et al., 2019, section 3): per block two
  all-reduces of e s b h in the forward pass (after the row-parallel o and down
  projections); in the backward pass one per column-parallel layer, each reducing the
  gradient of its own input: q, k, v, up and gate (GELU: no gate), as DTensor's
  ``ColwiseParallel`` does for this package's separate layers; a model built with
  fused layers (``ModelShape.fused``: q, k, v in one matrix, the MLP's input
  matrices in one, as Megatron-LM builds them) needs two. Two more when full
  checkpointing recomputes the forward. The vocabulary-parallel embedding adds one
  forward all-reduce on the first stage, the column-parallel head one backward
  all-reduce on the last (the loss's all-reduces of s b values are left out).
  Sequence parallelism (Korthikanti et al., 2022, section 4.2.2) turns each
  all-reduce into a reduce-scatter and an all-gather of the same tensor: the same
  ring time, two calls. Nothing overlaps, unless ``tp_overlap``: then only what
  exceeds the compute is added to the step.
- pp comm: per micro-batch an activation forward and a gradient back across a stage
  boundary, e s b h each: 2 m transfers (a middle stage's two boundaries work at the
  same time). ``collectives`` counts this stage's sends: m on the first and last
  stage (activations on, gradients back), 2 m on a middle one.
  With sequence parallelism each tp rank sends its 1/t of the tensor (Narayanan et
  al. 2021, section 4.1, scatter/gather).
  With v virtual stages (the interleaved schedule) every transfer happens v times:
  2 m v transfers, and a stage sends m (2 v - [first] - [last]) times.
- bubble: (p - 1) / (v m) x compute (Narayanan et al., 2021, sections 2.2.1 and
  2.2.2: GPipe's schedule, Huang et al., 2019, and 1F1B leave the same bubble; the
  interleaved schedule with v chunks per GPU divides it by v).
- step: compute + tp comm (its excess over compute with ``tp_overlap``) + pp comm +
  bubble + the data-parallel communication that does not overlap.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from ..comm.bucket_plan import plan_buckets
from ..training.models import module_figures
from .layout import GPU, GPUS, MODELS, Layout, ModelShape, Network, check_counts
from .memory import (
    _block_local,
    _root_local,
    _tensor_sizes,
    bytes_of,
    fsdp_reduce_bytes,
)

__all__ = ["DEFAULT_MFU", "MEASURED", "MFU_SOURCE", "compute_rate", "ring_time"]

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
    """Seconds of one ring collective over ``n`` GPUs on ``nbytes`` (the whole tensor).

    ``kind`` is "all_reduce" (2 (n-1)/n S/B + 2 (n-1) alpha), "all_gather" or
    "reduce_scatter" ((n-1)/n S/B + (n-1) alpha) or "send" (S/B + alpha); B in GB/s.
    Thakur, Rabenseifner and Gropp, 2005; Patarasuk and Yuan, 2009.

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
    """FLOP/s the compute term divides by, and where the figure comes from.

    ``mfu`` (a run's own fraction of peak) wins; else the bf16 matrix-product rate
    measured on that GPU; else :data:`DEFAULT_MFU` of its peak (assumed).

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


# --- all time terms -------------------------------------------------------------------
def time_terms(
    shape: ModelShape,
    layout: Layout,
    stage: int,
    gpu: GPU,
    network: Network,
    gpus_per_node: int,
    mfu: float | None,
    samples_per_s: float | None,
    psi: int,
):
    """The time terms of one step (seconds), the collectives of one GPU of stage
    ``stage``, the step and each term's numbers, for ``estimate``; ``psi`` is the
    parameters that GPU holds."""
    b, m = layout.micro_batch, layout.micro_batches
    pbytes = bytes_of(layout.precision)
    peak = (gpu.bf16_tflops if layout.precision == "bf16" else gpu.fp32_tflops) * 1e12
    notes: dict[str, str] = {}
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
        blocks, root, per_stage = 0, psi, 0
    else:
        rate, why = compute_rate(gpu, layout.precision, mfu)
        # The output head's matrix product (6 V h a token) is outside the blocks:
        # checkpointing does not recompute it, and it runs on the last stage alone.
        head = 6.0 * shape.vocab * shape.hidden
        blocks_per_token = shape.flops_per_token() - head
        if layout.checkpointing == "full":
            blocks_per_token *= 4 / 3
        elif layout.checkpointing == "selective":
            blocks_per_token += 4 * shape.layers * shape.hidden * shape.seq
        tokens = b * m * shape.seq
        # A pipeline goes at the pace of its busiest stage: the last, with the head.
        per_token = blocks_per_token / layout.pp + head
        compute = tokens * per_token / layout.tp / rate
        stages = f"{layout.pp} stages + the head" if layout.pp > 1 else "the model"
        notes["compute"] = (
            f"{tokens:,} tokens x {per_token / 1e9:.3g} GFLOP ({stages}) / "
            f"{layout.tp} / {why}"
        )
        per_stage = shape.layers // layout.pp
        blocks = _block_local(shape, layout.tp)
        root = _root_local(shape, layout.tp, stage == 0, stage == layout.pp - 1)
    collectives: dict[str, tuple[int, float]] = {}

    # data parallelism
    dp_time = dp_exposed = 0.0
    n = layout.dp
    if n > 1:
        bw, alpha = _link(network, _crosses_nodes(layout, "dp", gpus_per_node))
        backward = 2 / 3 * compute / m  # the last micro-batch's backward pass
        size = psi * pbytes
        if layout.zero == 0:
            # DDP fills buckets in the order backward makes gradients: the last first.
            grads = [v * pbytes for v in reversed(_tensor_sizes(shape, layout, stage))]
            count = len(plan_buckets(grads))
            dp_time = count * ring_time("all_reduce", n, size / count, bw, alpha)
            dp_exposed = max(0.0, dp_time - backward)
            collectives["all_reduce dp"] = (count, float(size))
        elif layout.zero in (1, 2):
            reductions = m if layout.zero == 2 else 1
            scatter = ring_time("reduce_scatter", n, size, bw, alpha)
            gather = ring_time("all_gather", n, size, bw, alpha)
            dp_time = reductions * scatter + gather
            dp_exposed = reductions * max(0.0, scatter - backward) + gather
            collectives["reduce_scatter dp"] = (reductions, float(reductions * size))
            collectives["all_gather dp"] = (1, float(size))
        else:
            has_root = root > 0
            gathers = [blocks] * (2 * per_stage) + ([root] if has_root else [])
            scatters = [blocks] * per_stage + ([root] if has_root else [])
            rbytes = fsdp_reduce_bytes(layout.precision)
            dp_time = m * (
                sum(ring_time("all_gather", n, c * pbytes, bw, alpha) for c in gathers)
                + sum(
                    ring_time("reduce_scatter", n, c * rbytes, bw, alpha)
                    for c in scatters
                )
            )
            dp_exposed = max(0.0, dp_time - compute)
            collectives["all_gather dp"] = (
                m * len(gathers),
                float(m * sum(gathers) * pbytes),
            )
            collectives["reduce_scatter dp"] = (
                m * len(scatters),
                float(m * sum(scatters) * rbytes),
            )
        notes["dp comm"] = (
            f"n = {n} at {bw:g} GB/s, {dp_time * 1e3:.2f} ms, "
            f"{dp_exposed * 1e3:.2f} ms not overlapped"
        )

    # tensor parallelism
    tp_time = tp_exposed = 0.0
    if layout.tp > 1:
        bw, alpha = _link(network, _crosses_nodes(layout, "tp", gpus_per_node))
        size = pbytes * shape.seq * b * shape.hidden
        # q, k, v, up (, gate); fused: q, k, v in one matrix, the MLP's inputs in one
        backward = 2 if shape.fused else 5 if shape.mlp == "swiglu" else 4
        forward = 4 if layout.checkpointing == "full" else 2
        edges = int(stage == 0) + int(stage == layout.pp - 1)
        calls = m * (per_stage * (forward + backward) + edges)
        tp_time = calls * ring_time("all_reduce", layout.tp, size, bw, alpha)
        if layout.sequence_parallel:
            # The same ring steps, split in two calls: a reduce-scatter and a gather.
            collectives["reduce_scatter tp"] = (calls, float(calls * size))
            collectives["all_gather tp"] = (calls, float(calls * size))
            what = f"{calls} x reduce-scatter + all-gather of"
        else:
            collectives["all_reduce tp"] = (calls, float(calls * size))
            what = f"{calls} x"
        tp_exposed = max(0.0, tp_time - compute) if layout.tp_overlap else tp_time
        notes["tp comm"] = (
            f"{what} {size / 1e6:.1f} MB over {layout.tp} at {bw:g} GB/s"
            + (f"; {tp_exposed * 1e3:.2f} ms exposed" if layout.tp_overlap else "")
        )

    # pipeline parallelism
    pp_time = bubble = 0.0
    if layout.pp > 1:
        bw, alpha = _link(network, _crosses_nodes(layout, "pp", gpus_per_node))
        size = pbytes * shape.seq * b * shape.hidden
        if layout.sequence_parallel:
            # A stage's output is already cut along the sequence: each tp rank sends
            # its own 1/t (Narayanan et al. 2021, section 4.1, do this by hand).
            size //= layout.tp
        v = layout.virtual_stages
        pp_time = 2 * m * v * ring_time("send", 2, size, bw, alpha)
        # Counted as sends, as a trace shows them: forward to the next stage, back to
        # the previous; a receive is the neighbour's send. With v chunks per GPU only
        # the very first chunk sends nothing back and the very last nothing on.
        sends = m * (2 * v - int(stage == 0) - int(stage == layout.pp - 1))
        collectives["send_recv pp"] = (sends, float(sends * size))
        bubble = (layout.pp - 1) / (v * m) * compute
        chunks = f" x {v}" if v > 1 else ""
        notes["pp comm"] = f"2 x {m}{chunks} x {size / 1e6:.1f} MB at {bw:g} GB/s"
        notes["bubble"] = (
            f"({layout.pp} - 1) / ({v} x {m}) x {compute * 1e3:.1f} ms"
            if v > 1
            else f"({layout.pp} - 1) / {m} x {compute * 1e3:.1f} ms"
        )
    time = {
        "compute": compute,
        "dp comm": dp_time,
        "tp comm": tp_time,
        "pp comm": pp_time,
        "bubble": bubble,
    }
    step = compute + tp_exposed + pp_time + bubble + dp_exposed
    notes["step"] = f"{step * 1e3:.1f} ms"
    return time, collectives, step, notes
