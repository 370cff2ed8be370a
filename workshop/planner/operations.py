"""The formula sheet: every operation one GPU of a pipeline stage runs in a step.

:func:`stage_record` computes once per stage what the memory and time terms both
read: the parameters this GPU holds, and each operation at its own shape (products
with M, N, K, timed by :mod:`workshop.planner.step_time`; memory-bound operations
with their bytes; collectives with the whole tensor's bytes and mesh dimension).

Notation: T = s b tokens of one micro-batch, h hidden, f MLP width, a heads (a_kv
key-value heads, d = h / a), V vocabulary, t = tp, e bytes of an activation value;
T' = T / t under sequence parallelism (norms, dropouts and residual adds), else T.

Per block and micro-batch, forward (Shoeybi et al. 2019, section 3; Korthikanti et
al. 2022, section 4.2.2): two norms; q, k, v (M = T, K = h, N = h / t and a_kv d / t;
fused: one product) and o (K = h / t); attention as products of b a / t heads (flash:
half of them under the causal mask; unfused, as Megatron-LM before flash attention:
whole, with a scale-mask-softmax and dropout over e b a s^2 / t); the MLP's up (and
gate) and down products and its activation; two residual adds; with tp an all-reduce
after each row-parallel product (sp: an all-gather before each column-parallel pair
and a reduce-scatter after). Backward: each product twice (the input's and the
weight's gradient, same FLOPs); each memory-bound operation reads its saved input
and the incoming gradient; the collectives mirror the forward, one per
column-parallel input's gradient. Full checkpointing runs the forward again in the
backward pass; selective recomputes the attention core only (Korthikanti et al.
2022, section 5).

Per micro-batch on the edges: the embedding (with tp an all-reduce), the final norm,
the head (N = V / t) and the fp32 cross-entropy; a pipeline stage sends e T h (sp:
/ t) at each boundary. Per step: the optimizer's bytes (:data:`OPTIMIZER_BYTES`)
and the data-parallel reductions (:mod:`workshop.planner.step_time`).
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

    ``kind``: "matmul" (``m``, ``n``, ``k``, ``batch``), "memory" (``nbytes`` read
    and written) or "collective" (``nbytes`` of the whole tensor, on mesh dimension
    ``group``). ``count``: runs ``per`` "block", "micro-batch" or "step".
    ``hides``: the compute a collective may overlap (empty: none).
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
    """What one GPU of pipeline stage ``stage`` holds and runs.

    ``block``: one block's parameters on one tp rank; ``root``: the edges' (embedding,
    final norm, head); ``psi``: all it holds; ``tensor_sizes``: in registration order;
    ``operations``: empty for a module.
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
        """The operations run ``per`` "block", "micro-batch" or "step" (in phase)."""
        return [
            op
            for op in self.operations
            if op.per == per and (phase is None or op.phase == phase)
        ]

    def flops(self, per: str = "block") -> float:
        """FLOPs of the products run ``per`` block or micro-batch, all phases."""
        return sum(op.flops * op.count for op in self.of(per))


def stage_layers(layers: int, pp: int, stage: int) -> int:
    """Blocks on pipeline stage ``stage`` of ``pp``: ``layers // pp``, the remainder
    on the middle stages first (the edges hold the embedding and head), as Llama 3
    405B's 126 layers on 16 stages (Dubey et al. 2024, section 3.3.2).

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

        def tp(kind: str, count: int) -> Operation:
            hides = "compute" if layout.tp_overlap else ""
            return Operation(f"tp {kind.replace('_', '-')}", "collective", phase,
                             "block", count, nbytes=float(e * T * h), collective=kind,
                             group="tp", hides=hides)  # fmt: skip

        calls = 2  # forward: after each row-parallel product
        if phase == "backward":  # one per column-parallel layer's input gradient
            calls = 2 if model.fused else 5 if swiglu else 4
        if layout.sequence_parallel:
            return [tp("all_gather", 2), tp("reduce_scatter", calls)]
        return [tp("all_reduce", calls)]

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
