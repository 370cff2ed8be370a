"""The hardware a layout planner plans for: a GPU, the links of a node and a network,
each with its vendor's published figures.

:mod:`workshop.planner.layout` re-exports every name here beside the model and the
layout records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GPU", "GPUS", "NETWORKS", "Network", "pick"]


@dataclass(frozen=True)
class GPU:
    """A GPU as the estimator needs it: memory, peak dense throughput, where from."""

    name: str
    memory_gb: float  # 10^9 bytes, as the vendor counts
    bf16_tflops: float  # dense, no sparsity
    fp32_tflops: float
    source: str

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


_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"
_NV_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4)"
_NV_V100 = "NVIDIA V100 Tensor Core GPU datasheet (SXM2)"

#: GPUs by name, with their vendor's published figures (dense, no sparsity).
GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("H100 80GB", 80, 989.0, 67.0, _NV_H100),
        GPU("A100 80GB", 80, 312.0, 19.5, _NV_A100),
        GPU("A100 40GB", 40, 312.0, 19.5, _NV_A100),
        GPU("V100 32GB", 32, 125.0, 15.7, _NV_V100 + "; fp16 tensor cores (no bf16)"),
    )
}

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
            + " (NVLink 900 GB/s both ways); NVIDIA DGX H100: 400 Gb/s per GPU",
        ),
        Network(
            "NVLink 3 + HDR 200G",
            300.0,
            25.0,
            5e-6,
            10e-6,
            _NV_A100
            + " (NVLink 600 GB/s both ways); NVIDIA DGX A100: 200 Gb/s per GPU",
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
