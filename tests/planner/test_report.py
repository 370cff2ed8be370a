"""Notebook 04's planner: plan() prints the estimator's table and draws it, the
widgets replan when a value changes and show a bad layout's reason, and the three
planner exercises accept the notebook's answers and reject wrong ones.

RIGHT_04 and WRONG_04 also feed the check of every exercise in test_exercises.py."""

from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

import re

import pytest

from workshop.lessons import notebook04_planner as exercises_plan
from workshop.lessons.exercises import judge
from workshop.lessons.notebook04_planner import FIT, TP_NODES, best_fit, tp_nodes_ratio
from workshop.planner import report as planner
from workshop.planner.estimator import Estimate, estimate
from workshop.planner.fake_compare import compare
from workshop.planner.layout import GPUS, MODELS, NETWORKS, Layout, model_shape
from workshop.planner.report import Planner, layout_for_gpus, plan, plan_table

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


def test_the_widgets_replan_on_a_change_and_show_why_a_layout_fails():
    p = planner.explore(nodes=8, gpus_per_node=8, tp=8, pp=1)
    assert isinstance(p, Planner)
    assert p.estimate is not None and p.estimate.layout.dp == 8
    table = p.plot_out.outputs[0]["text"]
    assert table.startswith("transformer-8b, 8.03 B parameters, on 64 x")
    assert "image/png" in p.plot_out.outputs[1]["data"]
    before = p.estimate
    p.controls["tp"].value = 4  # what a learner's click does
    assert p.estimate.layout == dataclasses.replace(before.layout, dp=16, tp=4)
    assert p.estimate.time["tp comm"] != before.time["tp comm"]
    assert "dp=16 tp=4" in p.plot_out.outputs[0]["text"]
    assert p.dp_label.value.startswith("dp = 16")
    p.controls["gpus_per_node"].value = 2  # 16 GPUs: 8 x 2 is no multiple of 4 x 8
    p.controls["pp"].value = 8
    assert p.estimate is None
    text = p.plot_out.outputs[0]["text"]
    assert text.startswith("Cannot plan this layout: 8 nodes x 2 GPUs = 16 GPUs")
    assert "Traceback" not in text and p.button.disabled
    p.controls["pp"].value = 5  # 32 layers on 5 stages: 6 or 7 a stage, planned
    p.controls["nodes"].value = 10
    assert p.estimate is not None and p.estimate.layout.pp == 5
    assert p.estimate.record.layers in (6, 7)
    p.controls["nodes"].value = 15  # 30 GPUs: tp 3 x pp 5 x dp 2
    p.controls["tp"].value = 3  # divides none of the model's 32 heads
    assert p.estimate is None
    assert p.message.startswith("tp=3 does not divide transformer-8b's heads=32")
    assert p.plot_out.outputs[0]["text"].startswith("Cannot plan this layout: tp=3")
    assert "Layout planner: tp=3" in repr(p)
    bundle = p._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == repr(p)


def test_the_widgets_plan_interleaving_sequence_parallelism_and_overlap():
    p = planner.explore(nodes=8, gpus_per_node=8, tp=8, pp=2, micro_batches=8)
    plain = p.estimate
    p.controls["virtual_stages"].value = 2
    p.controls["sequence_parallel"].value = True
    p.controls["tp_overlap"].value = True
    assert p.estimate.layout == dataclasses.replace(
        plain.layout, virtual_stages=2, sequence_parallel=True, tp_overlap=True
    )
    # Interleaving divides the schedule's bubble by v (the slowest stage's pace
    # also counts its sends, which v multiplies): the same layout with v = 1 has
    # twice the bubble.
    est = p.estimate
    one = estimate(
        est.model,
        dataclasses.replace(est.layout, virtual_stages=1),
        est.gpu,
        est.network,
        est.gpus_per_node,
        stage=est.record.stage,
    )
    sends = [op for op in est.record.operations if op.group == "pp"]
    assert sends and est.time["bubble"] < one.time["bubble"]
    assert est.time["bubble"] == pytest.approx(one.time["bubble"] / 2, rel=0.02)
    assert p.estimate.step < plain.step
    assert "sp v=2 tp-overlap" in p.plot_out.outputs[0]["text"]
    p.controls["tp"].value = 1  # nothing to split along the sequence: says why
    assert p.estimate is None
    assert p.message.startswith("Layout: sequence_parallel=True needs tensor")


def test_the_fake_backend_button_prints_the_comparison():
    p = planner.explore(
        model="tiny", nodes=2, gpus_per_node=4, tp=2, pp=1, checkpointing="none"
    )
    p.controls["rank"].value = 5
    picture = p._png
    p.button.click()
    assert p.report.rank == 5 and p.report.world_size == 8
    shown = p.fake_out.outputs[0]["text"]
    assert shown == str(compare(p.estimate, p.report)) + "\n"
    assert max(len(line) for line in shown.splitlines()) <= 88
    assert p._png != picture  # redrawn with the framework's bytes beside the bars
    p.controls["rank"].value = 8  # the world is 0..7: the box stops at 7
    assert p.controls["rank"].value == 7


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


@pytest.mark.parametrize("name", sorted(RIGHT_04))
def test_planner_exercises_accept_right_and_reject_wrong(name, capsys):
    assert judge(name, RIGHT_04[name]) is True
    assert judge(name, WRONG_04[name]) is False
    out = capsys.readouterr().out
    assert "Not yet: " + name in out and max(map(len, out.splitlines())) <= 88


def test_fit8b_says_what_is_wrong(capsys):
    best = best_fit().layout
    cases = {
        "uses dp x tp x pp = 32 GPUs; the allocation has 64": dataclasses.replace(
            best, dp=best.dp // 2, micro_batches=best.micro_batches * 2
        ),
        f"the exercise fixes {FIT['global_batch']}": dataclasses.replace(
            best, micro_batches=best.micro_batches + 1
        ),
        "GB per GPU; an H100 80GB holds 80 GB": Layout(
            dp=64, zero=0, micro_batch=1, micro_batches=4
        ),
        "should be a Layout": (8, 8, 1),
    }
    for words, answer in cases.items():
        assert judge("04.fit8b", answer) is False
        assert words in capsys.readouterr().out.replace("\n  ", " ")


def test_a_fitting_but_slow_layout_is_told_how_much_slower(capsys):
    slow = Layout(
        dp=1, tp=8, pp=8, zero=0, micro_batch=1, micro_batches=256, checkpointing="full"
    )
    assert judge("04.fit8b", slow) is False
    out = capsys.readouterr().out.replace("\n  ", " ")
    assert "slower)" in out or "GB per GPU" in out


def test_the_tp_exercise_compares_one_layout_on_two_node_sizes():
    assert TP_NODES["layout"].tp == 8 and TP_NODES["nodes_of"] == (8, 4)
    assert tp_nodes_ratio() > 1  # across nodes is slower
    assert exercises_plan.bubble_micro_batches(4, 0.10) == 28
    assert exercises_plan.bubble_micro_batches(2, 0.5) == 2
