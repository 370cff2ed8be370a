"""Published training runs beside the planner's estimate of the same layout.

A planner right only against its own formulas can still be wrong on the layouts real
runs used. :data:`PUBLISHED_RUNS` holds them, each with its source;
:func:`against_published` sets the estimate beside each (notebook 04, section 8).
What a source does not say, a row assumes and says so; nothing is fitted. Ratios are
estimate / published: above 1 the planner is faster than the run was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import list_of
from ..sources.scale_data import quoted_figures, scale_table
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
    "step_breakdown",
]

WITHIN = 0.15  # the goal: every estimate within 15 % of the published figure


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: its model, layout, hardware and figure.

    ``measure`` is "seconds" (the iteration time), "mfu" (without recomputation) or
    "tflops" (per GPU, Narayanan et al.'s count, with the recomputed forward).
    ``gap``: what the planner does not model where it misses by more than
    ``within``, ``band`` the ratio it gives today (so a test notices a move);
    ``memory_gap``: why a layout that was trained does not fit the planner's memory.
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
    within: float = WITHIN
    memory_gap: str = ""


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
        attention="unfused",
        dropout=0.1,
        source="a GPT as the run's source gives its sizes, built as Megatron-LM "
        "built it then: fused layers, attention scores written out (no flash "
        "attention), dropout 0.1",
    )


# The published figures themselves live in workshop.sources.scale_data, once.
_TIMES = quoted_figures("korthikanti-iteration")
_NEMO_TABLE = scale_table("nemo-gpt3-175b-h100-bf16")
_NEMO_MFU = _NEMO_TABLE.column("MFU %")
_NARAYANAN = (
    "Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM, SC 2021, Table 1 (Selene, DGX A100 80GB, 8 HDR 200G per node; "
    "vocabulary 51,200, sequence 2,048)"
)
_KORTHIKANTI = (
    "Korthikanti et al., Reducing Activation Recomputation in Large Transformer "
    "Models, 2022, Table 5: iteration times with full recomputation, and with "
    "sequence parallelism and selective recomputation (A100 80GB, tp 8, "
    "data-parallel size 1); micro-batch and interleaving as Calculon's "
    "megatron-validation files give them (Isaev et al., SC'23)"
)
_NEMO = (
    "NVIDIA, DGX Cloud Benchmarking recipes, NeMo Megatron GPT3 175B, 'Expected "
    "Performance' (BF16; MFU against 989 TFLOP/s, 2.20E+15 FLOPs per sequence)"
)
_LLAMA3 = (
    "Dubey et al., The Llama 3 Herd of Models, 2024, Table 4 (8K sequence rows; "
    "BF16 MFU) and section 3.3.2"
)
_NEMO_GAP = (
    "NeMo on H100 is slower than the planner by a sixth, and no operation the planner "
    "counts explains it: its products run at the A100's curve by size scaled to the "
    "H100's best shape, and a published H800 table by size (tilelang's fp16 "
    "benchmark) is faster still for products this large; its "
    "overlapped tensor-parallel collectives cost only their excess. Finding it takes "
    "a profile of one step of this recipe on H100s: the SMs Userbuffers holds while "
    "it overlaps, the clocks under sustained load, the schedule's own gaps"
)
_LLAMA_MEMORY = (
    "memory: Meta trained 8K sequences without activation checkpointing by freeing "
    "each tensor as soon as it is used and by lighter first and last stages; the "
    "planner keeps every activation of each micro-batch in flight until its "
    "backward pass, so it finds no room"
)
# NeMo's GPT-3 runs flash (fused) attention through Transformer Engine.
_GPT3 = _gpt("gpt3-175b", 96, 12288, 96, vocab=50304).with_(attention="flash")
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


def _nemo(gpus: int) -> PublishedRun:
    counts = [count for count, _ in _NEMO_TABLE.points]
    mfu = _NEMO_MFU[counts.index(gpus)] / 100  # the table prints percent
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
        gap=_NEMO_GAP,
        band=(1.12, 1.24),
    )


def _narayanan(name, billions, layers, hidden, heads, pp, gpus, batch):
    tflops = quoted_figures("narayanan-table1")["1T" if name == "1t" else billions]
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
        "overlapping the backward pass; no tensor-parallel overlap",
    )


def _korthikanti(name, layers, hidden, heads, pp, batch, micro, v, how):
    ckpt = "full" if how == "full" else "selective"
    return PublishedRun(
        f"korthikanti-{name}-{ckpt}",
        f"Megatron {name} {'full' if how == 'full' else 'SP+sel'}, {8 * pp} A100",
        _gpt(f"gpt-{name}", layers, hidden, heads),
        Layout(
            tp=8,
            pp=pp,
            micro_batch=micro,
            micro_batches=batch // micro,
            virtual_stages=v,
            checkpointing=ckpt,
            sequence_parallel=how != "full",
        ),
        "A100 80GB",
        "NVLink 3 + HDR 200G",
        "seconds",
        _TIMES[f"{name} {how}"],
        _KORTHIKANTI,
        f"TP 8, PP {pp}, batch {batch}, micro-batch {micro}, interleaving {v}, "
        + (
            "full recomputation"
            if how == "full"
            else "sequence parallelism and selective recomputation"
        )
        + " (published); no tensor-parallel overlap (Megatron-LM had none then)",
        within=0.10,
    )


def _llama(gpus: int, dp: int, per_dp: int) -> PublishedRun:
    mfu = quoted_figures("llama3-405b-mfu")[str(gpus)]
    return PublishedRun(
        f"llama3-405b-{gpus}",
        f"Llama 3 405B, {gpus:,} H100",
        _LLAMA_405B,
        Layout(
            dp=dp,
            tp=8,
            pp=16,
            zero=2,
            micro_batch=1,
            micro_batches=per_dp,
            virtual_stages=2,
            checkpointing="none",
            sequence_parallel=True,
        ),
        "H100 80GB",
        "NVLink 4 + NDR 400G",
        "mfu",
        mfu,
        _LLAMA3,
        f"TP 8, PP 16, DP {dp}, {per_dp} sequences of 8,192 per data-parallel rank, "
        "FSDP sharding gradients and optimizer state (ZeRO-2), the interleaved "
        "schedule, 126 layers with one fewer on the first and last stage, no "
        "activation checkpointing (published); micro-batch 1, sequence "
        "parallelism and 2 virtual stages (the smallest interleaving: assumed)",
        memory_gap=_LLAMA_MEMORY,
    )


#: Published runs, each with its source, layout, sequence, batch and figure.
PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    *(
        _korthikanti(name, layers, hidden, heads, pp, batch, micro, v, how)
        for name, layers, hidden, heads, pp, batch, micro, v in (
            ("22B", 48, 6144, 64, 1, 4, 4, 1),
            ("175B", 96, 12288, 96, 8, 64, 1, 3),
            ("530B", 105, 20480, 128, 35, 280, 1, 3),
            ("1T", 128, 25600, 160, 64, 512, 1, 1),
        )
        for how in ("full", "selective")
    ),
    _nemo(128),
    _nemo(2048),
    _narayanan("145b", "145.6B", 80, 12288, 96, 8, 1536, 2304),
    _narayanan("1t", "1T", 128, 25600, 160, 64, 3072, 3072),
    _llama(8192, 64, 32),
    _llama(16384, 128, 16),
)


def _narayanan_flops(model: ModelShape, batch: int) -> float:
    """Narayanan et al.'s FLOPs of one step, recomputation included (their eq. 3)."""
    s, layers, h, v = model.seq, model.layers, model.hidden, model.vocab
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


_ROWS_EXAMPLE = "e.g. rows = against_published()"


def _one(name: str, value: object, kind: type, fix: str) -> None:
    if not isinstance(value, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(
            f"{name} must be {article} {kind.__name__}, not {value!r} (a "
            f"{type(value).__name__}); {fix}"
        )


def estimated_figure(run: PublishedRun, est: Estimate) -> float:
    """The estimate's figure in the run's own measure (seconds, MFU, or TFLOP/s
    per GPU)."""
    _one("run", run, PublishedRun, "e.g. PUBLISHED_RUNS[0]")
    _one("est", est, Estimate, "e.g. the estimate(...) of that run")
    gpus = run.layout.world_size
    if run.measure == "seconds":
        return est.step
    if run.measure == "tflops":
        flops = _narayanan_flops(run.model, run.layout.global_batch)
        return flops / est.step / gpus / 1e12
    flops = run.layout.global_batch * run.model.seq * run.model.flops_per_token()
    return flops / est.step / gpus / (est.gpu.bf16_tflops * 1e12)


@dataclass(frozen=True)
class Against:
    """One run beside its estimate."""

    run: PublishedRun
    estimate: Estimate
    figure: float

    @property
    def ratio(self) -> float:
        """How much faster the estimate is than the run: estimate / published for a
        rate, published / estimate for an iteration time (above 1: too fast)."""
        if self.run.measure == "seconds":
            return self.run.published / self.figure
        return self.figure / self.run.published

    @property
    def error(self) -> float:
        """Estimate / published - 1, in the run's own measure."""
        return self.figure / self.run.published - 1

    @property
    def within(self) -> bool:
        """Whether the estimate is within the run's tolerance of its figure."""
        return abs(self.error) <= self.run.within


def against_published(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS) -> list[Against]:
    """Each run's estimate beside its published figure.

    Example:
        >>> rows = against_published()
        >>> sum(row.estimate.fits for row in rows), len(rows)  # see memory_gap
        (12, 14)
    """
    runs = list_of(
        "runs", runs, PublishedRun, "PublishedRun records", "e.g. PUBLISHED_RUNS[:2]"
    )
    rows = []
    for run in runs:
        est = estimate(run.model, run.layout, run.gpu, run.network, gpus_per_node=8)
        rows.append(Against(run, est, estimated_figure(run, est)))
    return rows


def _show(run: PublishedRun, value: float) -> str:
    if run.measure == "seconds":
        return f"{value:.2f} s"
    return f"{value:.1%}" if run.measure == "mfu" else f"{value:.0f} TF/s"


def published_table(rows: list[Against]) -> str:
    """The runs, one a line, in 88 columns: layout, memory per GPU, estimate,
    published, the estimate's error, and the gap where it is outside the run's
    tolerance (or its layout does not fit)."""
    rows = list_of("rows", rows, Against, "Against rows", _ROWS_EXAMPLE)
    lines = [
        f"{'run':<31}{'tp pp dp':>11}{'GB':>5}{'estimate':>10}{'published':>10}"
        f"{'error':>8}  ",
    ]
    gaps: dict[str, int] = {}
    for row in rows:
        lay = row.run.layout
        marks = []
        for miss, text in (
            (not row.within, row.run.gap or "unexplained"),
            (not row.estimate.fits, row.run.memory_gap or "does not fit: unexplained"),
        ):
            if miss:
                gaps.setdefault(text, len(gaps) + 1)
                marks.append(f"[{gaps[text]}]")
        lines.append(
            f"{row.run.label:<31}{f'{lay.tp} {lay.pp} {lay.dp}':>11}"
            f"{row.estimate.memory_total / 1e9:>5.0f}"
            f"{_show(row.run, row.figure):>10}{_show(row.run, row.run.published):>10}"
            f"{row.error:>+8.0%} {''.join(marks)}"
        )
    within = sum(row.within for row in rows)
    fits = sum(row.estimate.fits for row in rows)
    lines.append(
        f"{fits} of {len(rows)} layouts fit; {within} of {len(rows)} within "
        "tolerance (iteration times 10 %, the rest 15 %)"
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


def step_breakdown(row: Against) -> str:
    """One run's estimated step, part by part, beside the step it published (an
    iteration time as given; a rate turned into the step it implies), 88 columns.

    Example:
        >>> print(step_breakdown(against_published()[0]).splitlines()[0][:38])
        Megatron 22B full, 8 A100: one step of
    """
    _one("row", row, Against, "e.g. step_breakdown(against_published()[0])")
    est = row.estimate
    published = est.step * row.figure / row.run.published
    if row.run.measure == "seconds":
        published = row.run.published
    lines = [
        f"{row.run.label}: one step of {row.run.layout.global_batch} sequences, "
        f"stage {_stage(est)}",
        f"  {'part':<22}{'seconds':>10}{'% of step':>11}",
    ]
    for name, seconds in est.parts.items():
        lines.append(f"  {name:<22}{seconds:>10.2f}{100 * seconds / est.step:>11.1f}")
    lines.append(f"  {'estimate':<22}{est.step:>10.2f}{100.0:>11.1f}")
    how = (
        ""
        if row.run.measure == "seconds"
        else f" (from its {_show(row.run, row.run.published)})"
    )
    lines.append(f"  {'published':<22}{published:>10.2f}{how}")
    return "\n".join(line[:88] for line in lines)


def _stage(est: Estimate) -> str:
    rec = est.record
    return (
        "-" if rec is None else f"{rec.stage} of {est.layout.pp}, {rec.layers} blocks"
    )


def plot_against_published(rows: list[Against]) -> Figure:
    """Each run's error (estimate / published - 1, in its own measure), one point
    a run, with its tolerance shaded; sized for a 1280x720 projector."""
    rows = list_of("rows", rows, Against, "Against rows", _ROWS_EXAMPLE, empty=False)
    import matplotlib.pyplot as plt

    from ..draw.diagrams import HEIGHT_IN, WIDTH_IN
    from ..draw.plots import COLOURS, FONT

    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
        families = list(dict.fromkeys(row.run.source for row in rows))
        for y, row in enumerate(rows):
            tol = row.run.within
            ax.fill_betweenx([y - 0.4, y + 0.4], -100 * tol, 100 * tol,
                             color="#dddddd", lw=0)  # fmt: skip
            i = families.index(row.run.source)
            fill = COLOURS[i] if row.within else "none"
            ax.plot(100 * row.error, y, marker="os^D"[i % 4], ms=10, ls="none",
                    color=COLOURS[i], mfc=fill)  # fmt: skip
        for i, family in enumerate(families):
            ax.plot([], [], marker="os^D"[i % 4], ls="none", color=COLOURS[i],
                    label=family.split(",")[0].split(" et al")[0])  # fmt: skip
        ax.axvline(0, color="black", lw=1)
        ax.set_yticks(range(len(rows)), [row.run.label for row in rows])
        ax.invert_yaxis()
        limit = max(30.0, 110 * max(abs(row.error) for row in rows))
        ax.set_xlim(-limit, limit)
        ax.set_xlabel("estimate / published - 1 (%), in the run's own measure; "
                      "grey: its tolerance")  # fmt: skip
        ax.legend(loc="lower right", fontsize=12)
        fig.suptitle("The planner against published runs (hollow: outside)")
    plt.close(fig)
    return fig
