"""The transformer a :class:`~workshop.planner.layout.ModelShape` describes, as a
real ``nn.Module``: the one the fake-backend check shards and the real run trains.

Its shapes come from :class:`~workshop.planner.layout.ModelShape`; the estimator's
activation formulas (:mod:`workshop.planner.memory`) count this very block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..checks import whole

if TYPE_CHECKING:
    from .layout import ModelShape

__all__ = ["Block", "Transformer", "build_transformer"]


class _Attention(nn.Module):
    """Causal self-attention with grouped key/value heads and no bias."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        kv = shape.kv_heads * shape.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
        )
        self.q = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.k = nn.Linear(shape.hidden, kv, bias=False)
        self.v = nn.Linear(shape.hidden, kv, bias=False)
        self.o = nn.Linear(shape.hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 rather than self.heads: under tensor parallelism q holds heads / tp heads.
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class _MLP(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.swiglu = shape.mlp == "swiglu"
        self.up = nn.Linear(shape.hidden, shape.ffn, bias=False)
        if self.swiglu:
            self.gate = nn.Linear(shape.hidden, shape.ffn, bias=False)
        self.down = nn.Linear(shape.ffn, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))
        return self.down(nn.functional.gelu(self.up(x)))


class _RMSNorm(nn.Module):
    # Written out because nn.RMSNorm is newer than torch 2.4.
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * scale * self.weight


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(norm(x))``, then ``+ mlp(norm(x))``."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.attn_norm = _RMSNorm(shape.hidden)
        self.attn = _Attention(shape)
        self.mlp_norm = _RMSNorm(shape.hidden)
        self.mlp = _MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """The decoder :class:`ModelShape` counts, or the part one pipeline stage holds.

    ``first`` and ``last`` say whether this stage holds the embedding and the output
    head (a whole model has both); ``layers`` is how many blocks it holds.
    """

    def __init__(
        self,
        shape: ModelShape,
        layers: int | None = None,
        first: bool = True,
        last: bool = True,
    ):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden) if first else None
        count = shape.layers if layers is None else layers
        self.blocks = nn.ModuleList(Block(shape) for _ in range(count))
        self.norm = _RMSNorm(shape.hidden) if last else None
        self.head = None
        if last and not (shape.tied and first):
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) on the first stage, hidden states after it."""
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
            # Through the module when there is one, so that its hooks run (tensor
            # parallelism splits the head by hooks on it); tied: the embedding's matrix.
            if self.head is not None:
                x = self.head(x)
            else:
                x = nn.functional.linear(x, self.embed.weight)
        return x


def build_transformer(
    shape: ModelShape,
    stage: int = 0,
    stages: int = 1,
    device: str | torch.device = "meta",
) -> Transformer:
    """The transformer ``shape`` describes, or pipeline stage ``stage`` of ``stages``.

    Built on the meta device by default, so a 70B model costs no memory until it is
    sharded. Stages hold equal layers, as :mod:`workshop.parallel.pipeline_ranks`
    cuts them.

    Raises:
        ValueError: a module shape, or a stage outside ``0 .. stages - 1``, or
            ``stages`` not dividing the layers.
    """
    if shape.kind != "transformer":
        raise ValueError(
            f"build_transformer needs a transformer; {shape.name} is a module"
        )
    whole("stage", stage, 0, whole("stages", stages) - 1, f"a stage of {stages}")
    if shape.layers % stages:
        raise ValueError(
            f"stages={stages} does not divide {shape.name}'s layers={shape.layers}"
        )
    with torch.device(device):
        return Transformer(
            shape, shape.layers // stages, stage == 0, stage == stages - 1
        )
