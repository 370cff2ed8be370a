"""The compiled path's lesson (notebook 01 §5): the break-even arithmetic, its guard
when compiled is not faster, and its refusals. The training it reads is tested in
tests/training/test_compiled.py; the DDP worker runs in notebook 02."""

from __future__ import annotations

import pytest

import workshop
from workshop.lessons import break_even, compile_break_even
from workshop.training.progress import History


def test_the_h100_figures_break_even_after_about_two_thousand_steps():
    # docs/benchmarks.md: 3,989 and 5,616 images/s at batch 256, warm-up 55 s
    # against 18 s.
    h100 = break_even(55 - 18, 256 / 3989, 256 / 5616, "H100, ResNet-50")
    assert h100.steps == pytest.approx(37 / (256 / 3989 - 256 / 5616))
    assert round(h100.steps) == 1990
    assert h100.summary() == (
        "H100, ResNet-50: eager 64.2 ms a step, compiled 45.6 ms\n"
        "  the warm-up of 37.0 s pays off after 1,990 steps, 128 s of eager training\n"
        "  compiled is 1.41x as fast as eager here"
    )


def test_a_compiled_step_that_is_not_faster_never_pays_off():
    slower = break_even(5.0, 0.030, 0.031, "here")
    assert slower.steps is None
    assert "compiled is not faster here" in slower.summary()
    assert "never pays off; train eager" in slower.summary()
    assert slower.summary().endswith("compiled is 0.97x as fast as eager here")
    assert break_even(5.0, 0.030, 0.030, "here").steps is None


@pytest.mark.parametrize(
    "args", [(-1.0, 0.03, 0.02), (1.0, 0.0, 0.02), (1.0, 0.03, -1)]
)
def test_bad_figures_are_refused(args):
    with pytest.raises(ValueError, match=r"break_even needs warmup_seconds >= 0 "):
        break_even(*args, "here")


def _history(steps, seconds, compiled_steps=(), warmup=0.0):
    history = History(steps=steps, seconds=[seconds], samples_per_second=[1.0])
    history.compiled_steps = list(compiled_steps)
    history.warmup_seconds = warmup
    return history


def test_the_break_even_of_two_runs_leaves_the_compiling_steps_out():
    eager = _history(10, 1.0)  # 0.1 s a step
    # 2 steps compiled in 4.1 s; the other 8 took 0.4 s: 0.05 s a step.
    compiled = _history(10, 4.5, [1, 10], 4.1)
    pays = compile_break_even(eager, compiled, "here")
    assert pays.eager_step == pytest.approx(0.1)
    assert pays.compiled_step == pytest.approx(0.05)
    assert pays.warmup_seconds == pytest.approx(4.0)
    assert pays.steps == pytest.approx(80)


def test_a_run_that_did_not_compile_is_refused():
    with pytest.raises(ValueError, match=r"needs a compiled run with steady steps, "):
        compile_break_even(_history(10, 1.0), _history(10, 1.0), "here")
    assert workshop.lessons.ddp_compiled_graphs.__doc__
