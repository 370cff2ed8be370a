"""Published figures at scale quoted on their own: bus bandwidths NCCL's maintainers
gave in answers (with the link's line rate), and utilisation of large training runs.

Read through :mod:`workshop.bench.published_scale` (``scale_quotes``). Every figure
is as its source writes it; every source is named exactly, with its address.
"""

from __future__ import annotations

from .published import PublishedQuote, Source
from .published_scale_data import QuotedBandwidth, answer

__all__ = ["QUOTES"]

_MEGATRON = "https://github.com/NVIDIA/Megatron-LM"
_NARAYANAN = Source(
    title="Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU "
    "Clusters Using Megatron-LM', SC21, arXiv:2104.04473",
    organisation="NVIDIA, Stanford University, Microsoft Research",
    year=2021,
    url="https://arxiv.org/abs/2104.04473",
)

# --- quotes ---------------------------------------------------------------------------

_NVLS = answer(
    "@sjeaugey", "NVIDIA/nccl-tests", 212, 2024, "H100 all reduce performance is poor"
)
_TWO_DGX = answer(
    "@AddyLaddy",
    "NVIDIA/nccl",
    812,
    2023,
    "Why Tree has better bandwidth performance than Ring on only 2 DGX-A100 ?",
)
_ONE_NIC = answer(
    "@sjeaugey",
    "NVIDIA/nccl",
    412,
    2023,
    "How will NCCL behave when there are multiple NICs on a node?",
)
_EDR = answer(
    "@sjeaugey", "NVIDIA/nccl-tests", 29, 2019, "Performance issues of NCCL Allreduce"
)
_NDR = answer(
    "@AddyLaddy",
    "NVIDIA/nccl-tests",
    290,
    2025,
    "Single-node and multi-node performance of H100 nodes.",
)


def _megatron(part: str, year: int, commit: str = "main") -> Source:
    return Source(
        title=f"Megatron-LM README, 'Training Speed and Scalability'{part}",
        organisation="NVIDIA",
        year=year,
        url=f"{_MEGATRON}/blob/{commit[:8]}/README.md",
    )


# Narayanan et al.'s tables are images in the paper; their figures here were read in
# two transcriptions of them (and the 1T row's in the abstract): check the PDF.
def _paper(table: str) -> Source:
    return Source(
        _NARAYANAN.title + f", {table}",
        _NARAYANAN.organisation,
        _NARAYANAN.year,
        _NARAYANAN.url,
    )


QUOTES: tuple[PublishedQuote, ...] = (
    QuotedBandwidth(
        "nccl-h100-nvls",
        "8 H100 GPUs in one node: all-reduce busbw peaks near 480 GB/s (algbw near "
        "275 GB/s) with NVLink SHARP, which adds inside the NVSwitch; NVLink's line "
        "rate is 450 GB/s",
        _NVLS,
        link="NVLink",
        line_rate_gbs=450.0,
        busbw_gbs=(480.0, 480.0),
    ),
    QuotedBandwidth(
        "nccl-h100-ring",
        "8 H100 GPUs in one node, ring all-reduce (NCCL_ALGO=RING): about 370 GB/s "
        "busbw of NVLink's 450 GB/s, the rest being protocol overhead of about 20%",
        _NVLS,
        link="NVLink",
        line_rate_gbs=450.0,
        busbw_gbs=(370.0, 370.0),
    ),
    QuotedBandwidth(
        "nccl-dgx-a100-8xhdr",
        "DGX A100 nodes, each with 8 InfiniBand cards of 200 Gbit/s: 192 GB/s "
        "all-reduce busbw across nodes",
        _TWO_DGX,
        line_rate_gbs=200.0,
        busbw_gbs=(192.0, 192.0),
    ),
    QuotedBandwidth(
        "nccl-1xhdr",
        "8 NVLink GPUs (A800) per node and a single HDR 200G InfiniBand card: busbw "
        "at 8G messages about 160 GB/s within the node and 24 GB/s between nodes",
        _ONE_NIC,
        line_rate_gbs=25.0,
        busbw_gbs=(24.0, 24.0),
    ),
    QuotedBandwidth(
        "nccl-1xedr",
        "one 100 Gbps InfiniBand card per node: 12.2 GB/s busbw, as good as it gets",
        _EDR,
        line_rate_gbs=12.5,
        busbw_gbs=(12.2, 12.2),
    ),
    QuotedBandwidth(
        "nccl-dgx1-4xedr",
        "DGX-1, with 4 InfiniBand adapters of 100 Gbps: 48 GB/s busbw",
        _EDR,
        line_rate_gbs=50.0,
        busbw_gbs=(48.0, 48.0),
    ),
    QuotedBandwidth(
        "nccl-ndr-per-nic",
        "NDR InfiniBand at 400Gbps: 46-48GB/s per NIC; on one node of 8 H100 an "
        "all-reduce busbw of 476GB/s is in the expected range",
        _NDR,
        line_rate_gbs=50.0,
        busbw_gbs=(46.0, 48.0),
    ),
    PublishedQuote(
        "megatron-h100-strong",
        "GPT-3 (a little over 175 billion parameters) strong-scaled from 96 to 4608 "
        "H100 GPUs at one batch of 1152 sequences: MFU falls from 47% to 42% as "
        "more of the communication shows",
        _megatron(", Strong Scaling Results", 2024),
    ),
    PublishedQuote(
        "megatron-h100-weak",
        "GPT models from 2B to 462B parameters on up to 6,144 H100 GPUs, weak "
        "scaling: MFU rises from 41% for the smallest to 47-48% for the largest, "
        "whose larger matrix products run more efficiently",
        _megatron(", Weak Scaling Results", 2024),
    ),
    PublishedQuote(
        "megatron-a100-mfu",
        "Megatron-LM with a data-parallel size of one: MFU (HFU) 41.5% (43.7%) for "
        "22B parameters, 51.4% (52.8%) for 175B, 56.0% (57.0%) for 530B and 56.3% "
        "(57.0%) for 1T",
        _megatron(
            " table, after Korthikanti et al., 'Reducing Activation "
            "Recomputation in Large Transformer Models', arXiv:2205.05198",
            2022,
            "01ad96e51bc394a093f0ba8765646bd1d9ac82fd",
        ),
    ),
    PublishedQuote(
        "narayanan-weak",
        "weak scaling on A100 GPUs: 1.7 billion parameters on 32 GPUs at 137 "
        "teraFLOP/s per GPU (44% of peak, 4.4 petaFLOP/s in all); 1008.0 billion on "
        "3072 GPUs at 163 teraFLOP/s per GPU (52%, 502.0 petaFLOP/s)",
        _paper("Table 1"),
    ),
    PublishedQuote(
        "narayanan-zero3",
        "GPT-3 175B at a global batch of 1536 on A100 GPUs: tensor, pipeline and "
        "data parallelism give 153 teraFLOP/s per GPU on 384 GPUs and 141 on 1536; "
        "ZeRO-3 without model parallelism 144 and 44",
        _paper("Table 2"),
    ),
)
