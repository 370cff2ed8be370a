"""The notebooks' self-checking exercises accept the reference answers and reject
wrong ones with a hint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workshop.comm.costmodel import bus_factor, ring_all_reduce_time
from workshop.comm.ring import ring_all_reduce
from workshop.lessons.exercises import judge
from workshop.lessons.notebook01_pipeline import bubble_fraction
from workshop.training.checkpoint import load_checkpoint
from workshop.training.throughput import StepCost, projected_speedup


def resume(path, model, optimizer):
    """The notebook's solution to 02.resume."""
    from pathlib import Path

    if not Path(path).exists():
        return 0
    return load_checkpoint(path, model, optimizer)["epoch"] + 1


def resume_off_by_one(path, model, optimizer):
    from pathlib import Path

    if not Path(path).exists():
        return 0
    return load_checkpoint(path, model, optimizer)["epoch"]  # repeats an epoch


def local_rank(argv, environ):
    """The notebook's solution to 03.local_rank."""
    if "LOCAL_RANK" in environ:
        return int(environ["LOCAL_RANK"])
    for word in argv:
        if word.startswith(("--local-rank=", "--local_rank=")):
            return int(word.split("=", 1)[1])
    return 0


def hybrid(nodes, cores_per_node, gpus_per_node):
    """The notebook's solution to 03.hybrid."""
    pe = cores_per_node // gpus_per_node
    return nodes * gpus_per_node, gpus_per_node, pe


def efficiency(points, is_time):
    """The notebook's solution to 03.efficiency."""
    n0, v0 = points[0]
    return [(v0 / v if is_time else v / v0) / (n / n0) for n, v in points]


def row_parallel(x_part, weight_part, bias):
    """The notebook's solution to 04.row_split."""
    import torch.distributed as dist

    out = x_part @ weight_part.T  # this rank's partial sum of the output
    dist.all_reduce(out)
    return out + bias


def row_parallel_bias_per_rank(x_part, weight_part, bias):
    import torch.distributed as dist

    out = x_part @ weight_part.T + bias  # every rank adds the bias: N times in all
    dist.all_reduce(out)
    return out


RIGHT = {
    "01.dp": (64, 4),
    "01.bubble": lambda s, m: (s - 1) / (m + s - 1),
    "01.accumulate": 8,
    "01.speedup": 8 / 6.5,
    "02.ring": ring_all_reduce,
    "02.bytes": lambda p, b, n: 2 * (n - 1) / n * p * b,
    "02.resume": resume,
    "03.placement": lambda rank, per_node: (rank // per_node, rank % per_node),
    "03.local_rank": local_rank,
    "03.hybrid": hybrid,
    "03.efficiency": efficiency,
    "03.ring_time": lambda s, n, a, b: 2 * (n - 1) * a + 2 * (n - 1) / n * s / b,
    "04.row_split": row_parallel,
    "04.server_bytes": lambda workers, b: 2 * workers * b,
    "04.bubble": 3 / 11,
}
WRONG = {
    "01.dp": (256, 1),
    "01.bubble": lambda s, m: (s - 1) / m,
    "01.accumulate": 4,
    "01.speedup": 4.0,
    "02.ring": lambda tensor: tensor,  # every rank keeps its own values
    "02.bytes": lambda p, b, n: p * b,  # forgets that a ring sends 2(N-1)/N of it
    "02.resume": resume_off_by_one,
    "03.placement": lambda rank, per_node: (rank % per_node, rank // per_node),
    # torchrun only: misses the argument torch.distributed.launch adds
    "03.local_rank": lambda argv, environ: int(environ.get("LOCAL_RANK", 0)),
    # the slides' 16 cores a rank copied, whatever the node
    "03.hybrid": lambda nodes, cores, gpus: (nodes * cores // 16, cores // 16, 16),
    # divides by the count, not by count / first count
    "03.efficiency": lambda points, is_time: [
        (points[0][1] / v if is_time else v / points[0][1]) / n for n, v in points
    ],
    "03.ring_time": lambda s, n, a, b: 2 * (n - 1) * a + s / b,  # all of it, per step
    "04.row_split": row_parallel_bias_per_rank,
    "04.server_bytes": lambda workers, b: workers * b,  # forgets the pull
    "04.bubble": 3 / 8,  # (p - 1) / m: the idle steps over the busy ones
}
# Notebook 05's solutions and wrong answers sit beside their own tests.
from test_notebook05 import RIGHT_05, WRONG_05  # noqa: E402

RIGHT.update(RIGHT_05)
WRONG.update(WRONG_05)
# So do notebook 04's planner exercises (section 8), in tests/planner.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
from test_report import RIGHT_04, WRONG_04  # noqa: E402

RIGHT.update(RIGHT_04)
WRONG.update(WRONG_04)


def test_a_whole_number_of_micro_batches_as_a_float_is_told_apart(capsys):
    assert judge("01.accumulate", 8.0) is False
    assert "accumulate= takes a whole number of micro-batches (an int), not 8.0" in (
        capsys.readouterr().out
    )


def test_an_answer_that_is_not_a_function_says_so(capsys):
    assert judge("01.bubble", 0.2) is False
    assert (
        "bubble should be a function, but it is float 0.2." in capsys.readouterr().out
    )


def test_reference_answers_agree_with_the_package():
    assert judge("01.bubble", bubble_fraction)
    fixed_and_per_sample = StepCost(fixed_s=0.006, per_sample_s=0.002 / 64)
    assert judge("01.speedup", projected_speedup(fixed_and_per_sample, 64, [4])[0])
    assert judge("02.bytes", lambda p, b, n: bus_factor(n) * p * b)
    assert judge("03.ring_time", ring_all_reduce_time)


def test_a_raising_answer_and_an_unknown_name(capsys):
    assert judge("01.bubble", lambda s, m: 1 / 0) is False
    out = capsys.readouterr().out
    assert out.startswith(
        "Not yet: 01.bubble.\nIt raised ZeroDivisionError: division by zero."
    )
    with pytest.raises(
        KeyError,
        match=r"no exercise named '01.nope'; the exercises "
        r"are '01.dp'",
    ):
        judge("01.nope", 1)
    with pytest.raises(KeyError, match=r"no exercise named \['01.dp'\]"):
        judge(["01.dp"], 1)  # TypeError: unhashable type: 'list' before
