"""Notebook 04's planner exercises (section 8), registered in
:data:`workshop.lessons.exercises.EXERCISES` under "04.<name>" and checked with
``workshop.check("04.fit8b", answer)`` like the others.

Each entry is (what the exercise wants, its judge, a hint): the fields of
:class:`workshop.lessons.judges.Exercise`. The judges ask the estimator
(:mod:`workshop.planner.estimator`) when they run, not at import, so that
``exercises`` can import this module cheaply and the right answers are always the
estimator's own.
"""

from __future__ import annotations

import math
from typing import Any

from ..planner.layout import Layout, model_shape
from .judges import Exercise

__all__ = [
    "EXERCISES",
    "FIT",
    "TP_NODES",
    "best_fit",
    "bubble_micro_batches",
    "tp_nodes_ratio",
]

#: 04.fit8b: the model, the allocation and the global batch (sequences) it fixes.
FIT = {
    "model": "transformer-8b",
    "gpus": 64,
    "gpu": "H100 80GB",
    "network": "NVLink 4 + NDR 400G",
    "gpus_per_node": 8,
    "global_batch": 256,
}
#: How much slower than the best layout a right answer to 04.fit8b may be.
NEAR_FASTEST = 0.05

#: 04.tp_nodes: one layout of 64 GPUs, on nodes of 8 GPUs and on nodes of 4.
TP_NODES = {
    "model": "transformer-8b",
    "layout": Layout(
        dp=8, tp=8, pp=1, zero=1, micro_batch=1, micro_batches=8, checkpointing="full"
    ),
    "gpu": "H100 80GB",
    "network": "NVLink 4 + NDR 400G",
    "nodes_of": (8, 4),
}

#: 04.bubble_mb: pipeline stages, and the idle share to get under.
BUBBLE = {"stages": 4, "under": 0.10}


def best_fit() -> Any:
    """The estimator's best layout for 04.fit8b: an
    :class:`~workshop.planner.estimator.Estimate` (the fastest that fits)."""
    from ..planner.estimator import best_layouts

    ranked = best_layouts(
        model_shape(FIT["model"]),
        FIT["gpus"],
        FIT["gpu"],
        FIT["network"],
        FIT["gpus_per_node"],
        FIT["global_batch"],
    )
    fitting = [e for e in ranked if e.fits]
    if not fitting:  # pragma: no cover - the estimator always finds one for 8B on 64
        raise RuntimeError("the estimator finds no layout of 04.fit8b that fits")
    return min(fitting, key=lambda e: e.step)


def _fit_layout(answer: Any) -> bool | str:
    from ..planner.estimator import estimate

    if not isinstance(answer, Layout):
        return (
            f"the answer should be a Layout, e.g. Layout(dp=8, tp=8, zero=3, "
            f"micro_batch=1, micro_batches=32); it is {type(answer).__name__}"
        )
    if answer.world_size != FIT["gpus"]:
        return (
            f"{answer.describe()} uses dp x tp x pp = {answer.world_size} GPUs; the "
            f"allocation has {FIT['gpus']}"
        )
    if answer.global_batch != FIT["global_batch"]:
        return (
            f"{answer.describe()} trains {answer.global_batch} sequences a step "
            f"(dp x micro_batch x micro_batches); the exercise fixes "
            f"{FIT['global_batch']}"
        )
    model = model_shape(FIT["model"])
    try:
        answer.check_fits(model)
    except ValueError as exc:  # why the model cannot be split so is the verdict
        return str(exc)
    mine = estimate(
        model,
        answer,
        gpu=FIT["gpu"],
        network=FIT["network"],
        gpus_per_node=FIT["gpus_per_node"],
    )
    if not mine.fits:
        return (
            f"{answer.describe()} needs {mine.memory_total / 1e9:.1f} GB per GPU; "
            f"an {FIT['gpu']} holds {mine.gpu.memory_gb:g} GB"
        )
    best = best_fit()
    if mine.step > best.step * (1 + NEAR_FASTEST):
        return (
            f"{answer.describe()} fits, but its step takes {mine.step:.2f} s where "
            f"the fastest layout that fits takes {best.step:.2f} s "
            f"({mine.step / best.step - 1:.0%} slower)"
        )
    return True


def tp_nodes_ratio() -> float:
    """04.tp_nodes: how many times longer the step of :data:`TP_NODES`'s layout is
    when its tensor-parallel groups of 8 span two nodes of 4 GPUs than inside one
    node of 8."""
    from ..planner.estimator import estimate

    model = model_shape(TP_NODES["model"])
    inside, across = (
        estimate(
            model,
            TP_NODES["layout"],
            gpu=TP_NODES["gpu"],
            network=TP_NODES["network"],
            gpus_per_node=per_node,
        )
        for per_node in TP_NODES["nodes_of"]
    )
    return across.step / inside.step


def _tp_nodes(answer: Any) -> bool | str:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return f"the answer should be a number (a ratio); it is {answer!r}"
    if not math.isfinite(answer) or answer <= 0:
        return f"{answer!r} cannot be a ratio of two step times"
    if answer < 1:
        return (
            f"{answer:.3g} says the step gets shorter across nodes: divide the step "
            "across nodes by the step inside one"
        )
    return math.isclose(answer, tp_nodes_ratio(), rel_tol=0.02)


def bubble_micro_batches(
    stages: int = BUBBLE["stages"], under: float = BUBBLE["under"]
) -> int:
    """The fewest micro-batches ``m`` for which a pipeline of ``stages`` idles less
    than ``under`` of the time: ``(p - 1) / (m + p - 1) < under``."""
    m = 1
    while (stages - 1) / (m + stages - 1) >= under:
        m += 1
    return m


def _bubble_mb(answer: Any) -> bool | str:
    if isinstance(answer, float) and answer.is_integer():
        return f"micro-batches are counted in whole numbers: write {int(answer)}"
    if isinstance(answer, bool) or not isinstance(answer, int):
        return f"the answer should be a whole number of micro-batches; it is {answer!r}"
    p, under = BUBBLE["stages"], BUBBLE["under"]
    if answer < 1:
        return f"{answer} micro-batches cannot fill a pipeline"
    idle = (p - 1) / (answer + p - 1)
    if idle >= under:
        return (
            f"with {answer} micro-batches a pipeline of {p} stages idles "
            f"{idle:.1%} of the time, not under {under:.0%}"
        )
    if answer != bubble_micro_batches():
        return f"{answer} micro-batches work, but fewer would do (idle {idle:.1%})"
    return True


_SPECS: dict[str, tuple[str, Any, str]] = {
    "04.fit8b": (
        f"a Layout of {FIT['model']} on {FIT['gpus']} GPUs ({FIT['gpu']}, "
        f"{FIT['gpus_per_node']} per node) with a global batch of "
        f"{FIT['global_batch']} sequences that fits and whose step is within "
        f"{NEAR_FASTEST:.0%} of the fastest that fits",
        _fit_layout,
        "try best_layouts or plan() with ZeRO-3 and with tensor parallelism inside a "
        "node; checkpointing buys memory for about a third more compute",
    ),
    "04.tp_nodes": (
        f"how many times longer a step of {TP_NODES['model']} with "
        f"{TP_NODES['layout'].describe()} takes on nodes of 4 GPUs (tp=8 across two "
        "nodes) than on nodes of 8 (tp=8 inside one)",
        _tp_nodes,
        "plan the same layout twice, gpus_per_node=8 and gpus_per_node=4, and "
        "divide the second step by the first",
    ),
    "04.bubble_mb": (
        f"the fewest micro-batches that bring the bubble of a pipeline of "
        f"{BUBBLE['stages']} stages under {BUBBLE['under']:.0%} of the time",
        _bubble_mb,
        "the idle share is (p - 1) / (m + p - 1): solve it for m, and keep the "
        "inequality strict",
    ),
}
EXERCISES = {name: Exercise(*spec) for name, spec in _SPECS.items()}
