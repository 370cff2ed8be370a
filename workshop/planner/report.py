"""Notebook 04's layout planner: which parallel layout fits a model on an allocation,
and how long its step will take.

:func:`plan` prints the estimator's table and draws it, without widgets (nbval, CI, a
script); :func:`explore` shows the same as ipywidgets, replanned on every change, with
a button that runs one rank on the fake backend. The widgets write plain output
records (``Output.outputs``), not ``with out:``, so they work without a frontend. The
fake backend and the pictures are imported when first needed, so ``import workshop``
stays light.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._house import WIDTH
from ..draw.plan_plots import MEMORY_TERMS, TIME_TERMS
from .estimator import Estimate, estimate, table
from .layout import GPUS, MODELS, NETWORKS, Layout, check_counts, model_shape

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .layout import ModelShape

__all__ = ["Planner", "explore", "layout_for_gpus", "plan", "plan_table", "throughput"]

DEFAULT_GPU = "H100 80GB"
DEFAULT_NETWORK = "NVLink 4 + NDR 400G"


def layout_for_gpus(
    nodes: int, gpus_per_node: int, tp: int = 1, pp: int = 1, **rest: Any
) -> Layout:
    """The layout that uses all ``nodes x gpus_per_node`` GPUs: ``dp`` is what is left
    after tensor and pipeline parallelism.

    Args:
        nodes: nodes of the allocation.
        gpus_per_node: GPUs on each node.
        tp: tensor-parallel degree.
        pp: pipeline stages.
        **rest: the other fields of :class:`~workshop.planner.layout.Layout`.

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
    mfu = "" if est.mfu is None else f", MFU {est.mfu:.1%}"
    lines += [
        f"{fit:<39}{'step (overlapped)':<20}{_ms(est.step)}",
        f"throughput: {rate:,.0f} {unit}/s for the job, {rate / world:,.0f} per GPU"
        + mfu,
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

    Given several layouts, prints one line for each and draws them side by side.

    Args:
        model: a name of :data:`~workshop.planner.layout.MODELS` or a
            :class:`~workshop.planner.layout.ModelShape`.
        layout: a :class:`~workshop.planner.layout.Layout`, or a list of them.
        gpu: a name of :data:`~workshop.planner.layout.GPUS`.
        network: a name of :data:`~workshop.planner.layout.NETWORKS`.
        gpus_per_node: GPUs on each node.
        mfu: the share of the GPU's peak reached (the estimator's default when None).
        draw: also draw the plan (:func:`workshop.draw.plan_plots.plot_plan`).

    Returns:
        The :class:`~workshop.planner.estimator.Estimate`, or a list of them.

    Raises:
        ValueError: an unknown name, or a layout the model cannot take.

    Example:
        >>> est = plan("transformer-8b", Layout(dp=8, tp=8, zero=3), draw=False)
        ... # doctest: +SKIP
    """
    if isinstance(layout, Layout):
        est = estimate(model, layout, gpu, network, gpus_per_node, mfu)
        print(plan_table(est))
        if draw:
            from ..draw.plan_plots import plot_plan

            _show_figure(plot_plan(est))
        return est
    if not layout or not all(isinstance(one, Layout) for one in layout):
        raise ValueError(
            f"layout={layout!r}: give a Layout, or a list of Layouts to compare"
        )
    found = [estimate(model, one, gpu, network, gpus_per_node, mfu) for one in layout]
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


# --- the planner as widgets -----------------------------------------------------------
def _png(fig: Figure) -> bytes:
    """The PNG the inline backend would show (100 dpi, tight)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _stream(text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": "stdout", "text": text + "\n"}


def _image(png: bytes, alt: str) -> dict[str, Any]:
    return {
        "output_type": "display_data",
        "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt},
        "metadata": {},
    }


@dataclass
class Planner:
    """What :func:`explore` returns: the widgets, and what they show now (a picture
    of the plan is stored beside them for a notebook that is not trusted).

    Attributes:
        view: the ipywidgets ``VBox`` to display or embed.
        controls: the input widgets by :func:`explore`'s argument names, and "rank";
            set a ``.value`` to replan.
        plot_out, fake_out: the ``Output`` with the plan, and with the fake run.
        estimate: the current Estimate, None while the inputs make no layout.
        message: why there is no estimate ("" when there is one).
        report: the last fake-backend report, None before the button is pressed.
    """

    view: Any
    controls: dict[str, Any]
    plot_out: Any
    fake_out: Any
    dp_label: Any
    button: Any
    estimate: Estimate | None = None
    message: str = ""
    report: Any = None
    _png: bytes = field(default=b"", repr=False)

    def current(self) -> tuple[str, Layout, str, str, int]:
        """(model, layout, gpu, network, gpus per node) from the widgets now.

        Raises:
            ValueError: the inputs make no layout (the message says why).
        """
        c = {name: w.value for name, w in self.controls.items()}
        options = (
            "zero", "micro_batch", "micro_batches", "checkpointing", "precision",
            "virtual_stages", "sequence_parallel", "tp_overlap",
        )  # fmt: skip
        layout = layout_for_gpus(
            c["nodes"],
            c["gpus_per_node"],
            c["tp"],
            c["pp"],
            **{k: c[k] for k in options},
        )
        model = model_shape(c["model"])
        layout.check_fits(model)
        return c["model"], layout, c["gpu"], c["network"], c["gpus_per_node"]

    def update(self, change: Any = None) -> None:
        """Replan from the widgets' values and redraw (called on every change)."""
        try:
            model, layout, gpu, network, per_node = self.current()
            self.dp_label.value = f"dp = {layout.dp} (GPUs / (tp x pp))"
            self.controls["rank"].max = layout.world_size - 1
            est = estimate(model, layout, gpu, network, per_node)
        except ValueError as exc:
            self.estimate, self.message = None, str(exc)
            self.dp_label.value = "dp = ?"
            self.plot_out.outputs = (_stream(f"Cannot plan this layout: {exc}"),)
            self.button.disabled = True
            return
        from ..draw.plan_plots import plot_plan

        self.estimate, self.message = est, ""
        fig = plot_plan(est)
        self._png = _png(fig)
        self.plot_out.outputs = (
            _stream(plan_table(est)),
            _image(self._png, f"memory and step time of {layout.describe()}"),
        )
        self.fake_out.outputs = ()
        self.button.disabled = False

    def run_fake(self, button: Any = None) -> None:
        """The button's action: run the chosen rank on the fake backend and show
        :func:`~workshop.planner.fake_compare.compare` of its stage's estimate."""
        if self.estimate is None:
            self.fake_out.outputs = (_stream(f"Nothing to run: {self.message}"),)
            return
        from .fake_compare import compare
        from .fake_world import fake_run

        rank = self.controls["rank"].value
        est = self.estimate
        self.fake_out.outputs = (
            _stream(
                f"running rank {rank} of {est.layout.world_size} on the fake backend..."
            ),
        )
        try:
            # The estimate of the pipeline stage this rank is on, as compare wants.
            stage = est.layout.coordinates(rank)["pp"]
            est = estimate(
                est.model,
                est.layout,
                est.gpu,
                est.network,
                est.gpus_per_node,
                stage=stage,
            )
            self.report = fake_run(est.model, est.layout, rank=rank)
            text = str(compare(est, self.report))
        except (ValueError, RuntimeError) as exc:
            self.fake_out.outputs = (
                _stream(f"The fake backend cannot run this layout: {exc}"),
            )
            return
        self.fake_out.outputs = (_stream(text),)
        # The picture again, with what the framework holds beside each estimated term.
        held = {k: float(v) for k, v in self.report.held.items() if k in MEMORY_TERMS}
        if held:
            from ..draw.plan_plots import plot_plan

            self._png = _png(plot_plan(est, fake=held))
            self.plot_out.outputs = (
                self.plot_out.outputs[0],
                _image(
                    self._png,
                    f"memory and step time of {est.layout.describe()}, "
                    f"with rank {rank}'s bytes on the fake backend",
                ),
            )

    def __repr__(self) -> str:
        if self.estimate is None:
            return f"Layout planner: {self.message}"
        return (
            "Layout planner (its widgets need a live kernel); now showing:\n"
            + plan_table(self.estimate)
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        bundle = dict(self.view._repr_mimebundle_() or {})
        bundle["text/plain"] = repr(self)
        if self._png:
            bundle["image/png"] = base64.b64encode(self._png).decode("ascii")
        return bundle


# What the widgets offer: each number box's range and each menu's choices. A starting
# value outside them is refused, named with what is allowed.
_OFFERS: dict[str, Any] = {
    "model": MODELS, "gpu": GPUS, "network": NETWORKS, "nodes": range(1, 1025),
    "gpus_per_node": (1, 2, 4, 8), "tp": range(1, 65), "pp": range(1, 65),
    "zero": (0, 1, 2, 3), "micro_batch": range(1, 65), "micro_batches": range(1, 257),
    "checkpointing": ("none", "selective", "full"), "precision": ("bf16", "fp32"),
    "virtual_stages": range(1, 17), "sequence_parallel": (False, True),
    "tp_overlap": (False, True),
}  # fmt: skip


def _check_start(values: dict[str, Any]) -> None:
    for name, offered in _OFFERS.items():
        value = values[name]
        flag = isinstance(offered, tuple) and all(type(o) is bool for o in offered)
        kinds = (bool,) if flag else (int, str)
        if type(value) not in kinds or value not in offered:
            shown = (
                f"{offered.start} to {offered.stop - 1:,}"
                if isinstance(offered, range)
                else ", ".join(map(str, offered))
            )
            raise ValueError(
                f"explore: {name}={value!r} is not one the planner offers; choose "
                f"one of {shown}"
            )


def explore(
    model: str = "transformer-8b",
    gpu: str = DEFAULT_GPU,
    network: str = DEFAULT_NETWORK,
    nodes: int = 8,
    gpus_per_node: int = 8,
    tp: int = 8,
    pp: int = 1,
    zero: int = 3,
    micro_batch: int = 1,
    micro_batches: int = 4,
    checkpointing: str = "full",
    precision: str = "bf16",
    virtual_stages: int = 1,
    sequence_parallel: bool = False,
    tp_overlap: bool = False,
) -> Planner:
    """The layout planner as widgets, starting from the layout the arguments give.

    Every change replans (``dp`` is the GPUs left after ``tp x pp``); a layout that
    cannot be made shows its reason in place of the plot.

    Args:
        model, gpu, network: names in :data:`~workshop.planner.layout.MODELS`,
            :data:`~workshop.planner.layout.GPUS`,
            :data:`~workshop.planner.layout.NETWORKS`.
        nodes, gpus_per_node, tp, pp: the allocation and the degrees.
        zero, micro_batch, micro_batches, checkpointing, precision,
            virtual_stages, sequence_parallel, tp_overlap: as in
            :class:`~workshop.planner.layout.Layout`.

    Returns:
        A :class:`Planner`; a cell that ends with it shows the widgets.

    Raises:
        ImportError: ipywidgets is not installed (``pip install ipywidgets``); use
            :func:`plan` without it.
        ValueError: a starting value the widgets cannot show, named with what is
            allowed.

    Example:
        >>> p = explore()  # doctest: +SKIP
        >>> p.controls["tp"].value = 4  # replans, as a click would  # doctest: +SKIP
    """
    _check_start(dict(locals()))  # the arguments, by name
    import ipywidgets as widgets

    style = {"description_width": "initial"}
    wide, narrow = widgets.Layout(width="250px"), widgets.Layout(width="170px")

    def choice(label: str, options: Any, value: Any, box: Any = narrow) -> Any:
        return widgets.Dropdown(
            options=options, value=value, description=label, style=style, layout=box
        )

    def number(label: str, value: int, name: str) -> Any:
        top = _OFFERS[name].stop - 1
        return widgets.BoundedIntText(
            value=value, min=1, max=top, description=label, style=style, layout=narrow
        )

    def flag(label: str, value: bool) -> Any:
        return widgets.Checkbox(
            value=value, description=label, style=style, layout=narrow, indent=False
        )

    controls = {
        "model": choice("model", list(MODELS), model, wide),
        "gpu": choice(
            "GPU",
            [(f"{g.name} ({g.memory_gb:g} GB)", n) for n, g in GPUS.items()],
            gpu,
            wide,
        ),
        "network": choice("network", list(NETWORKS), network, wide),
        "nodes": number("nodes", nodes, "nodes"),
        "gpus_per_node": choice("GPUs/node", _OFFERS["gpus_per_node"], gpus_per_node),
        "tp": number("tp", tp, "tp"),
        "pp": number("pp", pp, "pp"),
        "zero": choice(
            "ZeRO", [("0 (DDP)", 0), ("1", 1), ("2", 2), ("3 (FSDP)", 3)], zero
        ),
        "micro_batch": number("micro-batch", micro_batch, "micro_batch"),
        "micro_batches": number("micro-batches", micro_batches, "micro_batches"),
        "checkpointing": choice(
            "checkpointing", _OFFERS["checkpointing"], checkpointing
        ),
        "precision": choice("precision", _OFFERS["precision"], precision),
        "virtual_stages": number("virtual stages", virtual_stages, "virtual_stages"),
        "sequence_parallel": flag("sequence parallel", sequence_parallel),
        "tp_overlap": flag("overlap tp comm", tp_overlap),
        "rank": widgets.BoundedIntText(
            value=0,
            min=0,
            max=nodes * gpus_per_node - 1,
            description="rank r",
            style=style,
            layout=narrow,
        ),
    }
    button = widgets.Button(
        description="Run rank r on the fake backend",
        layout=widgets.Layout(width="250px"),
    )
    dp_label = widgets.Label()
    plot_out, fake_out = widgets.Output(), widgets.Output()

    def row(*names: str, then: tuple[Any, ...] = ()) -> Any:
        return widgets.HBox([*(controls[name] for name in names), *then])

    rows = [
        row("model", "gpu", "network"),
        row("nodes", "gpus_per_node", "tp", "pp", then=(dp_label,)),
        row("zero", "micro_batch", "micro_batches", "checkpointing", "precision"),
        row("virtual_stages", "sequence_parallel", "tp_overlap"),
        row("rank", then=(button,)),
        # Side by side where the screen is wide enough, one under the other if not.
        widgets.HBox([plot_out, fake_out], layout=widgets.Layout(flex_flow="row wrap")),
    ]
    result = Planner(widgets.VBox(rows), controls, plot_out, fake_out, dp_label, button)
    for name, control in controls.items():
        if name != "rank":
            control.observe(result.update, names="value")
    button.on_click(result.run_fake)
    result.update()
    return result
