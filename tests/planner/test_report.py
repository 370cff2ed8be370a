"""Notebook 04's planner: plan() prints the estimator's table and draws it, the
widgets replan when a value changes and show a bad layout's reason, and the three
planner exercises accept the notebook's answers and reject wrong ones.

RIGHT_04 and WRONG_04 also feed the check of every exercise in test_exercises.py."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import re

import pytest

from workshop.lessons import notebook04_planner as exercises_plan
from workshop.lessons.notebook04_planner import TP_NODES, best_fit, tp_nodes_ratio
from workshop.planner import report as planner
from workshop.planner.estimator import Estimate, estimate
from workshop.planner.layout import GPUS, MODELS, NETWORKS, Layout, model_shape
from workshop.planner.report import layout_for_gpus, plan, plan_table

ipywidgets = pytest.importorskip("ipywidgets")


def _by_hand(layout: Layout, **memory_gb: float) -> Estimate:
    """An estimate written by hand: the table must show exactly these figures."""
    memory = dict.fromkeys(planner.MEMORY_TERMS, 0.0)
    memory.update({k: v * 1e9 for k, v in memory_gb.items()})
    time = {
        "compute": 2.0,
        "dp comm": 0.25,
        "tp comm": 0.5,
        "pp comm": 0.0,
        "bubble": 0.125,
    }
    return Estimate(
        MODELS["transformer-8b"],
        layout,
        GPUS["H100 80GB"],
        NETWORKS["NVLink 4 + NDR 400G"],
        8,
        memory,
        time,
        {},
        {},
        step=2.5,
    )


B8_FLOPS = model_shape("transformer-8b").flops_per_token()


def test_the_table_shows_each_term_the_total_and_whether_it_fits():
    layout = Layout(dp=8, tp=8, zero=3, micro_batches=4)
    table = plan_table(
        _by_hand(layout, parameters=2.0, optimizer=12.0, activations=50.5)
    )
    lines = table.splitlines()
    assert max(map(len, lines)) <= 88
    assert lines[0].startswith("transformer-8b, 8.03 B parameters, on 64 x H100 80GB")
    assert "(8 nodes of 8)" in lines[0]
    assert lines[1] == f"layout: {layout.describe()}"
    row = {line.split()[0]: line.split() for line in lines[3:8]}
    assert row["parameters"][1] == "2.00" and row["optimizer"][1] == "12.00"
    assert row["activations"][1] == "50.50" and row["gradients"][1] == "0.00"
    assert row["parameters"][-1] == "2000.0"  # compute, ms, beside the first term
    assert "64.50" in lines[8] and "2875.0" in lines[8]  # totals: GB, ms
    assert "fits: 81% of 80 GB" in lines[9] and "2500.0" in lines[9]
    # dp x micro_batch x micro_batches = 8 x 1 x 4 sequences of 8,192 tokens in 2.5 s;
    # MFU: those tokens x 6 P + 12 L h s FLOPs / 2.5 s / (64 x 989 TFLOP/s)
    mfu = 8 * 4 * 8192 * B8_FLOPS / 2.5 / (64 * 989e12)
    assert lines[10] == (
        f"throughput: 104,858 tokens/s for the job, 1,638 per GPU, MFU {mfu:.1%}"
    )
    too_big = plan_table(_by_hand(layout, optimizer=96.0))
    assert "DOES NOT FIT: 120% of 80 GB" in too_big


def test_split_gpus_derives_dp_and_says_when_the_degrees_do_not_divide():
    assert layout_for_gpus(16, 8, tp=8, pp=4, zero=1) == Layout(
        dp=4, tp=8, pp=4, zero=1
    )
    with pytest.raises(
        ValueError,
        match=r"3 nodes x 8 GPUs = 24 GPUs cannot be split "
        r"into groups of tp x pp = 16 x 1 = 16",
    ):
        layout_for_gpus(3, 8, tp=16)
    with pytest.raises(ValueError, match=r"nodes=0 must be a whole number"):
        layout_for_gpus(0, 8)


def test_plan_prints_the_estimators_table_and_draws_it(capsys, monkeypatch):
    shown = []
    monkeypatch.setattr(planner, "_show_figure", shown.append)
    layout = Layout(dp=8, tp=8, zero=3, micro_batches=4, checkpointing="full")
    est = plan("transformer-8b", layout)
    assert est == estimate(MODELS["transformer-8b"], layout)
    out = capsys.readouterr().out
    assert out == plan_table(est) + "\n"
    assert len(shown) == 1 and shown[0].axes  # plot_plan's figure, handed on
    plan("transformer-8b", layout, draw=False)
    assert len(shown) == 1
    with pytest.raises(ValueError, match="pp=33 x virtual_stages=1 is more than"):
        plan("transformer-8b", Layout(dp=1, pp=33))


def test_plan_of_several_layouts_prints_a_line_each_and_draws_them(capsys, monkeypatch):
    from workshop.planner.estimator import table

    shown = []
    monkeypatch.setattr(planner, "_show_figure", shown.append)
    layouts = [Layout(dp=64, zero=3, micro_batches=4), Layout(dp=8, tp=8, zero=3)]
    found = plan("transformer-8b", layouts)
    assert [e.layout for e in found] == layouts
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "transformer-8b on H100 80GB, 8 per node, NVLink 4 + NDR 400G"
    assert "\n".join(out[1:]) == table(found)
    assert len(shown) == 1 and len(shown[0].axes) >= 2
    with pytest.raises(ValueError, match=r"give a Layout, or a list of Layouts"):
        plan("transformer-8b", [])


def test_an_unknown_starting_model_is_refused():
    with pytest.raises(
        ValueError, match=r"model='gpt5' is not one the planner offers; choose one of "
    ):
        planner.explore(model="gpt5")


@pytest.mark.parametrize(
    ("argument", "value", "allowed"),
    [
        ("zero", 5, "0, 1, 2, 3"),
        ("gpus_per_node", 3, "1, 2, 4, 8"),
        ("checkpointing", "bogus", "none, selective, full"),
        ("precision", "fp16", "bf16, fp32"),
        ("nodes", 0, "1 to 1,024"),
        ("nodes", 5000, "1 to 1,024"),
        ("micro_batches", -1, "1 to 256"),
        ("tp", True, "1 to 64"),
        ("nodes", "8", "1 to 1,024"),
        ("virtual_stages", 0, "1 to 16"),
        ("sequence_parallel", 1, "False, True"),
        ("tp_overlap", "yes", "False, True"),
    ],
)
def test_a_starting_value_the_widgets_cannot_show_is_refused_by_name(
    argument, value, allowed
):
    # Not ipywidgets' "Invalid selection" nor a value silently cut to the box's range.
    message = f"explore: {argument}={value!r} is not one the planner offers; "
    with pytest.raises(
        ValueError, match=re.escape(message + f"choose one of {allowed}")
    ):
        planner.explore(**{argument: value})


# --- the exercises --------------------------------------------------------------------


def test_the_tp_exercise_compares_one_layout_on_two_node_sizes():
    assert TP_NODES["layout"].tp == 8 and TP_NODES["nodes_of"] == (8, 4)
    assert tp_nodes_ratio() > 1  # across nodes is slower
    assert exercises_plan.bubble_micro_batches(4, 0.10) == 28
    assert exercises_plan.bubble_micro_batches(2, 0.5) == 2


# The estimator gives the right answers to 04.fit8b and 04.tp_nodes (in a second).
RIGHT_04 = {
    "04.fit8b": best_fit().layout,
    "04.tp_nodes": tp_nodes_ratio(),
    "04.bubble_mb": 28,
}


WRONG_04 = {
    # tensor parallelism inside each node: fits, but slower than the best by far
    "04.fit8b": Layout(dp=8, tp=8, zero=3, micro_batch=1, micro_batches=32),
    "04.tp_nodes": 450 / 50,  # the ratio of the links, not of the steps
    "04.bubble_mb": 27,  # 3/30: exactly 10 %, not under
}
