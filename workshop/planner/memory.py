"""The estimator's memory terms: what one GPU holds for a parallel layout, in bytes.

The formulas of :func:`workshop.planner.estimator.estimate`'s "parameters",
"gradients", "optimizer", "activations" and "buffers" (time terms:
:mod:`workshop.planner.step_time`); :func:`workshop.training.models.saved_tensor_bytes`
checks the activation formula against what autograd really saves.

Notation: Ψ parameters this GPU holds, L layers, h hidden size, f MLP width, a heads,
V vocabulary, s sequence, b micro-batch (sequences), m micro-batches per step,
t = tp, p = pp, N = dp, e bytes of one activation value (2 for bf16, 4 for fp32).

- Ψ: one pipeline stage's L/p blocks and edges, matrices and embedding split over t
  (Megatron's column/row and vocabulary split), RMSNorm weights whole.
- parameters, gradients, optimizer: ZeRO (Rajbhandari et al., 2020, section 5)
  divides the optimizer state by N at stage 1, also the gradients at 2, also the
  parameters at 3; bytes per parameter from :data:`PRECISIONS` (bf16 stages 0-2: the
  paper's 2 + 2 + 12). bf16 at stage 3 is what FSDP2 with a bf16
  ``MixedPrecisionPolicy`` holds: fp32 shards as the master copy, 4/N + 4/N + 8/N,
  the bf16 copies counted in buffers. (PyTorch's DDP and ZeRO-1/2 tools hold fp32
  parameters and gradients under autocast: other terms, a close total.)
- activations: what autograd saves for this package's
  :class:`~workshop.planner.transformer.Block` (fused SDPA, so no s x s scores), in
  the way of Korthikanti et al. 2022 (section 4), per layer::

      e s b (6 h + 2)  +  [e s b (4 h + k f) + 4 s b a] / t      k = 4 SwiGLU, 2 GELU

  6 h + 2: the norms' inputs, outputs and scales, whole on every tp rank; 4 h: q, k,
  v and the attention output; k f: the MLP; 4 s b a: the kernel's log-sum-exp. The
  first stage adds the token ids, the last the head's input, the fp32 log-softmax
  (4 s b V / t) and the targets. Full checkpointing (Chen et al., 2016) keeps each
  block's input and one block's full set; selective saves nothing more with a fused
  kernel. 1F1B (Narayanan et al., 2021, section 2.2): stage i holds min(p - i, m)
  micro-batches; interleaving v chunks holds (1 + (p - 1) / (p v)) times the blocks'
  share. Sequence parallelism divides the 6 h + 2 term (and a kept input) by t.
- buffers: FSDP (zero=3): two blocks' gathered parameters and the root's, and one
  block's unsharded gradients in the reduce dtype (:func:`fsdp_reduce_bytes`). DDP: a
  copy of the gradients in its buckets. ZeRO-1/2: one 25 MiB bucket (assumed).
  Pipeline: a received activation and gradient (2 e s b h).
- A module (ResNet-50, SmallCNN): Ψ counted on it, activations measured once on the
  meta device times b; under FSDP it is one unit.
"""

from __future__ import annotations

from ..checks import whole
from ..training.models import module_figures
from .layout import Layout, ModelShape, model_shape
from .operations import StageRecord, stage_layers, stage_record

__all__ = [
    "activation_bytes",
    "fsdp_reduce_bytes",
    "layer_activation_bytes",
    "stage_number",
    "stage_parameters",
    "zero_bytes",
]

# --- ZeRO: the bytes of parameters, gradients and optimizer state --------------
#: Bytes per parameter of (parameters, gradients, optimizer state) with Adam: all
#: fp32, or the ZeRO paper's fp16 values with an fp32 master copy and moments.
PRECISIONS: dict[str, tuple[int, int, int]] = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}

#: The name of each stage, 0 being plain data parallelism (DDP).
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def stage_number(stage: int | str) -> int:
    """The stage as a number: "ddp" (or 0) is 0; 1, 2, 3 (or "1", "zero-2", ...).

    Raises:
        ValueError: anything else, with the stages there are.

    Example:
        >>> stage_number("ddp"), stage_number(2), stage_number("zero-3")
        (0, 2, 3)
    """
    if isinstance(stage, str):
        text = stage.strip().lower()
        if text == "ddp":
            return 0
        text = text.removeprefix("zero").lstrip("-_ ")
        if text in ("0", "1", "2", "3"):
            return int(text)
    elif isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3:
        return stage
    raise ValueError(
        f"stage={stage!r} is not a ZeRO stage; pass 'ddp' (or 0) for plain data "
        "parallelism, or 1, 2 or 3"
    )


def zero_bytes(
    parameters: int, world_size: int, stage: int | str, precision: str = "fp32"
) -> dict[str, int]:
    """Bytes each rank keeps for a model of ``parameters`` (Ψ) values trained with Adam.

    A sharded part is rounded up to a whole byte; a real rank's padding of Ψ to a
    multiple of ``world_size`` is left out.

    Args:
        parameters: Ψ.
        world_size: N, the data-parallel ranks.
        stage: "ddp" (or 0), 1, 2 or 3.
        precision: "fp32" (4 + 4 + 8 bytes per parameter) or "mixed" (2 + 2 + 12).

    Returns:
        ``{"params", "grads", "optimizer", "total"}``: bytes per rank.

    Raises:
        ValueError: a count below 1, or an unknown stage or precision.

    Example:
        >>> zero_bytes(1000, 4, "ddp")
        {'params': 4000, 'grads': 4000, 'optimizer': 8000, 'total': 16000}
        >>> zero_bytes(1000, 4, 2)["total"]      # 4 Ψ + 12 Ψ / 4
        7000
    """
    whole("parameters", parameters, fix="e.g. zero_bytes(1_000_000, 4, stage=2)")
    whole("world_size", world_size, fix="e.g. zero_bytes(1_000_000, 4, stage=2)")
    number = stage_number(stage)
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision={precision!r} is not known; pass one of "
            + ", ".join(repr(p) for p in PRECISIONS)
        )
    per_param = PRECISIONS[precision]
    # Stage s shards the last s of (optimizer state, gradients, parameters).
    sharded = (number >= 3, number >= 2, number >= 1)
    parts = [
        -(-size * parameters // world_size) if cut else size * parameters
        for size, cut in zip(per_param, sharded, strict=True)
    ]
    names = ("params", "grads", "optimizer")
    return dict(zip(names, parts, strict=True), total=sum(parts))


BUCKET = 25 * 2**20  # DDP's bucket_cap_mb=25 (PyTorch DDP documentation)


def bytes_of(precision: str) -> int:
    """Bytes of one value in the layout's precision: 2 for "bf16", 4 for "fp32"."""
    return 2 if precision == "bf16" else 4


def fsdp_reduce_bytes(precision: str) -> int:
    """Bytes per value of the gradients FSDP reduce-scatters: 4, fp32, in both
    precisions, as torchtitan and PyTorch from 2.15 reduce (bf16 before: half)."""
    bytes_of(precision)  # the same precisions as everywhere
    return 4


def stage_parameters(
    model: str | ModelShape, stage: int = 0, pp: int = 1, tp: int = 1
) -> int:
    """Parameters one GPU of pipeline stage ``stage`` of ``pp`` holds at ``tp``-way
    tensor parallelism (with ``tp=1``, what
    :func:`~workshop.planner.transformer.build_transformer` builds for it).

    Raises:
        ValueError: a module, a layout that cannot split the model, or a stage
            outside ``0 .. pp - 1``.

    Example:
        >>> psi = stage_parameters("transformer-8b", stage=0, pp=1, tp=1)
        >>> psi == model_shape("transformer-8b").parameters()
        True
    """
    model = model_shape(model)
    if model.kind != "transformer":
        raise ValueError(
            f"stage_parameters needs a transformer; {model.name} is a module"
        )
    Layout(tp=tp, pp=pp).check_fits(model)
    whole("stage", stage, 0, pp - 1, f"a stage of pp={pp}")
    return stage_record(model, Layout(tp=tp, pp=pp), stage).psi


def layer_activation_bytes(
    model: str | ModelShape,
    micro_batch: int = 1,
    tp: int = 1,
    precision: str = "bf16",
    sequence_parallel: bool = False,
    scores: bool = True,
) -> int:
    """Bytes one block saves for its backward pass, per tensor-parallel rank::

        e s b (6 h + 2) + [e s b (4 h + k f) + 4 s b a] / t     (k = 4 SwiGLU, 2 GELU)

    With ``sequence_parallel`` the first term is split over t too; the module
    docstring gives each term.

    Raises:
        ValueError: a module, a micro-batch or ``tp`` below 1, ``tp`` not dividing the
            heads or MLP width, an unknown precision.

    Example:
        >>> per_sbh = layer_activation_bytes("transformer-8b") / (8192 * 4096)
        >>> round(per_sbh, 2)  # bytes per s b h: 6 + 4 + 4 x 3.5, bf16, and a little
        48.03
    """
    model = model_shape(model)
    if model.kind != "transformer":
        raise ValueError(
            f"layer_activation_bytes is a transformer formula; {model.name} is a "
            "module: "
            "use activation_bytes(model, layout), which measures it"
        )
    Layout(tp=tp, micro_batch=micro_batch, precision=precision).check_fits(model)
    e = bytes_of(precision)
    sb = model.seq * micro_batch
    k = 4 if model.mlp == "swiglu" else 2
    whole = e * sb * (6 * model.hidden + 2)
    split = e * sb * (4 * model.hidden + k * model.ffn) + 4 * sb * model.heads
    if model.attention == "unfused" and scores:
        # the s x s scores' softmax output (and with dropout its mask, 1 byte a
        # value, and output): Korthikanti et al. 2022, section 4.1, 5 a s^2 b in bf16
        kept = e + (e + 1 if model.dropout else 0)
        split += kept * micro_batch * model.heads * model.seq * model.seq
    if sequence_parallel:
        return (whole + split) // tp
    return whole + split // tp


def _edge_activation_bytes(
    model: ModelShape,
    micro_batch: int,
    tp: int,
    precision: str,
    first: bool,
    last: bool,
) -> int:
    e, sb = bytes_of(precision), model.seq * micro_batch
    total = 8 * sb if first else 0
    if last:
        total += e * sb * (3 * model.hidden + 1) + 4 * sb * model.vocab // tp + 8 * sb
    return total


def activation_bytes(model: str | ModelShape, layout: Layout, stage: int = 0) -> int:
    """Bytes of activations one GPU of pipeline stage ``stage`` holds at its peak:
    its blocks and edges per micro-batch, times the micro-batches in flight (see
    the module docstring).

    Raises:
        ValueError: a layout that cannot split the model, a stage outside the pipeline.
    """
    model = model_shape(model)
    layout.check_fits(model)
    whole("stage", stage, 0, layout.pp - 1, f"a stage of pp={layout.pp}")
    if model.kind == "module":
        saved, _ = module_figures(model.builder, model.sample, layout.precision)
        return saved * layout.micro_batch
    b, tp = layout.micro_batch, layout.tp
    per_stage = stage_layers(model.layers, layout.pp, stage)
    # Selective recomputation keeps no s x s scores: it recomputes them (section 5).
    layer = layer_activation_bytes(
        model, b, tp, layout.precision, layout.sequence_parallel,
        scores=layout.checkpointing != "selective",
    )  # fmt: skip
    edges = _edge_activation_bytes(
        model, b, tp, layout.precision, stage == 0, stage == layout.pp - 1
    )
    in_flight = min(layout.pp - stage, layout.micro_batches)
    if layout.checkpointing == "full":
        kept = per_stage * bytes_of(layout.precision) * model.seq * b * model.hidden
        if layout.sequence_parallel:
            kept //= tp  # each block's input is kept split along the sequence
        blocks = in_flight * kept
    else:
        blocks = in_flight * per_stage * layer
    # The interleaved schedule starts more micro-batches before the first backward:
    # x (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, section 4.2.3).
    v = layout.virtual_stages
    if v > 1:
        blocks = blocks * (layout.pp * v + layout.pp - 1) // (layout.pp * v)
    return blocks + in_flight * edges + (layer if layout.checkpointing == "full" else 0)


# --- all memory terms -----------------------------------------------------------------
def memory_terms(record: StageRecord) -> tuple[dict[str, float], dict]:
    """The memory terms (bytes) of one GPU of a stage, and each term's numbers."""
    shape, layout, stage = record.model, record.layout, record.stage
    pbytes = bytes_of(layout.precision)
    psi, block, root = record.psi, record.block, record.root
    # bf16 with FSDP2 keeps fp32 shards (4 + 4 + 8); the ZeRO paper's bf16 2 + 2 + 12.
    table = "mixed" if layout.precision == "bf16" and layout.zero < 3 else "fp32"
    held = zero_bytes(psi, layout.dp, layout.zero, table)
    acts = activation_bytes(shape, layout, stage)
    buffers, why = 0.0, "none"
    if layout.dp == 1:
        pass  # nothing to shard or reduce: no FSDP, no DDP
    elif layout.zero == 3 and shape.kind == "module":  # one unit: the whole module
        buffers = 2 * psi * pbytes
        why = f"2 x {psi:,} x {pbytes} B (parameters gathered, gradients unsharded)"
    elif layout.zero == 3:
        rbytes = fsdp_reduce_bytes(layout.precision)
        buffers = (2 * block + root) * pbytes + block * rbytes
        why = f"(2 x {block:,} + {root:,}) x {pbytes} B + {block:,} x {rbytes} B"
    elif layout.zero == 0:
        buffers = held["grads"]
        why = f"a copy of the gradients in DDP's buckets, {held['grads'] / 1e9:.2f} GB"
    else:
        buffers, why = float(BUCKET), "one 25 MiB bucket"
    if layout.pp > 1 and shape.kind == "transformer":
        received = 2 * pbytes * shape.seq * layout.micro_batch * shape.hidden
        buffers += received
        why += f" + {received / 1e6:.1f} MB received (pipeline)"
    parts = PRECISIONS[table]
    divisors = [
        layout.dp if cut else 1
        for cut in (layout.zero >= 3, layout.zero >= 2, layout.zero >= 1)
    ]
    text = {
        name: f"{psi:,} x {size} B / {div} = {held[key] / 1e9:.2f} GB"
        for name, key, size, div in zip(
            ("parameters", "gradients", "optimizer"),
            ("params", "grads", "optimizer"),
            parts,
            divisors,
            strict=True,
        )
    }
    in_flight = min(layout.pp - stage, layout.micro_batches)
    text["activations"] = (
        f"{in_flight} micro-batch(es) of {layout.micro_batch} in flight, "
        f"{acts / 1e9:.2f} GB"
    )
    text["buffers"] = f"{why}, {buffers / 1e9:.2f} GB"
    memory = {
        "parameters": float(held["params"]),
        "gradients": float(held["grads"]),
        "optimizer": float(held["optimizer"]),
        "activations": float(acts),
        "buffers": float(buffers),
    }
    return memory, {"text": text}
