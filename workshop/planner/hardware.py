"""The hardware a plan runs on: GPUs and their links, each figure with its source.

:class:`GPU` (peak throughput, memory, the matrix-product rate by size, memory
bandwidth) and :class:`Network` (link bandwidths, latency, and the bus bandwidth a
collective reaches by message size), with :data:`GPUS` and :data:`NETWORKS` of
published figures; ``python -m workshop.planner calibrate`` measures the same
records for the machine at hand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..sources.scale_data import published_quote, quoted_figures, scale_table

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
    if not isinstance(name, str) or name not in catalogue:  # (a list is unhashable)
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
# Every published figure below is read from its one home, workshop.sources.scale_data,
# where it is written with its source.
_MAMF, _TRIAD = quoted_figures("mamf"), quoted_figures("stream-triad")
_A100_GEMM = scale_table("gemm-a100-azure")


def _cite(quote) -> str:
    return f"{quote.source.cite()}: {quote.statement}"


#: fp16 products on one A100 by size (the tensor cores' bf16 rate), M = N = K.
_A100_MATMUL = tuple((x, x, x, tflops * 1e12) for x, tflops in _A100_GEMM.points)
#: H100 bf16 by size: no table by size is published that we could find (Azure's
#: H100 table is fp8), so the A100's curve is scaled to the H100's best shape:
#: each size reaches the same fraction of the best as on the A100. A larger GPU
#: needs larger products to fill it, so this errs on the fast side for small ones.
_H100_MATMUL = tuple(
    (m, n, k, rate * _MAMF["H100 80GB"] / _MAMF["A100 80GB"])
    for m, n, k, rate in _A100_MATMUL
)

_A100 = GPU(
    "A100 80GB",
    80,
    312.0,
    19.5,
    _NV_A100,
    _MAMF["A100 80GB"],
    f"{_cite(_MAMF)}; by size: {_A100_GEMM.source.cite()}",
    memory_gbs=_TRIAD["A100 80GB"] * 1000,  # TB/s
    memory_source=_cite(_TRIAD),
    sms=108,
    matmul_points=_A100_MATMUL,
)

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
            _MAMF["H100 80GB"],
            _cite(_MAMF),
            memory_gbs=_TRIAD["H100 80GB"] * 1000,  # TB/s
            memory_source=_cite(_TRIAD),
            sms=132,
            matmul_points=_H100_MATMUL,
        ),
        _A100,
        # The 40 GB A100 is the 80 GB one with half the memory: same chip, figures.
        replace(_A100, name="A100 40GB", memory_gb=40),
        GPU("V100 32GB", 32, 125.0, 15.7, _NV_V100 + "; fp16 tensor cores (no bf16)"),
    )
}

# Bus bandwidth by message size, nccl-tests' all_reduce_perf on the 8 GPUs of one
# node (Azure ND A100 v4 and ND H100 v5), and what a link tops out at.
_A100_AZURE = scale_table("nccl-allreduce-azure-nd-a100-v4")
_H100_AZURE = scale_table("nccl-allreduce-azure-nd-h100-v5")
_RING, _HDR, _NDR = (
    published_quote(name)
    for name in ("nccl-h100-ring", "nccl-1xhdr", "nccl-ndr-per-nic")
)
#: NVLink SHARP speeds up the H100's all-reduce inside the NVSwitch, and nothing
#: else: a gather or a scatter, or a ring, tops out at the ring's figure.
_H100_BUSBW = tuple(
    (size, min(gbs, _RING.busbw_gbs[1])) for size, gbs in _H100_AZURE.points
)
#: Between nodes one NIC per GPU is the limit: HDR 200G's 24 GB/s, NDR 400G's 46 to
#: 48 (the middle taken).
_HDR_GBS, _NDR_GBS = _HDR.busbw_gbs[1], sum(_NDR.busbw_gbs) / 2


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
            f"bus bandwidth: {_H100_AZURE.source.cite()}, at most "
            f"{_RING.source.cite()}'s ring figure; between nodes "
            f"{_NDR.source.cite()}",
            busbw_intra=_H100_BUSBW,
            busbw_inter=_capped(_H100_BUSBW, _NDR_GBS),
        ),
        Network(
            "NVLink 3 + HDR 200G",
            300.0,
            25.0,
            5e-6,
            10e-6,
            _NV_A100
            + " (NVLink 600 GB/s both ways); NVIDIA DGX A100: 200 Gb/s per GPU; "
            f"bus bandwidth: {_A100_AZURE.source.cite()}; between nodes "
            f"{_HDR.source.cite()}",
            busbw_intra=_A100_AZURE.points,
            busbw_inter=_capped(_A100_AZURE.points, _HDR_GBS),
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
