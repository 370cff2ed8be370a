"""The slow tests of test_report.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the widgets, the fake
backend and the exercises run."""

from __future__ import annotations

import dataclasses

import pytest
from test_report import RIGHT_04, WRONG_04

from workshop.lessons.exercises import judge
from workshop.lessons.notebook04_planner import FIT, best_fit
from workshop.planner import report as planner
from workshop.planner.estimator import estimate
from workshop.planner.fake_compare import compare
from workshop.planner.layout import Layout
from workshop.planner.report import Planner


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
