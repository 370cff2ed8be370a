"""Notebook 04's layout planner: which parallel layout fits a model on an allocation,
and how long its step will take.

Two ways in, the same figures:

- :func:`plan` prints the estimator's table for one layout and draws it (memory per
  GPU against the GPU's capacity; the step split into compute, communication and the
  pipeline bubble). It needs no widgets, so it runs under nbval, in CI and in a script.
- :func:`~workshop.planner.widget.planner` shows the same as ipywidgets: a
  model, a GPU, a network, nodes, GPUs per node and the degrees, redrawn on every
  change, and a button that runs one rank of the layout on PyTorch's fake backend and
  prints the estimate beside what the framework really holds and sends.

The figures come from :mod:`workshop.planner.estimator` (formulas),
:mod:`workshop.planner.fake_world` (the fake backend) and
:mod:`workshop.draw.plan_plots` (the pictures); this module only puts them before a
learner. They are imported when first needed, so ``import workshop`` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .estimator import Estimate
from .layout import Layout, check_counts, model_shape

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .layout import ModelShape

__all__ = ["layout_for_gpus", "plan", "plan_table", "throughput"]

WIDTH = 88  # printed lines fit a projector
DEFAULT_GPU = "H100 80GB"
DEFAULT_NETWORK = "NVLink 4 + NDR 400G"
MEMORY_TERMS = ("parameters", "gradients", "optimizer", "activations", "buffers")
TIME_TERMS = ("compute", "dp comm", "tp comm", "pp comm", "bubble")


def layout_for_gpus(
    nodes: int, gpus_per_node: int, tp: int = 1, pp: int = 1, **rest: Any
) -> Layout:
    """The layout that uses all ``nodes x gpus_per_node`` GPUs: ``dp`` is what is left
    after tensor and pipeline parallelism, ``nodes x gpus_per_node / (tp x pp)``.

    Args:
        nodes: nodes of the allocation.
        gpus_per_node: GPUs on each node.
        tp: tensor-parallel degree.
        pp: pipeline stages.
        **rest: the other fields of :class:`~workshop.planner.layout.Layout`
            (``zero``, ``micro_batch``, ``micro_batches``, ``checkpointing``,
            ``precision``).

    Returns:
        The :class:`~workshop.planner.layout.Layout`.

    Raises:
        ValueError: a count below 1, or ``tp x pp`` not dividing the GPUs.

    Example:
        >>> layout_for_gpus(8, 8, tp=8).describe()
        'dp=8 tp=8 pp=1 DDP bf16 mb=1x1'
    """
    check_counts("", nodes=nodes, gpus_per_node=gpus_per_node, tp=tp, pp=pp)
    gpus = nodes * gpus_per_node
    if gpus % (tp * pp):
        raise ValueError(
            f"{nodes} nodes x {gpus_per_node} GPUs = {gpus} GPUs cannot be split "
            f"into groups of tp x pp = {tp} x {pp} = {tp * pp}: dp = {gpus}/{tp * pp} "
            f"is not whole. Choose tp and pp whose product divides {gpus}"
        )
    return Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, **rest)


def _estimate(
    model: str | ModelShape,
    layout: Layout,
    gpu: str,
    network: str,
    gpus_per_node: int,
    mfu: float | None,
    stage: int | None = None,
) -> Estimate:
    from .estimator import estimate

    return estimate(
        model_shape(model),
        layout,
        gpu=gpu,
        network=network,
        gpus_per_node=gpus_per_node,
        mfu=mfu,
        stage=stage,
    )


def _gb(value: float) -> str:
    return f"{value / 1e9:9.2f}"


def _ms(value: float) -> str:
    return f"{value * 1e3:10.1f}"


def throughput(est: Estimate) -> tuple[float, str]:
    """Samples (a module) or tokens (a transformer) per second over the whole job:
    the global batch divided by the step time, and the unit's name."""
    samples = est.layout.global_batch / est.step if est.step > 0 else 0.0
    if est.model.kind == "transformer":
        return samples * est.model.seq, "tokens"
    return samples, "samples"


def plan_table(est: Estimate) -> str:
    """The estimate as a table of at most 88 columns: memory per GPU by term beside
    the step time by term, whether it fits, and the throughput it gives.

    Args:
        est: what :func:`workshop.planner.estimator.estimate` returned.

    Returns:
        The table, lines joined by newlines (no trailing newline).
    """
    model, layout, gpu = est.model, est.layout, est.gpu
    world = layout.world_size
    nodes = -(-world // est.gpus_per_node)
    where = f"{nodes} nodes of {est.gpus_per_node}" if nodes > 1 else "one node"
    lines = [
        f"{model.name}, {model.parameters() / 1e9:.2f} B parameters, on {world} x "
        f"{gpu.name} ({where}), {est.network.name}",
        f"layout: {layout.describe()}",
        f"{'memory per GPU':<22}{'GB':>9}      {'step time':<22}{'ms':>10}",
    ]
    for mem_term, time_term in zip(MEMORY_TERMS, TIME_TERMS, strict=True):
        lines.append(
            f"  {mem_term:<20}{_gb(est.memory.get(mem_term, 0.0))}"
            f"        {time_term:<20}{_ms(est.time.get(time_term, 0.0))}"
        )
    total_time = sum(est.time.get(t, 0.0) for t in TIME_TERMS)
    lines.append(
        f"  {'total':<20}{_gb(est.memory_total)}        {'sum of the terms':<20}"
        f"{_ms(total_time)}"
    )
    share = est.memory_total / gpu.memory_bytes
    verdict = "fits" if est.fits else "DOES NOT FIT"
    rate, unit = throughput(est)
    fit = f"  {verdict}: {share:.0%} of {gpu.memory_gb:g} GB"
    lines += [
        f"{fit:<39}{'step (overlapped)':<20}{_ms(est.step)}",
        f"throughput: {rate:,.0f} {unit}/s for the job, {rate / world:,.0f} per GPU",
    ]
    return "\n".join(line.rstrip()[:WIDTH] for line in lines)


def _show_figure(fig: Figure) -> None:
    """Show ``fig`` in a notebook; outside IPython there is nowhere to show it."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython comes with Jupyter
        return
    if get_ipython() is not None:
        display(fig)


def plan(
    model: str | ModelShape,
    layout: Layout | Sequence[Layout],
    gpu: str = DEFAULT_GPU,
    network: str = DEFAULT_NETWORK,
    gpus_per_node: int = 8,
    mfu: float | None = None,
    draw: bool = True,
) -> Estimate | list[Estimate]:
    """Estimate a layout, print its table and draw it: the planner without widgets.

    Given several layouts, prints one line for each (the estimator's
    :func:`~workshop.planner.search.table`) and draws them side by side.

    Args:
        model: a name of :data:`~workshop.planner.layout.MODELS`
            ("transformer-8b") or a :class:`~workshop.planner.layout.ModelShape`.
        layout: a :class:`~workshop.planner.layout.Layout` (degrees, ZeRO stage,
            micro-batches, checkpointing, precision), or a list of them.
        gpu: a name of :data:`~workshop.planner.layout.GPUS`.
        network: a name of :data:`~workshop.planner.layout.NETWORKS`.
        gpus_per_node: GPUs on each node (a tensor-parallel group wider than this
            crosses nodes).
        mfu: the share of the GPU's peak the compute reaches (the estimator's
            default when None).
        draw: also draw the plan (:func:`workshop.draw.plan_plots.plot_plan`, or
            :func:`~workshop.draw.plan_plots.plot_layouts` for several), shown in a
            notebook.

    Returns:
        The :class:`~workshop.planner.estimator.Estimate`, or a list of them.

    Raises:
        ValueError: an unknown model, GPU or network, or a layout the model cannot
            take (the message says which and why).

    Example:
        >>> est = plan("transformer-8b", Layout(dp=8, tp=8, zero=3), draw=False)
        ... # doctest: +SKIP
    """
    if isinstance(layout, Layout):
        est = _estimate(model, layout, gpu, network, gpus_per_node, mfu)
        print(plan_table(est))
        if draw:
            from ..draw.plan_plots import plot_plan

            _show_figure(plot_plan(est))
        return est
    if not layout or not all(isinstance(one, Layout) for one in layout):
        raise ValueError(
            f"layout={layout!r}: give a Layout, or a list of Layouts to compare"
        )
    from .search import table

    found = [_estimate(model, one, gpu, network, gpus_per_node, mfu) for one in layout]
    first = found[0]
    print(
        f"{first.model.name} on {first.gpu.name}, {gpus_per_node} per node, "
        f"{first.network.name}"
    )
    print(table(found))
    if draw:
        from ..draw.plan_plots import plot_layouts

        _show_figure(plot_layouts(found))
    return found
