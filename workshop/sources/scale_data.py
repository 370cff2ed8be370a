"""The published figures at scale, as data: printed tables (:class:`ScaleTable`:
nccl-tests busbw, NeMo's GPT-3 175B weak scaling, matrix-product rates), quoted
bandwidths (:class:`QuotedBandwidth`) and quotes whose numbers a program reads
(:class:`QuotedFigures`). Only figures read in their source are here, as it prints
them, each with its exact source and address; the benchmarks
(:mod:`workshop.bench.published_scale`) and the planner read them from here, so
each is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .documents import pick_named
from .published import PublishedQuote, PublishedTable, Source

__all__ = [
    "QUOTES",
    "TABLES",
    "QuotedBandwidth",
    "QuotedFigures",
    "ScaleTable",
    "answer",
    "published_quote",
    "quoted_figures",
    "scale_table",
]


@dataclass(frozen=True)
class ScaleTable(PublishedTable):
    """A published table at scale: ``points`` are (x, y) in the units named here.

    Attributes:
        x_unit: "bytes" (message size) or "GPUs".
        y_unit: e.g. "busbw GB/s" or "tokens/s (all GPUs)".
        world_size: GPUs in one all-reduce (bus-bandwidth tables), else None.
        columns: the source's other columns, ``(name, values)``.
        size_labels: the message sizes as the source writes them.
        seq, flops_per_sequence, peak_tflops: what an MFU is worked out from.
    """

    x_unit: str = "GPUs"
    y_unit: str = ""
    world_size: int | None = None
    columns: tuple[tuple[str, tuple[float, ...]], ...] = ()
    size_labels: tuple[str, ...] = ()
    seq: int | None = None
    flops_per_sequence: float | None = None
    peak_tflops: float | None = None

    def column(self, name: str) -> tuple[float, ...]:
        """The values of one of the source's columns.

        Raises:
            ValueError: a column the table does not have; the message lists them.
        """
        for key, values in self.columns:
            if key == name:
                return values
        raise ValueError(
            f"table {self.name!r} has no column {name!r}; it has "
            f"{[key for key, _ in self.columns]}"
        )

    def numbers_text(self) -> str:
        """Every figure credited to the source: the points and the other columns."""
        text = " ".join(f"{x} {y:g}" for x, y in self.points)
        for _, values in self.columns:
            text += " " + " ".join(f"{v:g}" for v in values)
        return text


@dataclass(frozen=True)
class QuotedBandwidth(PublishedQuote):
    """A bus bandwidth quoted on its own, with the link it ran over.

    Attributes:
        link: "InfiniBand" (between nodes) or "NVLink" (within one).
        line_rate_gbs: one direction, GB/s: a node's NICs together, or one GPU's
            NVLink.
        busbw_gbs: (low, high); equal ends for a single figure.
    """

    link: str = "InfiniBand"
    line_rate_gbs: float = 0.0
    busbw_gbs: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class QuotedFigures(PublishedQuote):
    """A quote whose numbers a program reads: ``values``, ((name, value), ...),
    each as the statement writes it, in ``unit``."""

    unit: str = ""
    values: tuple[tuple[str, float], ...] = ()

    def __getitem__(self, name: str) -> float:
        """The value called ``name``.

        Raises:
            KeyError: a name the quote does not have; the message lists them.
        """
        for key, value in self.values:
            if key == name:
                return value
        known = [key for key, _ in self.values]
        raise KeyError(f"{self.name!r} has no figure {name!r}; it has {known}")


# --- sources -------------------------------------------------------------------------

_DGXC = "https://github.com/NVIDIA/dgxc-benchmarking/blob/"
_NCCL_SAMPLE = Source(
    title="DGX Cloud Benchmarking recipes, NCCL microbenchmark (nccl/README.md), "
    "'View sample output (AllReduce excerpt)': all_reduce_perf on one node of "
    "8 H100 80GB HBM3",
    organisation="NVIDIA",
    year=2025,
    url=_DGXC + "v25.10/nccl/README.md",
)
_NEMO_175B = Source(
    title="DGX Cloud Benchmarking recipes, NeMo Megatron GPT3 175B "
    "(nemo_megatron/README_175b.md), 'Expected Performance' tables",
    organisation="NVIDIA",
    year=2025,
    url="https://github.com/NVIDIA/dgxc-benchmarking/tree/v25.04/nemo_megatron",
)
_AZURE = "https://github.com/Azure/AI-benchmarking-guide/tree/main/Azure_Results"
_NCCL_TABLE = (
    "'NCCL Bandwidth' table: all_reduce_perf, in-place busbw, 1 KB to 8 GB, NCCL 2.18.5"
)


def _azure_part(vm: str, file: str, part: str) -> Source:
    return Source(
        title=f"Azure AI Benchmarking Guide, {vm} results (Azure_Results/{file}), "
        f"{part}",
        organisation="Microsoft Azure",
        year=2024,
        url=_AZURE,
    )


_BEKMAN = Source(
    title="S. Bekman, Machine Learning Engineering, compute/accelerator/README.md, "
    "'Maximum Achievable Matmul FLOPS comparison table' (BF16, the best shape found, "
    "mean of 100 matmuls after 50 warm-up)",
    organisation="S. Bekman (open book)",
    year=2025,
    url="https://github.com/stas00/ml-engineering",
)
_KORTHIKANTI = Source(
    title="Korthikanti et al., 'Reducing Activation Recomputation in Large "
    "Transformer Models', MLSys 2023, arXiv:2205.05198, Table 5",
    organisation="NVIDIA",
    year=2022,
    url="https://arxiv.org/abs/2205.05198",
)
_LLAMA3 = Source(
    title="Dubey et al., 'The Llama 3 Herd of Models', arXiv:2407.21783, Table 4 "
    "(8K sequence rows) and section 3.3.2",
    organisation="Meta",
    year=2024,
    url="https://arxiv.org/abs/2407.21783",
)


def answer(who: str, repo: str, number: int, year: int, title: str) -> Source:
    """A GitHub answer by an NCCL maintainer at NVIDIA, as a source."""
    return Source(
        title=f"{who} (NVIDIA, NCCL team), answer in {repo} issue #{number}, '{title}'",
        organisation="NVIDIA (GitHub)",
        year=year,
        url=f"https://github.com/{repo}/issues/{number}",
    )


# --- tables ---------------------------------------------------------------------------

# fmt: off
# (bytes, out-of-place time in us, algbw GB/s, busbw GB/s), rows from 1 KiB up.
_DGX_H100_ROWS = (
    (1024, 16.94, 0.06, 0.11), (2048, 17.14, 0.12, 0.21), (4096, 23.59, 0.17, 0.30),
    (8192, 17.40, 0.47, 0.82), (16384, 17.93, 0.91, 1.60), (32768, 19.33, 1.70, 2.97),
    (65536, 19.54, 3.35, 5.87), (131072, 19.89, 6.59, 11.53),
    (262144, 20.43, 12.83, 22.45), (524288, 20.66, 25.38, 44.41),
    (1048576, 27.37, 38.31, 67.04), (2097152, 42.21, 49.68, 86.94),
    (4194304, 54.19, 77.39, 135.44), (8388608, 83.04, 101.01, 176.77),
    (16777216, 123.8, 135.55, 237.21), (33554432, 199.3, 168.39, 294.69),
    (67108864, 324.7, 206.67, 361.67), (134217728, 586.4, 228.88, 400.53),
    (268435456, 1112.5, 241.29, 422.25), (536870912, 2151.0, 249.59, 436.79),
    (1073741824, 4029.4, 266.48, 466.33), (2147483648, 7939.1, 270.50, 473.37),
    (4294967296, 15749.0, 272.71, 477.24), (8589934592, 31307.0, 274.38, 480.16),
    (17179869184, 62648.0, 274.23, 479.90),
)
# The Azure tables' sizes, as printed (rounded); all_reduce_perf -b 8 -e 8G -f 2
# doubles from 8 bytes, so they are 2**10 .. 2**33 bytes.
_AZURE_LABELS = (
    "1K", "2K", "4K", "8K", "16K", "32K", "65K", "132K", "256K", "524K", "1M", "2M",
    "4M", "8M", "16M", "33M", "67M", "134M", "268M", "536M", "1G", "2G", "4G", "8G",
)
_AZURE_H100 = (0.07, 0.14, 0.27, 0.53, 0.95, 1.71, 2.72, 5.40, 10.86, 21.35, 43.70,
               81.93, 128.73, 172.13, 234.45, 295.53, 361.78, 400.61, 423.38, 438.46,
               466.35, 472.36, 475.54, 478.87)
_AZURE_A100 = (0.04, 0.08, 0.17, 0.33, 0.67, 1.37, 2.70, 5.15, 10.11, 19.24, 36.22,
               53.54, 71.43, 89.99, 109.22, 132.77, 166.63, 174.18, 213.87, 221.58,
               228.10, 230.22, 230.48, 231.58)
# fmt: on
_GPUS = (128, 256, 512, 1024, 2048)
_GBS_PRINTED = (256.0, 512.0, 1204.0, 2048.0, 4096.0)  # sic: 1204 at 512 GPUs
_GPT3_SETUP = (
    "GPT-3 175B (96 layers, sequence 2048), NeMo Megatron on H100 80GB, TP 4, "
    "PP 8, virtual pipeline 6, micro-batch 1, global batch 2 per GPU (weak "
    "scaling); the source's MFU divides by {peak} TFLOPS, the {kind} peak, and "
    "takes 2.20E+15 model FLOPs per sequence"
)


def _azure_table(name: str, vm: str, file: str, gpu: str, values: tuple) -> ScaleTable:
    return ScaleTable(
        name=name,
        label=f"{gpu}, 8 in one VM (Azure {vm})",
        setup=f"NCCL all-reduce (all_reduce_perf -g 8), 8 {gpu} GPUs of one Azure "
        f"{vm} VM over NVLink and NVSwitch, float sum, in-place busbw; the page "
        "names the NVLS algorithm (NVLink SHARP) above its tables",
        points=tuple((1 << (10 + i), v) for i, v in enumerate(values)),
        source=_azure_part(vm, file, _NCCL_TABLE),
        x_unit="bytes",
        y_unit="busbw GB/s",
        world_size=8,
        size_labels=_AZURE_LABELS,
    )


def _nemo(
    kind: str, peak: float, step: tuple, tokens: tuple, mfu: tuple, days: tuple
) -> ScaleTable:
    return ScaleTable(
        name=f"nemo-gpt3-175b-h100-{kind.lower()}",
        label=f"GPT-3 175B {kind}, H100 (NVIDIA NeMo)",
        setup=_GPT3_SETUP.format(peak=f"{peak:g}", kind=kind),
        points=tuple(zip(_GPUS, tokens, strict=True)),
        source=_NEMO_175B,
        x_unit="GPUs",
        y_unit="tokens/s (all GPUs)",
        columns=(
            ("step s", step),
            ("MFU %", mfu),
            ("days for 1T tokens", days),
            ("global batch", _GBS_PRINTED),
        ),
        seq=2048,
        flops_per_sequence=2.20e15,
        peak_tflops=peak,
    )


TABLES = (
    ScaleTable(
        name="nccl-allreduce-dgx-h100",
        label="H100, 8 in one node (NVIDIA sample)",
        setup="NCCL all-reduce (all_reduce_perf, one process per GPU), 8 H100 80GB "
        "HBM3 of one node over NVLink and NVSwitch, float sum, out-of-place time, "
        "algbw and busbw; rows from 1 KiB to 16 GiB",
        points=tuple((s, b) for s, _, _, b in _DGX_H100_ROWS),
        source=_NCCL_SAMPLE,
        x_unit="bytes",
        y_unit="busbw GB/s",
        world_size=8,
        columns=(
            ("time us", tuple(t for _, t, _, _ in _DGX_H100_ROWS)),
            ("algbw GB/s", tuple(a for _, _, a, _ in _DGX_H100_ROWS)),
        ),
    ),
    _azure_table(
        "nccl-allreduce-azure-nd-h100-v5",
        "ND H100 v5",
        "ND_H100_v5_results.md",
        "H100 80GB",
        _AZURE_H100,
    ),
    _azure_table(
        "nccl-allreduce-azure-nd-a100-v4",
        "ND A100 v4",
        "ND_A100_v4_results.md",
        "A100 80GB",
        _AZURE_A100,
    ),
    ScaleTable(
        name="gemm-a100-azure",
        label="A100 80GB, cuBLASLt fp16 GEMM, M = N = K (Azure ND A100 v4)",
        setup="one A100 80GB SXM of an Azure ND A100 v4 VM: cuBLASLt fp16 "
        "products of square matrices, random data, TFLOP/s",
        points=(
            (1024, 119.4),
            (2048, 221.8),
            (4096, 228.0),
            (8192, 253.7),
            (16384, 256.5),
        ),
        source=_azure_part("ND A100 v4", "ND_A100_v4_results.md", "'GEMM' table"),
        x_unit="M = N = K",
        y_unit="TFLOP/s",
    ),
    _nemo(
        "BF16",
        989.0,
        (8.309, 8.408, 8.42, 8.453, 8.49),
        (63099.0, 124712.0, 249068.0, 496191.0, 988057.0),
        (53.54, 52.91, 52.84, 52.63, 52.40),
        (183.0, 93.0, 46.0, 23.0, 12.0),
    ),
    _nemo(
        "FP8",
        1979.0,
        (5.626, 5.725, 5.774, 5.82, 5.96),
        (93190.0, 183157.0, 363206.0, 720671.0, 1407485.0),
        (39.52, 38.84, 38.51, 38.20, 37.30),
        (124.0, 63.0, 32.0, 16.0, 8.0),
    ),
)


# --- quotes ---------------------------------------------------------------------------

_MEGATRON = "https://github.com/NVIDIA/Megatron-LM"
_NARAYANAN = Source(
    title="Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU "
    "Clusters Using Megatron-LM', SC21, arXiv:2104.04473",
    organisation="NVIDIA, Stanford University, Microsoft Research",
    year=2021,
    url="https://arxiv.org/abs/2104.04473",
)

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
    return replace(_NARAYANAN, title=f"{_NARAYANAN.title}, {table}")


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
    QuotedFigures(
        "stream-triad",
        "BabelStream's triad on one GPU: 1.70 TB/s on an A100 80GB (Azure ND A100 "
        "v4) and 2.97 TB/s on an H100 80GB (ND H100 v5), of 2.04 and 3.35 on the "
        "datasheets",
        _azure_part("ND A100 v4 and ND H100 v5", "ND_*_results.md", "'STREAM' tables"),
        unit="TB/s",
        values=(("A100 80GB", 1.70), ("H100 80GB", 2.97)),
    ),
    QuotedFigures(
        "mamf",
        "the best BF16 matrix product found: 271.2 TFLOP/s of 312 on an A100 SXM "
        "(torch 2.6.0+cu126) and 794.5 of 989 on an H100 SXM (torch 2.7.0+cu126)",
        _BEKMAN,
        unit="TFLOP/s",
        values=(("A100 80GB", 271.2), ("H100 80GB", 794.5)),
    ),
    QuotedFigures(
        "korthikanti-iteration",
        "iteration times in seconds, full recomputation / sequence parallelism with "
        "selective recomputation: 22B 1.42 / 1.10, 175B 18.13 / 13.75, 530B 49.05 / "
        "37.83, 1T 94.42 / 71.49",
        _KORTHIKANTI,
        unit="s",
        values=(
            ("22B full", 1.42),
            ("22B selective", 1.10),
            ("175B full", 18.13),
            ("175B selective", 13.75),
            ("530B full", 49.05),
            ("530B selective", 37.83),
            ("1T full", 94.42),
            ("1T selective", 71.49),
        ),
    ),
    QuotedFigures(
        "narayanan-table1",
        "145.6 billion parameters on 1536 A100 GPUs at 148 teraFLOP/s per GPU; "
        "1008.0 billion on 3072 GPUs at 163 teraFLOP/s per GPU",
        _paper("Table 1"),
        unit="TFLOP/s per GPU",
        values=(("145.6B", 148.0), ("1T", 163.0)),
    ),
    QuotedFigures(
        "llama3-405b-mfu",
        "Llama 3 405B on 8K sequences: 43% BF16 MFU on 8,192 H100 GPUs, 41% on 16,384",
        _LLAMA3,
        unit="MFU",
        values=(("8192", 0.43), ("16384", 0.41)),
    ),
    PublishedQuote(
        "narayanan-zero3",
        "GPT-3 175B at a global batch of 1536 on A100 GPUs: tensor, pipeline and "
        "data parallelism give 153 teraFLOP/s per GPU on 384 GPUs and 141 on 1536; "
        "ZeRO-3 without model parallelism 144 and 44",
        _paper("Table 2"),
    ),
)


def scale_table(name: str) -> ScaleTable:
    """The table of :data:`TABLES` called ``name``.

    Raises:
        ValueError: no such table; the message lists them.
    """
    return pick_named(TABLES, (name,), "published table at scale")[0]


def quoted_figures(name: str) -> QuotedFigures:
    """The :class:`QuotedFigures` of :data:`QUOTES` called ``name``.

    Raises:
        ValueError: no such quote with figures; the message lists them.
    """
    found = [q for q in QUOTES if isinstance(q, QuotedFigures)]
    return pick_named(found, (name,), "quote with figures")[0]


def published_quote(name: str) -> PublishedQuote:
    """The quote of :data:`QUOTES` called ``name``.

    Raises:
        ValueError: no such quote; the message lists them.
    """
    return pick_named(QUOTES, (name,), "published quote")[0]
