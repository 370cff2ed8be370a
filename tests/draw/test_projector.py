"""Every figure the workshop draws fits a classroom projector.

Each public figure function is called as the notebooks call it, with representative
input (the package's own functions where that is cheap, else small plain data), and
``projector_fit`` renders it as JupyterLab's inline backend would: at most 1085 x 456
px, labels at least 12 px on screen. A new public figure function fails
``test_every_public_figure_function_is_checked`` until it has a case here.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

import workshop
from workshop.draw.plan_plots import plot_layouts, plot_plan
from workshop.draw.projector import NOTEBOOK_AREA_PX, projector_fit
from workshop.draw.ring_diagram import draw_ring_step
from workshop.gallery import (
    example_buckets,
    example_collectives,
    example_events,
    example_phases,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


# --- representative input ------------------------------------------------------------


def _data_parallel_record():
    import torch

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 16, 16), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()
    return workshop.lessons.data_parallel_step(
        workshop.SmallCNN(), x, y, ["cpu", "cpu"], loss_fn
    )


def _pipeline_timeline():
    import torch

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 16, 16), torch.randint(0, 10, (64,))
    model = workshop.lessons.TwoStageModel(
        ["cpu", "cpu"], in_features=16 * 16, hidden=128
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    return workshop.lessons.pipeline_forward_backward(model, x, y, 4, loss_fn)


def _gpipe_events(stages: int, micro_batches: int) -> list[dict]:
    """What run_pipeline records: 20 ms forwards, 40 ms backwards, in GPipe order."""
    cost = {"forward": 0.02, "backward": 0.04}
    ready: dict[tuple[int, int, str], float] = {}
    free = [0.0] * stages
    events = []
    for _, stage, mb, phase in workshop.lessons.pipeline_schedule(
        stages, micro_batches
    ):
        before = (
            ready.get((stage - 1, mb, phase), 0.0)
            if phase == "forward"
            else ready.get((stage + 1, mb, phase), ready.get((stage, mb, "forward")))
        )
        start = max(free[stage], before or 0.0)
        end = start + cost[phase]
        ready[stage, mb, phase], free[stage] = end, end
        events.append(dict(phase=phase, device=stage, start=start, end=end,
                           micro_batch=mb))  # fmt: skip
    return events


def _tensor_traces(world_size: int) -> list[list[dict]]:
    """launch(check_tensor_parallel, trace=True).traces: two all_reduces per rank."""
    return [
        [
            dict(rank=r, op="all_reduce", seq=s, nbytes=512, shapes=[(8, 16)])
            for s in range(2)
        ]
        for r in range(world_size)
    ]


def _monitor_samples(gpus: int) -> tuple[list, list[float], list]:
    """Three seconds of samples at 0.1 s, 48 steps, two phases (notebook 05)."""
    from workshop.machine.monitor_plot import Sample

    samples = []
    for i in range(30):
        t = 0.1 * (i + 1)
        sample = Sample(t, 97.0, 35.0 + 10 * math.sin(i), 2.3, 0.0, 0.002 * (i % 3))
        if gpus:
            sample = sample.with_gpus([80.0 + g for g in range(gpus)], [3.5] * gpus)
        samples.append(sample)
    steps = [0.1 * (k + 1) for k in range(24)] + [2.45 + 0.02 * k for k in range(24)]
    phases = [("decode in the loop", 0.0, 2.42), ("decoded ahead", 2.42, 2.95)]
    return samples, steps, phases


def _ring_steps():
    return workshop.comm.ring_all_reduce_steps([[float(4 * r + i) for i in range(4)]
                                          for r in range(4)])  # fmt: skip


def _throughput() -> dict[str, list[tuple[int, float]]]:
    return {
        "SmallCNN (digits, 16x16)": [(8, 900.0), (32, 2600.0), (128, 4800.0)],
        "ResNet-18 (32x32)": [(8, 60.0), (32, 110.0), (128, 140.0)],
    }


def _scaling_projection() -> dict[str, list[tuple[int, float]]]:
    gradient_bytes, compute = 25_557_032 * 4, 0.150
    points = []
    for gpus in (1, 2, 4, 8, 16, 32, 64, 128):
        step = compute + workshop.comm.ring_all_reduce_time(
            gradient_bytes, gpus, 1e-5, 25e9
        )
        points.append((gpus, gpus * 256 / step))
    return {"ResNet-50, ring model, no overlap": points}


def _collective(op: str) -> Figure:
    if op in ("broadcast", "all_reduce"):
        events = example_events()
        index = 0 if op == "broadcast" else -1
        return workshop.draw.draw_collective([lane[index] for lane in events])
    return workshop.draw.draw_collective(example_collectives()[op])


def _plans() -> list:
    # Notebook 04 section 8's layouts of transformer-8b on 64 GPUs, from the estimator.
    layouts = [workshop.planner.Layout(dp=64, zero=3, micro_batches=4),
               workshop.planner.Layout(dp=8, tp=8, zero=3, micro_batches=32),
               workshop.planner.Layout(dp=2, tp=8, pp=4, zero=1, micro_batches=128),
               workshop.planner.Layout(dp=64, zero=0, micro_batches=4)]  # fmt: skip
    return [workshop.planner.estimate("transformer-8b", layout) for layout in layouts]


# (case id, the public function it checks, how the notebooks call it)
CASES: list[tuple[str, str, Callable[[], Figure]]] = [
    ("plan", "plot_plan", lambda: plot_plan(_plans()[1])),
    ("plan_over_capacity", "plot_plan", lambda: plot_plan(_plans()[3])),
    ("layouts", "plot_layouts", lambda: plot_layouts(_plans())),
    ("published_busbw", "plot_published_busbw",
     lambda: workshop.bench.plot_published_busbw()),
    ("published_mfu", "plot_published_mfu", workshop.bench.plot_published_mfu),
    ("against_published", "plot_against_published",
     lambda: workshop.planner.plot_against_published(
         workshop.planner.against_published())),
    ("data_parallel_step", "draw_data_parallel_step",
     lambda: workshop.draw.draw_data_parallel_step(_data_parallel_record())),
    ("timeline_2_stages", "draw_timeline",
     lambda: workshop.draw.draw_timeline(
         _pipeline_timeline(), "Pipeline, 2 stages, 4 micro-batches (measured)")),
    ("timeline_4_ranks", "draw_timeline",
     lambda: workshop.draw.draw_timeline(
         _gpipe_events(4, 4), "GPipe on 4 ranks, 4 micro-batches",
         lanes=[f"rank {r}" for r in range(4)])),
    ("timeline_8_ranks", "draw_timeline",
     lambda: workshop.draw.draw_timeline(_gpipe_events(8, 8), "GPipe on 8 ranks")),
    ("schedule_2x4", "draw_schedule",
     lambda: workshop.draw.draw_schedule(workshop.lessons.pipeline_schedule(2, 4))),
    ("schedule_4x8", "draw_schedule",
     lambda: workshop.draw.draw_schedule(workshop.lessons.pipeline_schedule(4, 8))),
    ("throughput", "plot_throughput",
     lambda: workshop.draw.plot_throughput(_throughput())),
    ("speedup", "plot_speedup",
     lambda: workshop.draw.plot_speedup(
         [1, 2, 4, 8],
         {"SmallCNN (digits, 16x16)": [1.0, 1.77, 2.87, 4.12],
          "ResNet-18 (32x32)": [1.0, 1.43, 1.78, 2.02]},
         title="Batch of 64 split across devices (projected from the fit)")),
    ("allreduce_N2", "plot_allreduce",
     lambda: workshop.bench.plot_allreduce(
         workshop.bench.load_allreduce(RESULTS / "allreduce-gloo-N2.json"))),
    ("allreduce_N4", "plot_allreduce",
     lambda: workshop.bench.plot_allreduce(
         workshop.bench.load_allreduce(RESULTS / "allreduce-gloo-N4.json"))),
    ("scaling_recorded", "plot_scaling",
     lambda: workshop.bench.plot_scaling(
         workshop.bench.load_scaling(RESULTS / "scaling-gloo-cnn.json"),
         {"perfect weak scaling from 1,000 samples/s":
          [(1, 1000), (2, 2000), (4, 4000)]},
         title="Recorded run vs a table")),
    ("scaling_published", "plot_scaling",
     lambda: workshop.bench.plot_scaling(
         workshop.bench.load_scaling(RESULTS / "scaling-gloo-cnn.json"),
         workshop.bench.published_scaling(), xlabel="ranks (CPU processes or GPUs)",
         title="Published ResNet-50 on V100 GPUs beside SmallCNN on 2 CPU cores")),
    ("efficiency_documents", "plot_efficiency",
     lambda: workshop.bench.plot_efficiency(
         workshop.sources.document_table("cpu-batch50"),
         workshop.sources.document_table("cpu-batch256"),
         workshop.bench.load_scaling(RESULTS / "scaling-gloo-cnn.json"),
         title="MNIST on CPU cores (SHARCNET, doc 004) beside SmallCNN on 2 cores")),
    ("efficiency_gpus", "plot_efficiency",
     lambda: workshop.bench.plot_efficiency(
         workshop.sources.document_table("keras-gpus-batch256").speedups("V100"),
         workshop.sources.document_table("estimator-gpus-batch256").speedups("V100"),
         workshop.sources.document_table("keras-v100-batch8192"),
         workshop.sources.document_table("estimator-v100-batch8192"),
         workshop.bench.load_scaling(RESULTS / "scaling-gloo-cnn.json"),
         title="MNIST on 1 to 8 V100s (SHARCNET, doc 004) beside SmallCNN")),
    ("api_times", "plot_api_times",
     lambda: workshop.lessons.plot_api_times(
         workshop.sources.document_table("gpu-p100-v100-apis"),
         title="MNIST on one GPU, per API (SHARCNET, doc 004)")),
    ("api_times_one_gpu", "plot_api_times",
     lambda: workshop.lessons.plot_api_times(
         workshop.sources.document_table("gpu-p100-apis"))),
    ("scaling_projected", "plot_scaling",
     lambda: workshop.bench.plot_scaling(
         _scaling_projection(),
         title="Projected weak scaling (assumed alpha, beta and compute)")),
    ("tensor_parallel_4", "draw_tensor_parallel",
     lambda: workshop.draw.draw_tensor_parallel(4, d_model=16, d_hidden=64,
                                           events=_tensor_traces(4))),
    ("tensor_parallel_6", "draw_tensor_parallel",
     lambda: workshop.draw.draw_tensor_parallel(6, 64, 96, _tensor_traces(6), batch=8)),
    ("rank_timeline_ddp", "draw_rank_timeline",
     lambda: workshop.draw.draw_rank_timeline(
         example_buckets(), example_phases(), title="One DDP step, bucket_cap_mb=0.1")),
    ("rank_timeline_calls", "draw_rank_timeline",
     lambda: workshop.draw.draw_rank_timeline(example_events(), example_phases())),
    ("monitor_cpu", "plot_monitor",
     lambda: workshop.machine.plot_monitor(*_monitor_samples(0),
                                   title="SmallCNN on digits, 24 steps each")),
    ("monitor_2_gpus", "plot_monitor",
     lambda: workshop.machine.plot_monitor(*_monitor_samples(2),
                                   title="SmallCNN on digits, 24 steps each")),
    # The communication diagrams of notebooks 02 and 03.
    ("rank_layout_2x4", "draw_rank_layout",
     lambda: workshop.draw.draw_rank_layout(nodes=2, ranks_per_node=4)),
    ("rank_layout_2x2_cpu", "draw_rank_layout",
     lambda: workshop.draw.draw_rank_layout(nodes=2, ranks_per_node=2, gpus=False)),
    ("point_to_point", "draw_point_to_point",
     lambda: workshop.draw.draw_point_to_point(example_events())),
    *[
        (f"collective_{op}", "draw_collective", lambda op=op: _collective(op))
        for op in ("broadcast", "all_reduce", *example_collectives())
    ],
    ("ring_step", "draw_ring_step",
     lambda: draw_ring_step(_ring_steps(), 0)),
    ("ring_grid", "draw_ring_grid",
     lambda: workshop.draw.draw_ring_grid(_ring_steps())),
]  # fmt: skip


def test_a_timeline_fits_up_to_max_lanes_and_past_that_grows_taller():
    from workshop.draw.diagrams import MAX_LANES

    for lanes, fits in ((MAX_LANES, True), (MAX_LANES + 2, False)):
        fig = workshop.draw.draw_timeline(_gpipe_events(lanes, 2), f"{lanes} lanes")
        fit = projector_fit(fig)
        plt.close(fig)
        assert fit.fits == fits, (lanes, fit.problems)
        assert fit.width_px <= NOTEBOOK_AREA_PX[0]  # only the height grows
        # Many lanes get one-line labels: "device 0, idle 43%".
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert all("\n" not in label for label in labels), labels


# Public functions that return a figure only sometimes, and where their figures are
# checked instead.
NOT_CHECKED_HERE = {
    "ring_widget": "a slider over draw_ring_step's figures; draw_ring_grid's figure "
    "without ipywidgets",
}


# Figures drawn from a step that trains in this process (notebook 01's lessons).
_TRAINS_HERE = {"data_parallel_step", "timeline_2_stages"}


@pytest.mark.parametrize(
    "draw",
    [
        pytest.param(
            c[2],
            id=c[0],
            marks=[pytest.mark.backward_in_process] if c[0] in _TRAINS_HERE else [],
        )
        for c in CASES
    ],
)
def test_the_figure_fits_a_1280x720_projector(draw):
    fig = draw()
    try:
        assert isinstance(fig, Figure)
        fit = projector_fit(fig)
        assert fit.fits, (
            f"{fit.width_px} x {fit.height_px} px does not fit the notebook area "
            f"{NOTEBOOK_AREA_PX}: " + "; ".join(fit.problems)
        )
    finally:
        plt.close(fig)


def test_every_public_figure_function_is_checked():
    figure_functions = set()
    topics = [getattr(workshop, t) for t in workshop.__all__]
    topics = [t for t in topics if inspect.ismodule(t)]
    named = [(n, getattr(t, n)) for t in [workshop, *topics] for n in t.__all__]
    for name, obj in named:
        if inspect.isfunction(obj):
            returns = inspect.signature(obj).return_annotation
            if "Figure" in str(returns) or name.startswith(("draw_", "plot_")):
                figure_functions.add(name)
    assert figure_functions >= {"draw_timeline", "plot_scaling", "plot_monitor"}
    checked = {function for _, function, _ in CASES}
    assert {"draw_ring_step", "draw_ring_grid"} <= checked  # ring_widget's figures
    assert figure_functions - checked - set(NOT_CHECKED_HERE) == set(), (
        "public figure functions with no projector case here: add one to CASES"
    )
    # What plan and explore draw, and the ring widget's steps: checked, not public.
    assert checked - figure_functions == {"plot_plan", "plot_layouts", "draw_ring_step"}


@pytest.mark.parametrize(
    "draw", [c[2] for c in CASES if c[1].startswith("plot_")],
    ids=[c[0] for c in CASES if c[1].startswith("plot_")],
)  # fmt: skip
def test_a_plot_is_closed_in_pyplot_so_a_cell_shows_it_once(draw):
    # A figure left open in pyplot is shown by the inline backend at the end of the
    # cell, and again as the cell's value; and open figures pile up in memory.
    fig = draw()
    try:
        assert not plt.fignum_exists(fig.number)
    finally:
        plt.close(fig)
