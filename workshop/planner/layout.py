"""What a layout planner is asked about: a :class:`ModelShape`, a parallel
:class:`Layout`, a :class:`GPU` and its :class:`Network` (the last two from
:mod:`workshop.planner.hardware`, importable from here too); the records the
estimator, the fake-backend check and the lesson's planner share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..checks import one_of, whole
from .hardware import (  # noqa: F401 (the hardware names, importable from here too)
    GPU,
    GPUS,
    NETWORKS,
    Network,
    gpu_record,
    network_record,
    pick,
)

__all__ = [
    "MODELS",
    "Layout",
    "ModelShape",
    "check_counts",
    "model_shape",
]


def check_counts(owner: str, unit: str = "", **values: Any) -> None:
    """Refuse the first of ``values`` that is not a whole number, 1 or more:
    "owner: name=0 must be a whole number[ unit], 1 or more"."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            prefix = f"{owner}: " if owner else ""
            raise ValueError(
                f"{prefix}{name}={value!r} must be a whole number{unit}, 1 or more"
            )


@dataclass(frozen=True)
class ModelShape:
    """A model as the planner sees it.

    ``kind="transformer"``: a pre-norm decoder-only transformer (GPT, Llama) without
    biases, its head shared with the embedding when ``tied``. ``kind="module"``:
    ``builder`` makes the ``nn.Module``, ``sample`` is one sample's input shape.

    Raises:
        ValueError: a size below 1, ``hidden`` not divisible by ``heads``, or
            ``heads`` not divisible by ``kv_heads``.
    """

    name: str
    kind: str = "transformer"
    layers: int = 1
    hidden: int = 64
    heads: int = 1
    vocab: int = 256
    seq: int = 128
    ffn: int = 0  # 0: 4 x hidden
    kv_heads: int = 0  # 0: as many as heads
    mlp: str = "gelu"
    tied: bool = False
    source: str = ""
    builder: Callable[[], nn.Module] | None = field(default=None, compare=False)
    sample: tuple[int, ...] = ()
    #: q, k and v in one matrix and the MLP's input matrices in one, as Megatron-LM
    #: builds them: the same parameters, fewer tensor-parallel calls.
    fused: bool = False
    #: "flash": one fused attention kernel that never writes the s x s scores (this
    #: package's Block, through scaled_dot_product_attention); "unfused": the
    #: scores written and read by a softmax kernel, as Megatron-LM did before flash
    #: attention (Korthikanti et al. 2022, section 4.1).
    attention: str = "flash"
    #: Dropout probability after attention and MLP and on the attention scores
    #: (GPT-3 as Megatron-LM trains it: 0.1); 0 for none, as this package's Block.
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.kind == "module":
            if self.builder is None or not self.sample:
                raise ValueError(
                    f"{self.name!r}: kind='module' needs builder= (it makes "
                    "the nn.Module) and sample= (one sample's input shape)"
                )
            return
        if self.kind != "transformer":
            raise ValueError(
                f"ModelShape {self.name!r}: kind={self.kind!r}; use 'transformer' "
                "or 'module'"
            )
        check_counts(
            f"ModelShape {self.name!r}",
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            vocab=self.vocab,
            seq=self.seq,
        )
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        check_counts(f"ModelShape {self.name!r}", ffn=self.ffn, kv_heads=self.kv_heads)
        if self.hidden % self.heads:
            raise ValueError(
                f"ModelShape {self.name!r}: hidden={self.hidden} is not divisible by "
                f"heads={self.heads}; each head gets hidden / heads channels"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"ModelShape {self.name!r}: heads={self.heads} is not divisible by "
                f"kv_heads={self.kv_heads}; each key/value head serves a whole group"
            )
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(
                f"ModelShape {self.name!r}: mlp={self.mlp!r}; use 'gelu' or 'swiglu'"
            )
        if self.attention not in ("flash", "unfused"):
            raise ValueError(
                f"ModelShape {self.name!r}: attention={self.attention!r}; use 'flash' "
                "(a fused kernel, no s x s scores kept) or 'unfused'"
            )
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(
                f"ModelShape {self.name!r}: dropout={self.dropout!r} must be a "
                "probability from 0 up to (not including) 1; 0 for none"
            )

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.hidden // self.heads

    def layer_parameters(self) -> int:
        """Parameters of one block: ``2 h^2 + 2 h kv + m h ffn + 2 h``, m = 2 (GELU)
        or 3 (SwiGLU)."""
        self._need_transformer("layer_parameters")
        h = self.hidden
        kv = self.kv_heads * self.head_dim
        matrices = 3 if self.mlp == "swiglu" else 2
        return 2 * h * h + 2 * h * kv + matrices * h * self.ffn + 2 * h

    def embedding_parameters(self) -> int:
        """Parameters outside the blocks: embedding, final norm and output head."""
        self._need_transformer("embedding_parameters")
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.hidden + head

    def parameters(self) -> int:
        """All parameters. For a module, counted on the meta device."""
        if self.kind == "module":
            assert self.builder is not None
            with torch.device("meta"):
                module = self.builder()
            return sum(p.numel() for p in module.parameters())
        return self.layers * self.layer_parameters() + self.embedding_parameters()

    def flops_per_token(self) -> float:
        """Training FLOPs per token: ``6 N + 12 L h s`` (Kaplan et al., 2020, section
        2.1; the attention scores add ``12 L h s``), N without the embedding lookup."""
        self._need_transformer("flops_per_token")
        n = self.parameters() - (0 if self.tied else self.vocab * self.hidden)
        return 6.0 * n + 12.0 * self.layers * self.hidden * self.seq

    def with_(self, **changes: Any) -> ModelShape:
        """A copy with some fields changed (``shape.with_(layers=2)``)."""
        return replace(self, **changes)

    def _need_transformer(self, what: str) -> None:
        if self.kind != "transformer":
            raise ValueError(
                f"{what}() is a transformer formula; {self.name!r} is a module: "
                "count its parameters with parameters()"
            )


def _resnet50() -> nn.Module:
    from ..training.models import resnet

    return resnet("resnet50")


def _small_cnn() -> nn.Module:
    from ..training.models import SmallCNN

    return SmallCNN()


_LLAMA = "Meta, Llama 3 model card and config (Llama-3-8B / 70B), 2024"

#: The models the planner offers, by name.
MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            "tiny",
            layers=4,
            hidden=64,
            heads=4,
            vocab=256,
            seq=32,
            source="the workshop's test model",
        ),
        ModelShape(
            "gpt2-small",
            layers=12,
            hidden=768,
            heads=12,
            vocab=50257,
            seq=1024,
            tied=True,
            source="Radford et al., GPT-2, 2019: the smallest model's "
            "sizes (without its position embeddings and biases)",
        ),
        ModelShape(
            "transformer-1b",
            layers=22,
            hidden=2048,
            heads=32,
            vocab=32000,
            seq=2048,
            mlp="swiglu",
            ffn=5632,
            kv_heads=4,
            source="Zhang et al., TinyLlama (1.1B), 2024: its sizes",
        ),
        ModelShape(
            "transformer-8b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            vocab=128256,
            seq=8192,
            ffn=14336,
            mlp="swiglu",
            source=_LLAMA,
        ),
        ModelShape(
            "transformer-70b",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            vocab=128256,
            seq=8192,
            ffn=28672,
            mlp="swiglu",
            source=_LLAMA,
        ),
        ModelShape(
            "resnet50",
            kind="module",
            builder=_resnet50,
            sample=(3, 224, 224),
            source="He et al., 2016; torchvision's resnet50",
        ),
        ModelShape(
            "small-cnn",
            kind="module",
            builder=_small_cnn,
            sample=(1, 16, 16),
            source="the workshop's SmallCNN (notebooks 01-02)",
        ),
    )
}


def model_shape(name: str | ModelShape) -> ModelShape:
    """A model of :data:`MODELS` by name (a :class:`ModelShape` is returned as it is).

    Raises:
        ValueError: an unknown name, with the names there are.
    """
    return pick(MODELS, name, ModelShape, "model", "ModelShape(...)")


@dataclass(frozen=True)
class Layout:
    """How a job splits its model over ``dp x tp x pp`` GPUs.

    Args:
        dp: data-parallel degree (replicas, or shards under ZeRO/FSDP).
        tp: tensor-parallel degree (Megatron-style column/row split).
        pp: pipeline stages.
        zero: 0 (DDP), 1, 2 or 3 (ZeRO-3, which FSDP2 is).
        micro_batch: sequences per micro-batch on each data-parallel rank.
        micro_batches: per step (pipeline micro-batches, or gradient accumulation).
        checkpointing: "none", "selective" (attention recomputed) or "full".
        precision: "fp32", or "bf16" (2 + 2 + 12 bytes per parameter with Adam).
        sequence_parallel: split the norms' activations along the sequence over tp
            (Korthikanti et al. 2022).
        virtual_stages: chunks per pipeline rank, the interleaved 1F1B schedule
            (Narayanan et al. 2021, section 2.2.2); 1 is plain 1F1B.
        tp_overlap: tensor-parallel communication hidden under the products, as
            Megatron-Core's ``--tp-comm-overlap`` does.

    Raises:
        ValueError: a value out of range, or an option the other fields rule out.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    micro_batches: int = 1
    checkpointing: str = "none"
    precision: str = "bf16"
    sequence_parallel: bool = False
    virtual_stages: int = 1
    tp_overlap: bool = False

    def __post_init__(self) -> None:
        check_counts(
            "Layout",
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            micro_batch=self.micro_batch,
            micro_batches=self.micro_batches,
            virtual_stages=self.virtual_stages,
        )
        for name in ("sequence_parallel", "tp_overlap"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"Layout: {name}={value!r}; use True or False")
            if value and self.tp == 1:
                raise ValueError(
                    f"Layout: {name}=True needs tensor parallelism, and tp=1; "
                    "set tp to 2 or more, or leave it False"
                )
        if self.virtual_stages > 1 and (self.pp == 1 or self.micro_batches % self.pp):
            raise ValueError(
                f"Layout: virtual_stages={self.virtual_stages} needs a pipeline whose "
                f"micro-batches are a multiple of its stages (the interleaved "
                f"schedule's rule); got pp={self.pp}, micro_batches="
                f"{self.micro_batches}. Use pp of 2 or more and micro_batches a "
                "multiple of pp, or virtual_stages=1"
            )
        one_of("Layout: zero", self.zero, (0, 1, 2, 3), "0 is DDP, 3 ZeRO-3 (FSDP)")
        ways = ("none", "selective", "full")
        one_of("Layout: checkpointing", self.checkpointing, ways)
        one_of("Layout: precision", self.precision, ("fp32", "bf16"))

    @property
    def world_size(self) -> int:
        """GPUs the layout needs: ``dp x tp x pp``."""
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        """Samples per step over all replicas: ``dp x micro_batch x micro_batches``."""
        return self.dp * self.micro_batch * self.micro_batches

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits, ``tp`` fastest (it talks in every layer), then
        ``dp``, then ``pp`` (it talks least).

        Raises:
            ValueError: ``rank`` outside ``0 .. world_size - 1``.
        """
        ranks = f"{self.describe()} has {self.world_size} ranks"
        whole("rank", rank, 0, self.world_size - 1, ranks)
        return {
            "tp": rank % self.tp,
            "dp": rank // self.tp % self.dp,
            "pp": rank // (self.tp * self.dp),
        }

    def check_fits(self, model: ModelShape) -> None:
        """Raise ``ValueError`` if ``model`` cannot be split this way, saying why."""
        if model.kind == "module":
            if self.tp > 1 or self.pp > 1:
                raise ValueError(
                    f"{model.name} is a module, not a transformer: the planner splits "
                    f"it only by data (dp, zero); got tp={self.tp}, pp={self.pp}"
                )
            return
        for what, size in (
            ("heads", model.heads),
            ("kv_heads", model.kv_heads),
            ("ffn", model.ffn),
            ("vocab", model.vocab),
        ):
            if size % self.tp:
                raise ValueError(
                    f"tp={self.tp} does not divide {model.name}'s {what}={size}; "
                    "choose a tensor-parallel degree that divides it"
                )
        # Stages may hold different numbers of layers, as real frameworks allow
        # (operations.stage_layers spreads the rest); each needs one at least.
        if model.layers < self.pp * self.virtual_stages:
            raise ValueError(
                f"pp={self.pp} x virtual_stages={self.virtual_stages} is more than "
                f"{model.name}'s layers={model.layers}; each virtual stage needs a "
                "layer at least: choose fewer stages"
            )

    def describe(self) -> str:
        """A short label: ``dp=128 tp=8 pp=1 ZeRO-3 bf16 mb=1x4``."""
        stage = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}[self.zero]
        ckpt = "" if self.checkpointing == "none" else f" ckpt={self.checkpointing}"
        extra = " sp" if self.sequence_parallel else ""
        extra += f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        extra += " tp-overlap" if self.tp_overlap else ""
        return (
            f"dp={self.dp} tp={self.tp} pp={self.pp} {stage} {self.precision} "
            f"mb={self.micro_batch}x{self.micro_batches}{ckpt}{extra}"
        )
