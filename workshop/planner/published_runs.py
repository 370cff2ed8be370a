"""Published training runs beside the planner's estimate of the same layout.

A planner that is right only against its own formulas can still be wrong where it
matters: on the layouts that real runs used. :data:`PUBLISHED_RUNS` holds ten of them,
each with its source, model, layout, sequence, batch and the figure it published (MFU,
or TFLOP/s per GPU counted the source's way). :func:`against_published` asks
:func:`~workshop.planner.estimator.estimate` for each layout and sets the two side by
side; :func:`published_table` prints them and :func:`plot_against_published` draws
them (notebook 04, section 8).

What a source does not say, the row assumes and says so in ``assumed``; nothing is
fitted to the published figures. Where the estimate misses by more than 15 %, the row
names in ``gap`` the term the planner does not model, and ``band`` holds the ratio
it gives today, so that a test notices when the estimate moves.

Ratios are estimate / published: above 1 the planner is faster than the run was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .estimator import Estimate, estimate
from .layout import Layout, ModelShape

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PUBLISHED_RUNS",
    "PublishedRun",
    "against_published",
    "plot_against_published",
    "published_table",
]

WITHIN = 0.15  # the goal: every estimate within 15 % of the published figure


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: its model, layout, hardware and figure.

    ``measure`` is "mfu" (model FLOPs utilisation, a fraction: the model's FLOPs
    without recomputation over GPUs x peak) or "tflops" (TFLOP/s per GPU with
    Narayanan et al.'s count, 96 B s l h^2 (1 + s / 6 h + V / 16 l h) per step,
    which includes the recomputed forward pass). ``flops_model``: the published
    model, when the planned one differs from it (see ``assumed``).
    """

    name: str
    label: str
    model: ModelShape
    layout: Layout
    gpu: str
    network: str
    measure: str
    published: float
    source: str
    assumed: str
    gap: str = ""
    band: tuple[float, float] = (1 - WITHIN, 1 + WITHIN)
    flops_model: ModelShape | None = None


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200):
    """A GPT as Megatron-LM builds it: GELU MLP of 4 h, fused layers, sequence 2048."""
    return ModelShape(
        name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq=2048,
        fused=True,
        source="a GPT as the run's source gives its sizes, built as Megatron-LM "
        "builds it",
    )


_NARAYANAN = (
    "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM, SC 2021, Table 1 (Selene, DGX A100 80GB, 8 HDR 200G per node; "
    "vocabulary 51,200, sequence 2,048)"
)
_KORTHIKANTI = (
    "Korthikanti et al., Reducing Activation Recomputation in Large Transformer "
    "Models, 2022: the model sizes and layouts, and their MFU as the Megatron-LM "
    "README's table gives it (A100 80GB, sequence parallelism and selective "
    "recomputation, data-parallel size 1)"
)
_NEMO = (
    "NVIDIA, DGX Cloud Benchmarking recipes, NeMo Megatron GPT3 175B, 'Expected "
    "Performance' (BF16; MFU against 989 TFLOP/s, 2.20E+15 FLOPs per sequence)"
)
_LLAMA3 = (
    "Dubey et al., The Llama 3 Herd of Models, 2024, Table 4 (8K sequence rows; "
    "BF16 MFU) and section 3.3.2"
)
_KERNELS = (
    "kernels that are not matrix products (norms, softmax, dropout, GELU, the "
    "optimizer step) and matrix products at the run's own shapes, slower than the "
    "best shape the matmul figure was measured on; the planner counts neither"
)
_NO_TP_OVERLAP = "no tensor-parallel overlap (Megatron-LM had none then); "
_LLAMA_GAP = (
    "Meta do not publish which activations they recompute nor their interleaving "
    "depth; the planner's assumed full recomputation costs a third more compute and "
    "plain 1F1B leaves the whole bubble"
)
_GPT3 = _gpt("gpt3-175b", 96, 12288, 96, vocab=50304)
_LLAMA_405B = ModelShape(
    "llama3-405b",
    layers=126,
    hidden=16384,
    heads=128,
    kv_heads=8,
    ffn=53248,
    vocab=128256,
    seq=8192,
    mlp="swiglu",
    source="Dubey et al. 2024, Table 3; the vocabulary as the released tokenizer "
    "has it (128,256)",
)
# 126 layers do not split over 16 stages: Meta took one layer off the first and the
# last stage (section 3.3.2), so 14 of the 16 stages hold 8 layers and set the pace.
# The planner splits 128 layers evenly, 8 a stage, and counts the MFU with the FLOPs
# of the real 126.
_LLAMA_PLANNED = _LLAMA_405B.with_(name="llama3-405b, 8 layers a stage", layers=128)


def _nemo(gpus: int, mfu: float) -> PublishedRun:
    dp = gpus // 32
    return PublishedRun(
        f"nemo-gpt3-175b-{gpus}",
        f"NeMo GPT-3 175B, {gpus:,} H100",
        _GPT3,
        Layout(
            dp=dp,
            tp=4,
            pp=8,
            zero=1,
            micro_batch=1,
            micro_batches=64,
            virtual_stages=6,
            sequence_parallel=True,
            tp_overlap=True,
        ),
        "H100 80GB",
        "NVLink 4 + NDR 400G",
        "mfu",
        mfu,
        _NEMO,
        "TP 4, PP 8, virtual pipeline 6, micro-batch 1, 2 sequences per GPU "
        "(published); sequence parallelism, tensor-parallel overlap and the "
        "distributed optimizer (ZeRO-1): Megatron-Core's settings for this recipe, "
        "not printed in the table",
        gap=_KERNELS,
        band=(1.25, 1.45),
    )


def _narayanan(name, billions, layers, hidden, heads, pp, gpus, batch, tflops, band):
    return PublishedRun(
        f"megatron-{name}",
        f"Megatron-LM {billions}, {gpus:,} A100",
        _gpt(f"gpt-{name}", layers, hidden, heads),
        Layout(
            dp=gpus // (8 * pp),
            tp=8,
            pp=pp,
            zero=0,
            micro_batch=1,
            micro_batches=batch // (gpus // (8 * pp)),
            checkpointing="full",
        ),
        "A100 80GB",
        "NVLink 3 + HDR 200G",
        "tflops",
        tflops,
        _NARAYANAN,
        f"TP 8, PP {pp}, batch {batch:,}, full recomputation (published); micro-batch "
        "1 and plain 1F1B (not given in Table 1); DDP with its all-reduce "
        "overlapping the backward pass",
        gap=_NO_TP_OVERLAP + _KERNELS,
        band=band,
    )


def _korthikanti(name, layers, hidden, heads, pp, batch, mfu, band):
    return PublishedRun(
        f"korthikanti-{name}",
        f"Megatron-LM {name} (SP), {8 * pp} A100",
        _gpt(f"gpt-{name}", layers, hidden, heads),
        Layout(
            tp=8,
            pp=pp,
            micro_batch=1,
            micro_batches=batch,
            checkpointing="selective",
            sequence_parallel=True,
        ),
        "A100 80GB",
        "NVLink 3 + HDR 200G",
        "mfu",
        mfu,
        _KORTHIKANTI,
        f"TP 8, PP {pp}, batch {batch}, sequence parallelism, selective "
        "recomputation (published); micro-batch 1 and plain 1F1B (assumed)",
        gap=_NO_TP_OVERLAP + _KERNELS,
        band=band,
    )


def _llama(gpus: int, dp: int, per_dp: int, mfu: float, band) -> PublishedRun:
    return PublishedRun(
        f"llama3-405b-{gpus}",
        f"Llama 3 405B, {gpus:,} H100",
        _LLAMA_PLANNED,
        Layout(
            dp=dp,
            tp=8,
            pp=16,
            zero=2,
            micro_batch=1,
            micro_batches=per_dp,
            checkpointing="full",
            sequence_parallel=True,
        ),
        "H100 80GB",
        "NVLink 4 + NDR 400G",
        "mfu",
        mfu,
        _LLAMA3,
        f"TP 8, PP 16, DP {dp}, {per_dp} sequences of 8,192 per data-parallel rank, "
        "FSDP sharding gradients and optimizer state (ZeRO-2) (published); "
        "micro-batch 1, sequence parallelism, plain 1F1B, and full recomputation: "
        "without it the first stage would hold over 100 GB of activations",
        gap=_LLAMA_GAP,
        band=band,
        flops_model=_LLAMA_405B,
    )


#: Published runs, each with its source, layout, sequence, batch and figure.
PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    _nemo(128, 0.5354),
    _nemo(2048, 0.5240),
    _narayanan("145b", "145.6B", 80, 12288, 96, 8, 1536, 2304, 148.0, (1.35, 1.55)),
    _narayanan("1t", "1T", 128, 25600, 160, 64, 3072, 3072, 163.0, (1.15, 1.35)),
    _korthikanti("22b", 48, 6144, 64, 1, 4, 0.415, (1.45, 1.65)),
    _korthikanti("175b", 96, 12288, 96, 8, 64, 0.514, (1.25, 1.45)),
    _korthikanti("530b", 105, 20480, 128, 35, 280, 0.560, (1.15, 1.35)),
    _korthikanti("1t", 128, 25600, 160, 64, 512, 0.563, (1.15, 1.35)),
    _llama(8192, 64, 32, 0.43, (0.65, 0.85)),
    _llama(16384, 128, 16, 0.41, (0.5, 0.7)),
)


def _narayanan_flops(model: ModelShape, batch: int) -> float:
    """Narayanan et al.'s FLOPs of one step, recomputation included (their eq. 3)."""
    s, layers, h, v = model.seq, model.layers, model.hidden, model.vocab
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def estimated_figure(run: PublishedRun, est: Estimate) -> float:
    """The estimate's figure in the run's own measure (MFU, or TFLOP/s per GPU)."""
    gpus = run.layout.world_size
    if run.measure == "tflops":
        flops = _narayanan_flops(run.model, run.layout.global_batch)
        return flops / est.step / gpus / 1e12
    model = run.flops_model or run.model
    flops = run.layout.global_batch * model.seq * model.flops_per_token()
    return flops / est.step / gpus / (est.gpu.bf16_tflops * 1e12)


@dataclass(frozen=True)
class Against:
    """One run beside its estimate."""

    run: PublishedRun
    estimate: Estimate
    figure: float

    @property
    def ratio(self) -> float:
        """Estimate / published."""
        return self.figure / self.run.published

    @property
    def within(self) -> bool:
        """Whether the estimate is within 15 % of the published figure."""
        return abs(self.ratio - 1) <= WITHIN


def against_published(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS) -> list[Against]:
    """Each run's estimate beside its published figure.

    Example:
        >>> rows = against_published()
        >>> all(row.estimate.fits for row in rows)
        True
    """
    rows = []
    for run in runs:
        est = estimate(run.model, run.layout, run.gpu, run.network, gpus_per_node=8)
        rows.append(Against(run, est, estimated_figure(run, est)))
    return rows


def _show(run: PublishedRun, value: float) -> str:
    return f"{value:.1%}" if run.measure == "mfu" else f"{value:.0f} TF/s"


def published_table(rows: list[Against]) -> str:
    """The runs, one a line, in 88 columns: layout, memory per GPU, estimate,
    published, their ratio, and the gap where the ratio is off by more than 15 %."""
    lines = [
        f"{'run':<30}{'tp pp dp':>12}{'GB':>6}{'estimate':>11}{'published':>11}"
        f"{'ratio':>7}  ",
    ]
    gaps: dict[str, int] = {}
    for row in rows:
        lay = row.run.layout
        mark = ""
        if not row.within:
            key = row.run.gap or "unexplained"
            gaps.setdefault(key, len(gaps) + 1)
            mark = f" [{gaps[key]}]"
        lines.append(
            f"{row.run.label:<30}{f'{lay.tp} {lay.pp} {lay.dp}':>12}"
            f"{row.estimate.memory_total / 1e9:>6.0f}"
            f"{_show(row.run, row.figure):>11}{_show(row.run, row.run.published):>11}"
            f"{row.ratio:>7.2f}{mark}"
        )
    within = sum(row.within for row in rows)
    fits = sum(row.estimate.fits for row in rows)
    lines.append(
        f"{fits} of {len(rows)} layouts fit; {within} of {len(rows)} within "
        f"{WITHIN:.0%} of the published figure"
    )
    for text, number in gaps.items():
        words, line = text.split(), f"[{number}]"
        for word in words:
            if len(line) + 1 + len(word) > 88:
                lines.append(line)
                line = "    "
            line += " " + word if line.strip() else word
        lines.append(line)
    return "\n".join(lines)


def plot_against_published(rows: list[Against]) -> Figure:
    """Estimate against published, one point a run, with the line where they agree
    and the 15 % band around it; sized for a 1280x720 projector."""
    import matplotlib.pyplot as plt

    from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
    from ..draw.plots import COLOURS, FONT

    with plt.rc_context(FONT):
        fig, axes = plt.subplots(
            1, 2, figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained"
        )
        for ax, measure, unit in (
            (axes[0], "mfu", "MFU %"),
            (axes[1], "tflops", "TFLOP/s per GPU"),
        ):
            mine = [row for row in rows if row.run.measure == measure]
            scale = 100.0 if measure == "mfu" else 1.0
            top = 1.2 * max(max(r.figure, r.run.published) for r in mine) * scale
            ax.fill_between([0, top], [0, top * (1 - WITHIN)],
                            [0, top * (1 + WITHIN)], color="#dddddd",
                            label="within 15 %")  # fmt: skip
            ax.plot([0, top], [0, top], color="black", lw=1)
            families = sorted({r.run.source for r in mine})
            for row in mine:
                i = families.index(row.run.source)
                ax.plot(row.run.published * scale, row.figure * scale,
                        marker="os^D"[i], ms=9, ls="none", color=COLOURS[i],
                        mfc="none" if not row.within else COLOURS[i])  # fmt: skip
            for i, family in enumerate(families):
                ax.plot([], [], marker="os^D"[i], ls="none", color=COLOURS[i],
                        label=family.split(",")[0].split(" et al")[0])  # fmt: skip
            ax.set_xlim(0, top)
            ax.set_ylim(0, top)
            ax.set_xlabel(f"published {unit}")
            ax.set_ylabel(f"planner {unit}")
            ax.legend(loc="upper left", fontsize=12)
        fig.suptitle("The planner against published runs (hollow: off by > 15 %)")
    plt.close(fig)
    return fig
