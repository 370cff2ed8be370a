"""The formula sheet: every operation one GPU of a pipeline stage runs in a step.

:func:`stage_record` computes, once per stage, what the memory terms and the time
terms both read: the parameters this GPU holds (per tensor, per block, the edges), the
blocks of its stage, and each operation with its own shape:

- matrix products with their M, N, K (and batch), so that each is timed at its own
  size (:mod:`workshop.planner.step_time`);
- memory-bound operations (norms, softmax, dropout, activations, residual adds, the
  loss, the optimizer step) with the bytes they read and write;
- collectives with the whole tensor's bytes, the mesh dimension they run on, and the
  compute they may hide behind.

Notation: T = s b tokens of one micro-batch, h hidden, f MLP width, a heads (a_kv
key-value heads, d = h / a per head), V vocabulary, t = tp, e bytes of an activation
value (2 bf16, 4 fp32); T' = T / t under sequence parallelism (the norms, dropouts
and residual adds are cut along the sequence), else T.

Forward, per block and micro-batch (Shoeybi et al. 2019, section 3; Korthikanti et
al. 2022, section 4.2.2 for sequence parallelism):

====================  ==========================================================
norm 1, norm 2        memory: read e T' h, write e T' h
(sp) all-gather       e T h before each column-parallel pair (2 per block)
q, k, v               matmul M = T, K = h, N = h / t, a_kv d / t, a_kv d / t
                      (fused: one product, N = (h + 2 a_kv d) / t)
attention             flash: QK^T and PV as products of b a / t heads, M = s, N = s
                      or d, K = d or s, half of them under the causal mask (the
                      kernel skips the masked tiles); unfused (Megatron-LM before
                      flash attention): the same products whole, and a fused
                      scale-mask-softmax reading and writing e b a s^2 / t, and
                      with dropout, a dropout reading and writing it with a mask of
                      1 byte a value
o                     matmul M = T, K = h / t, N = h
(tp) all-reduce       e T h after each row-parallel product (sp: reduce-scatter)
residual (x 2)        memory: read 2 e T' h, write e T' h (with dropout: + mask)
up (, gate)           matmul M = T, K = h, N = f / t (SwiGLU: two, or one fused)
activation            memory: GELU read e T f / t, write e T f / t; SwiGLU read 2,
                      write 1
down                  matmul M = T, K = f / t, N = h
====================  ==========================================================

Backward: each product twice (the input's gradient, M = T, N = K, K = N; the
weight's, M = K, N = N, K = T), at the same FLOPs; each memory-bound operation reads
its saved input and the incoming gradient and writes one gradient (norm, softmax,
activation: 3 units of the forward's 2; dropout and residual: as the forward). The
collectives mirror the forward: an all-reduce of each column-parallel input's gradient
(sp: a reduce-scatter; and an all-gather at each row-parallel output). Recomputation:
full checkpointing runs the block's forward again in the backward pass (collectives
included); selective recomputes the attention core only (Korthikanti et al. 2022,
section 5).

Per micro-batch on the edges: the embedding lookup (first stage: write e T' h, and
with tp an all-reduce, sp a reduce-scatter, of e T h), the final norm, the head
(matmul M = T, K = h, N = V / t, on the last stage) and the cross-entropy (read and
write 4 T V / t twice: softmax and its gradient, in fp32); a pipeline stage sends e T
h (sp: / t) forward and the same gradient back at each boundary.

Per step: the optimizer reads and writes each parameter's state (Adam:
:data:`OPTIMIZER_BYTES`), and data parallelism reduces the gradients
(:mod:`workshop.planner.step_time` gives the schedule of each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import Layout, ModelShape

__all__ = [
    "GRADIENT_BYTES",
    "OPTIMIZER_BYTES",
    "Operation",
    "StageRecord",
    "family",
    "stage_layers",
    "stage_record",
]

#: Bytes the optimizer step reads and writes per parameter, with where the count
#: comes from. "fused": one Adam kernel over fp32 master weights (Megatron-LM's and
#: NeMo's FusedAdam, with bf16 weights): reads weight, gradient and two moments (16 B),
#: writes weight and moments (12 B), copies the master into the bf16 weight (read 4,
#: write 2) and zeroes the fp32 gradient for the next step (write 4): 38 B.
#: "foreach": torch.optim.Adam's default on CPU and GPU (``_multi_tensor_adam`` in
#: torch/optim/adam.py, no weight decay): lerp of the first moment (3 passes of 4 B),
#: mul and addcmul of the second (2 + 4), sqrt, div and add for the denominator
#: (2 + 2 + 2) and addcdiv into the weight (4): 19 passes of 4 B, 76 B.
OPTIMIZER_BYTES: dict[str, tuple[int, str]] = {
    "fused": (
        38,
        "one fused Adam kernel on fp32 master weights (Megatron-LM, NeMo): read 16, "
        "write 12, copy to bf16 6, zero the gradient 4",
    ),
    "pytorch": (
        76,
        "torch.optim.Adam (torch/optim/adam.py, foreach: _multi_tensor_adam): 19 "
        "passes over 4-byte values",
    ),
}
#: Bytes a plain PyTorch loop moves per parameter and step besides the optimizer:
#: ``zero_grad(set_to_none=False)`` writes the gradients (4 B), the backward pass adds
#: each new gradient into them (read 8, write 4), and DDP copies them into its
#: buckets and back (gradient_as_bucket_view=False, its default: 2 x (read 4 +
#: write 4)). Megatron-LM and NeMo accumulate in the weight-gradient product and
#: zero in the fused optimizer (``OPTIMIZER_BYTES["fused"]``): nothing here.
GRADIENT_BYTES = {"fused": (0, 0), "pytorch": (16, 16)}


def family(op: Operation) -> str:
    """The family an operation's measured rate is looked up by: "attention",
    "norm", "residual", "activation", "loss", or its kind."""
    if op.name.startswith("attention"):
        return "attention"
    for name in ("norm", "residual", "activation", "loss"):
        if name in op.name:
            return name
    return op.kind


@dataclass(frozen=True)
class Operation:
    """One operation of one GPU, with the shape it runs at.

    ``kind``: "matmul" (``m``, ``n``, ``k``, ``batch``; its FLOPs are ``2 m n k
    batch``), "memory" (``nbytes`` read and written) or "collective" (``nbytes`` of
    the whole tensor, ``collective`` one of "all_reduce", "all_gather",
    "reduce_scatter", "send", on mesh dimension ``group``).
    ``phase``: "forward", "backward", "recompute" (a forward run again in the
    backward pass) or "step" (once a step). ``count``: how many times it runs per
    block and micro-batch (``per`` = "block"), per micro-batch ("micro-batch") or
    per step ("step"). ``hides``: for a collective, the compute it may overlap
    (empty: none; the rules are :mod:`~workshop.planner.step_time`'s).
    """

    name: str
    kind: str
    phase: str
    per: str
    count: int = 1
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    nbytes: float = 0.0
    collective: str = ""
    group: str = ""
    hides: str = ""
    #: The fraction of the product's FLOPs done (a causal kernel skips half).
    fraction: float = 1.0

    @property
    def flops(self) -> float:
        """FLOPs of one run of this operation (0 unless a matrix product)."""
        if self.kind != "matmul":
            return 0.0
        return 2.0 * self.m * self.n * self.k * self.batch * self.fraction


@dataclass(frozen=True)
class StageRecord:
    """What one GPU of pipeline stage ``stage`` holds and runs: computed once,
    read by the memory terms and by the time terms.

    ``layers``: blocks on this stage (:func:`stage_layers`); ``block``: parameters of
    one block on one tensor-parallel rank; ``root``: the embedding (first stage),
    final norm and head (last stage) on one rank; ``psi``: all it holds;
    ``tensor_sizes``: each parameter tensor in the order the stage registers them;
    ``operations``: every :class:`Operation` (empty for a module).
    """

    model: ModelShape
    layout: Layout
    stage: int
    layers: int
    block: int
    root: int
    psi: int
    tensor_sizes: tuple[int, ...]
    operations: tuple[Operation, ...] = field(default=())

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.layout.pp - 1

    def of(self, per: str, phase: str | None = None) -> list[Operation]:
        """The operations run ``per`` "block", "micro-batch" or "step" (and in
        ``phase``)."""
        return [
            op
            for op in self.operations
            if op.per == per and (phase is None or op.phase == phase)
        ]

    def flops(self, per: str = "block") -> float:
        """FLOPs of the matrix products run ``per`` block or micro-batch, all
        phases."""
        return sum(op.flops * op.count for op in self.of(per))


def stage_layers(layers: int, pp: int, stage: int) -> int:
    """Blocks on pipeline stage ``stage`` of ``pp``: ``layers // pp``, and where they
    do not divide, one more on each of the middle stages first (the first holds the
    embedding, the last the head and loss), then on the last and the first.
    Llama 3 405B's 126 layers on 16 stages: 7 on the first and last, 8 on the 14
    others (Dubey et al. 2024, section 3.3.2).

    Example:
        >>> [stage_layers(126, 16, s) for s in (0, 1, 14, 15)]
        [7, 8, 8, 7]
    """
    base, extra = divmod(layers, pp)
    if pp == 1:
        return layers
    middle = list(range(1, pp - 1))
    order = [*middle, pp - 1, 0]
    return base + int(stage in order[:extra])


def block_parameters(model: ModelShape, tp: int) -> int:
    """One block's parameters on one tensor-parallel rank (the norms are whole)."""
    norms = 2 * model.hidden
    return (model.layer_parameters() - norms) // tp + norms


def root_parameters(model: ModelShape, tp: int, first: bool, last: bool) -> int:
    """Embedding (first stage), final norm and head (last stage) on one TP rank."""
    vh = model.vocab * model.hidden
    count = vh // tp if first else 0
    if last:
        count += model.hidden + (0 if (model.tied and first) else vh // tp)
    return count


def _tensor_sizes(model: ModelShape, layout: Layout, stage: int, layers: int):
    """Values of each parameter tensor a stage registers, in order, on one TP rank."""
    h, kv, f, t = model.hidden, model.kv_heads * model.head_dim, model.ffn, layout.tp
    first, last = stage == 0, stage == layout.pp - 1
    mlp = [h * f // t] * (2 if model.mlp == "swiglu" else 1) + [f * h // t]
    block = [h, h * h // t, h * kv // t, h * kv // t, h * h // t, h, *mlp]
    sizes = [model.vocab * h // t] if first else []
    sizes += block * layers
    if last:
        sizes += [h] + ([] if model.tied and first else [model.vocab * h // t])
    return tuple(sizes)


def _matmul(name, phase, m, n, k, batch=1, fraction=1.0, per="block"):
    """A product and, for the backward pass, its two gradients' products."""
    if phase == "backward":
        return [
            Operation(f"{name} dgrad", "matmul", phase, per, m=m, n=k, k=n,
                      batch=batch, fraction=fraction),
            Operation(f"{name} wgrad", "matmul", phase, per, m=k, n=n, k=m,
                      batch=batch, fraction=fraction),
        ]  # fmt: skip
    return [Operation(name, "matmul", phase, per, m=m, n=n, k=k, batch=batch,
                      fraction=fraction)]  # fmt: skip


def _memory(name, phase, nbytes, count=1, per="block"):
    return Operation(name, "memory", phase, per, count=count, nbytes=float(nbytes))


def _block_operations(model: ModelShape, layout: Layout) -> list[Operation]:
    """One block's operations for one micro-batch, forward, backward, recompute."""
    s, b, t = model.seq, layout.micro_batch, layout.tp
    e = 2 if layout.precision == "bf16" else 4
    h, f, a, d = model.hidden, model.ffn, model.heads, model.head_dim
    kv = model.kv_heads * d
    T = s * b
    Tn = T // t if layout.sequence_parallel else T  # tokens a norm or residual sees
    heads = b * a // t
    swiglu = model.mlp == "swiglu"
    drop = model.dropout > 0
    unfused = model.attention == "unfused"
    causal = 1.0 if unfused else 0.5  # flash skips the masked half; Megatron did not

    def products(phase: str) -> list[Operation]:
        ops = []
        if model.fused:
            ops += _matmul("qkv", phase, T, (h + 2 * kv) // t, h)
        else:
            ops += _matmul("q", phase, T, h // t, h)
            ops += _matmul("k", phase, T, kv // t, h)
            ops += _matmul("v", phase, T, kv // t, h)
        ops += attention(phase)
        ops += _matmul("o", phase, T, h, h // t)
        if swiglu and not model.fused:
            ops += _matmul("gate", phase, T, f // t, h)
            ops += _matmul("up", phase, T, f // t, h)
        else:
            ops += _matmul("up", phase, T, (2 if swiglu else 1) * f // t, h)
        ops += _matmul("down", phase, T, h, f // t)
        return ops

    def attention(phase: str) -> list[Operation]:
        ops = _matmul("attention QK", phase, s, s, d, heads, causal)
        ops += _matmul("attention PV", phase, s, d, s, heads, causal)
        if unfused:
            scores = heads * s * s
            # fused scale-mask-softmax: read and write the scores (backward: read
            # the output and its gradient, write one)
            units = 3 if phase == "backward" else 2
            ops.append(_memory("softmax", phase, units * e * scores))
            if drop:
                # dropout: read and write the scores, and a 1-byte mask
                ops.append(_memory("attention dropout", phase, (2 * e + 1) * scores))
        return ops

    def elementwise(phase: str) -> list[Operation]:
        units = 3 if phase == "backward" else 2  # read x (and the gradient), write
        mask = 1 if drop else 0
        act = (3 if swiglu else units) * e * T * f // t
        if phase == "backward" and swiglu:
            act = 5 * e * T * f // t  # read gate, up, gradient; write two gradients
        return [
            _memory("norm", phase, units * e * Tn * h, count=2),
            _memory("residual add", phase, (3 * e + mask) * Tn * h, count=2),
            _memory("activation", phase, act),
        ]

    def collectives(phase: str) -> list[Operation]:
        if t == 1:
            return []
        size = float(e * T * h)
        sp = layout.sequence_parallel
        hides = "compute" if layout.tp_overlap else ""
        if phase in ("forward", "recompute"):
            if sp:
                return [
                    Operation("tp all-gather", "collective", phase, "block", 2,
                              nbytes=size, collective="all_gather", group="tp",
                              hides=hides),
                    Operation("tp reduce-scatter", "collective", phase, "block", 2,
                              nbytes=size, collective="reduce_scatter", group="tp",
                              hides=hides),
                ]  # fmt: skip
            return [Operation("tp all-reduce", "collective", phase, "block", 2,
                              nbytes=size, collective="all_reduce", group="tp",
                              hides=hides)]  # fmt: skip
        # backward: one reduction per column-parallel layer's input gradient
        calls = 2 if model.fused else 5 if swiglu else 4
        if sp:
            return [
                Operation("tp all-gather", "collective", phase, "block", 2,
                          nbytes=size, collective="all_gather", group="tp",
                          hides=hides),
                Operation("tp reduce-scatter", "collective", phase, "block", calls,
                          nbytes=size, collective="reduce_scatter", group="tp",
                          hides=hides),
            ]  # fmt: skip
        return [Operation("tp all-reduce", "collective", phase, "block", calls,
                          nbytes=size, collective="all_reduce", group="tp",
                          hides=hides)]  # fmt: skip

    ops = products("forward") + elementwise("forward") + collectives("forward")
    ops += products("backward") + elementwise("backward") + collectives("backward")
    if layout.checkpointing == "full":
        ops += products("recompute") + elementwise("recompute")
        ops += collectives("recompute")
    elif layout.checkpointing == "selective":
        ops += attention("recompute")
    return ops


def _edge_operations(model: ModelShape, layout: Layout, first: bool, last: bool):
    """Per micro-batch: embedding, final norm, head, loss, pipeline sends."""
    s, b, t = model.seq, layout.micro_batch, layout.tp
    e = 2 if layout.precision == "bf16" else 4
    h, V = model.hidden, model.vocab
    T = s * b
    Tn = T // t if layout.sequence_parallel else T
    per = "micro-batch"
    ops: list[Operation] = []
    reduce = "reduce_scatter" if layout.sequence_parallel else "all_reduce"
    if first:
        ops.append(_memory("embedding", "forward", 2 * e * Tn * h, per=per))
        ops.append(_memory("embedding", "backward", 2 * e * Tn * h, per=per))
        if t > 1:
            ops.append(Operation("tp embedding", "collective", "forward", per,
                                 nbytes=float(e * T * h), collective=reduce,
                                 group="tp"))  # fmt: skip
    if last:
        ops.append(_memory("final norm", "forward", 2 * e * Tn * h, per=per))
        ops.append(_memory("final norm", "backward", 3 * e * Tn * h, per=per))
        ops += _matmul("head", "forward", T, V // t, h, per=per)
        ops += _matmul("head", "backward", T, V // t, h, per=per)
        # cross-entropy in fp32: log-softmax forward, its gradient backward
        ops.append(_memory("loss", "forward", 2 * 4 * T * V // t, per=per))
        ops.append(_memory("loss", "backward", 2 * 4 * T * V // t, per=per))
        if t > 1:
            ops.append(Operation("tp head", "collective", "backward", per,
                                 nbytes=float(e * T * h), collective=reduce,
                                 group="tp"))  # fmt: skip
    if layout.pp > 1:
        size = e * T * h // (t if layout.sequence_parallel else 1)
        v = layout.virtual_stages
        sends = 2 * v - int(first) - int(last)
        send = Operation("pp send", "collective", "forward", per, count=sends,
                         nbytes=float(size), collective="send", group="pp")  # fmt: skip
        ops.append(send)
    return ops


def stage_record(model: ModelShape, layout: Layout, stage: int) -> StageRecord:
    """The record of one GPU of pipeline stage ``stage`` (see the module docstring).

    Example:
        >>> from workshop.planner.layout import model_shape
        >>> rec = stage_record(model_shape("tiny"), Layout(dp=2), 0)
        >>> rec.psi == model_shape("tiny").parameters()
        True
    """
    first, last = stage == 0, stage == layout.pp - 1
    if model.kind == "module":
        from ..training.models import module_tensor_sizes

        sizes = tuple(module_tensor_sizes(model.builder))
        return StageRecord(model, layout, stage, 0, 0, sum(sizes), sum(sizes), sizes)
    layers = stage_layers(model.layers, layout.pp, stage)
    block = block_parameters(model, layout.tp)
    root = root_parameters(model, layout.tp, first, last)
    ops = [
        *_block_operations(model, layout),
        *_edge_operations(model, layout, first, last),
    ]
    return StageRecord(
        model,
        layout,
        stage,
        layers,
        block,
        root,
        layers * block + root,
        _tensor_sizes(model, layout, stage, layers),
        tuple(ops),
    )
