"""The hardware a plan runs on: GPUs and their links, each figure with its source.

:class:`GPU` (peak throughput, memory, the matrix-product rate by size, memory
bandwidth) and :class:`Network` (link bandwidths, latency, and the bus bandwidth a
collective reaches by message size), with :data:`GPUS` and :data:`NETWORKS` of
published figures; ``python -m workshop.planner calibrate`` measures the same
records for the machine at hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "GPU",
    "GPUS",
    "NETWORKS",
    "Network",
    "gpu_record",
    "network_record",
    "pick",
]


def pick(
    catalogue: dict[str, Any], name: Any, record: type, what: str, how: str
) -> Any:
    """``catalogue[name]``, or ``name`` itself when it is already a ``record``.

    Raises:
        ValueError: an unknown name, with the names there are and ``how`` to describe
            one of one's own.
    """
    if isinstance(name, record):
        return name
    if name not in catalogue:
        raise ValueError(
            f"{what}={name!r} is not one the planner knows; choose one of "
            f"{', '.join(catalogue)}, or describe yours with {how}"
        )
    return catalogue[name]


# --- the hardware ---------------------------------------------------------------------
@dataclass(frozen=True)
class GPU:
    """A GPU as the estimator needs it: memory, peak dense throughput, where from."""

    name: str
    memory_gb: float  # 10^9 bytes, as the vendor counts
    bf16_tflops: float  # dense, no sparsity
    fp32_tflops: float
    source: str
    #: The bf16 matrix-product throughput measured on this GPU, TFLOP/s, with where;
    #: None: not measured (the estimator then says what it assumes).
    matmul_bf16_tflops: float | None = None
    matmul_source: str = ""
    #: Memory (HBM) bandwidth a streaming kernel reaches, GB/s, with where; None:
    #: unknown (memory-bound operations are then left out of the step).
    memory_gbs: float | None = None
    memory_source: str = ""
    #: Streaming multiprocessors: a matrix product runs in waves of tiles over them.
    sms: int | None = None
    #: Seconds one operation costs beyond its FLOPs and bytes (launch and dispatch).
    launch_s: float = 0.0
    #: Matrix-product rates measured on this device at their own sizes, from
    #: ``python -m workshop.planner calibrate``: ((m, n, k, FLOP/s), ...). When given,
    #: a product's rate is read off these points instead of the tile model.
    matmul_points: tuple[tuple[int, int, int, float], ...] = ()
    #: The precision the points were measured in: a run in another one does not
    #: read them.
    matmul_precision: str = "bf16"
    #: Rates measured for each family of operations at the model's own shape,
    #: forward and backward through autograd, from ``calibrate``: ((family, rate),
    #: ...), a memory-bound family ("norm", "activation", "residual", "loss",
    #: "optimizer") in bytes/s as the formula sheet counts its bytes, "attention" in
    #: FLOP/s. A family without one runs at ``memory_gbs`` (or the product rate).
    operation_rates: tuple[tuple[str, float], ...] = ()

    @property
    def memory_bytes(self) -> float:
        """Memory in bytes."""
        return self.memory_gb * 1e9


@dataclass(frozen=True)
class Network:
    """Links seen by one GPU: within a node and between nodes, one direction.

    ``alpha`` is the latency of one message in seconds; bandwidths are bytes per
    second per GPU, one direction, as the alpha-beta model wants them.
    """

    name: str
    intra_node_gbs: float  # GB/s per GPU, one direction (NVLink)
    inter_node_gbs: float  # GB/s per GPU, one direction (its NIC)
    alpha_intra: float
    alpha_inter: float
    source: str
    #: Bus bandwidth a collective reaches by message size, ((bytes, GB/s), ...)
    #: ascending, as nccl-tests define it (busbw = algbw x 2 (n-1)/n for an
    #: all-reduce): within a node and between nodes. Empty: the link's bandwidth
    #: above, at every size.
    busbw_intra: tuple[tuple[float, float], ...] = ()
    busbw_inter: tuple[tuple[float, float], ...] = ()


_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"
_NV_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4)"
_NV_V100 = "NVIDIA V100 Tensor Core GPU datasheet (SXM2)"
_MAMF = (
    "S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS "
    "comparison table' (BF16, mean of 100 matmuls of the best shape found, after 50 "
    "warm-up): {gpu} {tflops} TFLOP/s of {peak}, torch {torch}"
)

_AZURE = "Microsoft Azure, AI-benchmarking-guide, Azure_Results/{file} ({what})"
#: cuBLASLt fp16 (the tensor cores' bf16 rate) on one A100 80GB, by size: M = N = K
#: 1,024 to 16,384, and 6,144 x 12,288 x 12,288 (TFLOP/s, random data).
_A100_MATMUL = tuple(
    (m, n, k, tflops * 1e12)
    for m, n, k, tflops in (
        (1024, 1024, 1024, 119.4),
        (2048, 2048, 2048, 221.8),
        (4096, 4096, 4096, 228.0),
        (8192, 8192, 8192, 253.7),
        (6144, 12288, 12288, 250.8),
        (16384, 16384, 16384, 256.5),
    )
)

_A100_MATMUL_SOURCE = _AZURE.format(
    file="ND_A100_v4_results.md", what="cuBLASLt fp16 GEMM by size, random data"
)
#: H100 bf16 by size: no table by size is published that we could find (Azure's
#: H100 table is fp8), so the A100's curve is scaled to the H100's best shape:
#: each size reaches the same fraction of the best as on the A100. A larger GPU
#: needs larger products to fill it, so this errs on the fast side for small ones.
_H100_MATMUL = tuple((m, n, k, rate * 794.5 / 271.2) for m, n, k, rate in _A100_MATMUL)

#: GPUs by name, with their vendor's published figures (dense, no sparsity).
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU(
            "H100 80GB",
            80,
            989.0,
            67.0,
            _NV_H100,
            794.5,
            _MAMF.format(gpu="H100 SXM", tflops=794.5, peak=989, torch="2.7.0+cu126"),
            memory_gbs=2970.0,
            memory_source=_AZURE.format(
                file="ND_H100_v5_results.md", what="BabelStream triad 2.97 TB/s"
            ),
            sms=132,
            matmul_points=_H100_MATMUL,
        ),
        GPU(
            "A100 80GB",
            80,
            312.0,
            19.5,
            _NV_A100,
            271.2,
            _MAMF.format(gpu="A100 SXM", tflops=271.2, peak=312, torch="2.6.0+cu126"),
            memory_gbs=1700.0,
            memory_source=_AZURE.format(
                file="ND_A100_v4_results.md", what="BabelStream triad 1.70 TB/s"
            ),
            sms=108,
            matmul_points=_A100_MATMUL,
        ),
        GPU(
            "A100 40GB",
            40,
            312.0,
            19.5,
            _NV_A100,
            271.2,
            _MAMF.format(gpu="A100 SXM", tflops=271.2, peak=312, torch="2.6.0+cu126"),
            memory_gbs=1700.0,
            memory_source=_AZURE.format(
                file="ND_A100_v4_results.md", what="BabelStream triad 1.70 TB/s"
            ),
            sms=108,
            matmul_points=_A100_MATMUL,
        ),
        GPU("V100 32GB", 32, 125.0, 15.7, _NV_V100 + "; fp16 tensor cores (no bf16)"),
    )
}

_MIB = 2**20
#: nccl-tests all_reduce bus bandwidth on 8 A100 SXM (NVLink 3, NVSwitch), GB/s by
#: message size (S. Bekman, Machine Learning Engineering, network/README.md).
_A100_BUSBW = tuple(
    (size * _MIB, gbs)
    for size, gbs in (
        (1 / 32, 1.31),
        (1, 18.0),
        (4, 72.3),
        (8, 109.9),
        (32, 138.5),
        (64, 171.5),
        (256, 194.1),
        (512, 222.7),
        (1024, 229.0),
        (16384, 234.9),
    )
)
#: nccl-tests on 8 H100 SXM (NVLink 4), GB/s by size: Azure ND H100 v5 all_reduce
#: up to 134 MB (AI-benchmarking-guide), capped at the 361 GB/s that all-gather and
#: reduce-scatter reach on 8 H200 at 16 GiB (S. Bekman, Machine Learning
#: Engineering, network/README.md): NVLink SHARP speeds up all-reduce alone.
_H100_BUSBW = tuple(
    (size * 1e6, min(gbs, 361.4))
    for size, gbs in (
        (0.001, 0.07),
        (1, 43.7),
        (4, 128.7),
        (16, 234.5),
        (67, 361.8),
        (134, 400.6),
        (1000, 466.0),
    )
)


def _capped(curve, cap: float):
    """A curve no faster than ``cap`` GB/s: between nodes the NIC is the limit."""
    return tuple((size, min(gbs, cap)) for size, gbs in curve)


#: Node and network links: NVLink within a node, one InfiniBand NIC per GPU between.
NETWORKS: dict[str, Network] = {
    n.name: n
    for n in (
        Network(
            "NVLink 4 + NDR 400G",
            450.0,
            50.0,
            5e-6,
            10e-6,
            _NV_H100
            + " (NVLink 900 GB/s both ways); NVIDIA DGX H100: 400 Gb/s per GPU; "
            "bus bandwidth: nccl-tests within a node (see _H100_BUSBW), and between "
            "nodes 47 GB/s per NDR NIC (NVIDIA, nccl-tests issue 290: 46-48 GB/s)",
            busbw_intra=_H100_BUSBW,
            busbw_inter=_capped(_H100_BUSBW, 47.0),
        ),
        Network(
            "NVLink 3 + HDR 200G",
            300.0,
            25.0,
            5e-6,
            10e-6,
            _NV_A100
            + " (NVLink 600 GB/s both ways); NVIDIA DGX A100: 200 Gb/s per GPU; "
            "bus bandwidth: nccl-tests within a node (see _A100_BUSBW), and between "
            "nodes 24 GB/s per HDR NIC (NVIDIA, nccl-tests issue 119)",
            busbw_intra=_A100_BUSBW,
            busbw_inter=_capped(_A100_BUSBW, 24.0),
        ),
        Network(
            "NVLink 2 + EDR 100G",
            150.0,
            12.5,
            5e-6,
            10e-6,
            _NV_V100 + " (NVLink 300 GB/s both ways); 100 Gb/s EDR per GPU",
        ),
    )
}


def gpu_record(gpu: str | GPU) -> GPU:
    """A GPU of :data:`GPUS` by name (a record as it is).

    Raises:
        ValueError: an unknown name, with the names there are.

    Example:
        >>> gpu_record("H100 80GB").memory_gb
        80
    """
    how = "GPU(name, memory_gb, bf16_tflops, fp32_tflops, source)"
    return pick(GPUS, gpu, GPU, "gpu", how)


def network_record(network: str | Network) -> Network:
    """A network of :data:`NETWORKS` by name (a record as it is).

    Raises:
        ValueError: an unknown name, with the names there are.
    """
    return pick(NETWORKS, network, Network, "network", "Network(...)")
