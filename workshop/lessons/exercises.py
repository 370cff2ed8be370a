"""Self-checking exercises: ``check("01.bubble", my_answer)`` says whether an answer is
right and, when it is not, gives a hint without giving the answer away.

Each notebook's exercises are registered here by name ("01.bubble" is notebook 01's
exercise on pipeline bubbles), so the answers are tested with the package.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from ..comm.costmodel import bus_factor, ring_all_reduce_time
from .exercises_cluster import CLUSTER_EXERCISES
from .exercises_plan import PLAN_EXERCISES
from .judges import Exercise, close, first_wrong_case

__all__ = ["EXERCISES", "check", "judge"]


def _bubble_function(answer: Any) -> bool | str:
    cases = [(1, 1), (2, 1), (2, 4), (4, 8), (8, 32), (3, 3)]
    return first_wrong_case(answer, "bubble", cases, lambda s, m: (s - 1) / (m + s - 1))


def _matches_all_reduce(ring: Callable[[Any], Any], n_elements: int) -> bool | str:
    # Runs inside each rank: the learner's ring against torch's own all_reduce.
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(dist.get_rank())
    mine = torch.randn(n_elements, generator=g)
    expected = mine.clone()
    dist.all_reduce(expected)
    got = ring(mine.clone())
    if isinstance(got, torch.Tensor) and torch.allclose(got, expected, atol=1e-5):
        return True
    shown = got[:3].tolist() if isinstance(got, torch.Tensor) else got
    return (
        f"on {dist.get_world_size()} ranks, rank {dist.get_rank()} returned "
        f"{shown} (first values) where the sum over the ranks is "
        f"{[round(v, 4) for v in expected[:3].tolist()]}"
    )


def _passes_on_ranks(
    check: Callable[..., bool | str],
    answer: Any,
    cases: tuple[tuple[int, ...], ...],
) -> bool | str:
    """True when ``check(answer, *args)`` is True on every rank, for each case
    ``(world_size, *args)``: the learner's function runs on real ranks. Otherwise
    the first rank's reason."""
    if not callable(answer):
        return f"the answer should be a function, but it is {type(answer).__name__}"
    from ..ranks.launcher import launch

    for world_size, *args in cases:
        result = launch(
            check, answer, *args, world_size=world_size, timeout=30, show="none"
        )
        for verdict in result.returns:
            if verdict is not True:
                return verdict  # the first rank's reason
    return True


def _accumulate(answer: Any) -> bool | str:
    # accumulate= counts backward passes: 8.0 is the right number in the wrong type,
    # which train() would refuse, so say that rather than only "not yet".
    if isinstance(answer, float) and answer.is_integer():
        return (
            f"accumulate= takes a whole number of micro-batches (an int), not {answer}"
        )
    return isinstance(answer, int) and not isinstance(answer, bool) and answer == 8


def _ring_all_reduce_function(answer: Any) -> bool | str:
    return _passes_on_ranks(_matches_all_reduce, answer, ((2, 6), (3, 7), (4, 16)))


def _bytes_function(answer: Any) -> bool | str:
    cases = [
        (1000, 4, 2),
        (25_557_032, 4, 8),
        (25_557_032, 2, 8),
        (10, 2, 1),
        (7, 4, 3),
    ]
    return first_wrong_case(
        answer, "ring_bytes", cases, lambda p, b, n: bus_factor(n) * p * b
    )


def _resume_function(answer: Any) -> bool:
    if not callable(answer):
        return False
    import tempfile
    from pathlib import Path

    import torch

    from ..training.checkpoint import save_checkpoint

    def fresh() -> tuple[Any, Any]:
        model = torch.nn.Linear(3, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ckpt.pt"
        model, opt = fresh()
        if answer(path, model, opt) != 0:  # no checkpoint yet: start at epoch 0
            return False
        torch.manual_seed(0)
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
        save_checkpoint(path, model, opt, epoch=4)
        other, other_opt = fresh()
        if answer(path, other, other_opt) != 5:
            return False
        momentum = other_opt.state_dict()["state"].get(0, {}).get("momentum_buffer")
        return torch.equal(other.weight, model.weight) and momentum is not None


def _placement_function(answer: Any) -> bool | str:
    cases = [(0, 4), (3, 4), (4, 4), (7, 4), (13, 8), (5, 1), (0, 1), (11, 2)]
    return first_wrong_case(
        answer,
        "placement",
        cases,
        divmod,
        lambda got, want: isinstance(got, (tuple, list)) and tuple(got) == want,
    )


def _ring_time_function(answer: Any) -> bool | str:
    cases = [
        (100e6, 2, 5e-6, 12.5e9),
        (100e6, 16, 5e-6, 12.5e9),
        (4096, 64, 2e-5, 1e9),
        (1e9, 8, 0.0, 25e9),
        (1000, 1, 1e-6, 1e9),
    ]
    return first_wrong_case(answer, "ring_time", cases, ring_all_reduce_time)


def _matches_row_split(
    row_parallel: Callable[..., Any], batch: int, d_in: int
) -> bool | str:
    # Runs inside each rank: the learner's row-split layer against the unsplit one.
    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)  # the same full layer and input on every rank
    x = torch.randn(batch, d_in, generator=g)
    weight = torch.randn(3, d_in, generator=g)
    bias = torch.randn(3, generator=g)
    expected = x @ weight.T + bias
    k = d_in // world_size
    mine = slice(rank * k, (rank + 1) * k)
    got = row_parallel(x[:, mine].clone(), weight[:, mine].clone(), bias.clone())
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        shape = (
            tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        )
        return (
            f"on {world_size} ranks, rank {rank} returned {shape}, not a tensor of "
            f"shape {tuple(expected.shape)}"
        )
    if not torch.allclose(got, expected, atol=1e-5):
        worst = (got - expected).abs().max().item()
        return (
            f"on {world_size} ranks, rank {rank}'s output is off by up to {worst:.3g} "
            "from x @ weight.T + bias"
        )
    return True


def _row_split_function(answer: Any) -> bool | str:
    # (world_size, batch, d_in): 8 input features cut in 2 and in 4
    return _passes_on_ranks(_matches_row_split, answer, ((2, 4, 8), (4, 4, 8)))


def _server_bytes_function(answer: Any) -> bool | str:
    cases = [(8, 4e6), (2, 1000), (1, 4), (64, 25_557_032 * 4)]
    return first_wrong_case(answer, "server_bytes", cases, lambda w, b: 2 * w * b)


EXERCISES: dict[str, Exercise] = {
    "01.dp": Exercise(
        "(samples per GPU, copies of the weights during the forward pass) when "
        "DataParallel on 4 GPUs gets a batch of 256",
        lambda a: tuple(a) == (64, 4) if isinstance(a, (tuple, list)) else False,
        "scatter splits the batch evenly; replicate puts one copy of the model on "
        "every device",
    ),
    "01.bubble": Exercise(
        "a function bubble(stages, micro_batches) giving the idle fraction of a "
        "pipeline (all forwards, then all backwards)",
        _bubble_function,
        "count the time steps of one pass: micro_batches + stages - 1; each stage is "
        "busy for micro_batches of them",
    ),
    "01.accumulate": Exercise(
        "accumulate= for micro-batches of 16 to give the gradient of a batch of 128",
        _accumulate,
        "each optimizer step should have seen 128 samples in total",
    ),
    "02.ring": Exercise(
        "a function ring_all_reduce(tensor) that returns the sum over all ranks, "
        "using only sends and receives between neighbours",
        _ring_all_reduce_function,
        "cut the tensor in world_size chunks; N-1 steps of pass-one-chunk-right-and-"
        "add, then N-1 steps of pass-the-finished-chunk-right",
    ),
    "02.bytes": Exercise(
        "a function ring_bytes(parameters, bytes_per_value, world_size) giving the "
        "bytes each rank sends when DDP all-reduces the gradients once with a ring",
        _bytes_function,
        "the gradient is parameters x bytes_per_value bytes; a ring sends 2(N-1)/N of "
        "it from every rank (and nothing at all when N = 1)",
    ),
    "02.resume": Exercise(
        "a function resume(path, model, optimizer) that loads the checkpoint at path "
        "if there is one and returns the epoch to start from (0 without one)",
        _resume_function,
        "check Path(path).exists(); load_checkpoint returns the extra values saved, "
        "e.g. {'epoch': 4}: the next epoch to run is one after it",
    ),
    "03.placement": Exercise(
        "a function placement(rank, ranks_per_node) giving (node_rank, local_rank) "
        "when a launcher fills each node before the next, as torchrun and srun do",
        _placement_function,
        "rank = node_rank * ranks_per_node + local_rank: divide, and keep the rest",
    ),
    "03.ring_time": Exercise(
        "a function ring_time(size, world_size, alpha, beta) giving the seconds of a "
        "ring all-reduce of size bytes: 2(N-1) steps of latency alpha, and 2(N-1)/N "
        "of the data through a link of beta bytes/s",
        _ring_time_function,
        "add the two terms: 2 * (world_size - 1) * alpha, and "
        "2 * (world_size - 1) / world_size * size / beta (both 0 on one rank)",
    ),
    "04.row_split": Exercise(
        "a function row_parallel(x_part, weight_part, bias) that every rank calls with "
        "its slice of the input's features and the matching columns of the weight, and "
        "that returns the full output x @ weight.T + bias on every rank",
        _row_split_function,
        "each rank's x_part @ weight_part.T is a partial sum of the output: add them "
        "over the ranks with dist.all_reduce, then add the bias once",
    ),
    "04.server_bytes": Exercise(
        "a function server_bytes(workers, parameter_bytes) giving the bytes that pass "
        "through the parameter server (in and out together) in one synchronous step",
        _server_bytes_function,
        "every worker pushes a whole gradient (parameter_bytes) and pulls the whole "
        "parameter vector back",
    ),
    "04.bubble": Exercise(
        "the idle fraction of a GPipe pipeline of 4 stages and 8 micro-batches",
        close(3 / 11),
        "(stages - 1) / (micro_batches + stages - 1)",
    ),
    "01.speedup": Exercise(
        "speed-up of 4 GPUs over 1 for a step of 6 ms fixed cost plus 2 ms of "
        "per-sample work, the batch split 4 ways",
        close(8 / 6.5),
        "only the per-sample part shrinks: 2 ms becomes 0.5 ms; the 6 ms stay",
    ),
}

# Notebook 05's exercises live in a module of their own,
EXERCISES.update((name, Exercise(*spec)) for name, spec in CLUSTER_EXERCISES.items())
# and so do notebook 04's planner exercises (section 8).
EXERCISES.update((name, Exercise(*spec)) for name, spec in PLAN_EXERCISES.items())


def check(name: str, answer: Any) -> None:
    """Say whether ``answer`` solves exercise ``name``; print a hint if it does not.

    Returns nothing, so a notebook cell shows the verdict alone; :func:`judge` gives
    the same verdict as a bool.

    Args:
        name: the exercise, e.g. "01.bubble".
        answer: your answer (a number, a tuple, or a function, as the exercise asks).

    Raises:
        KeyError: no exercise of that name (the message lists them).

    Example:
        >>> check("01.accumulate", 8)
        Right: 01.accumulate
    """
    judge(name, answer)


def judge(name: str, answer: Any) -> bool:
    """Print the verdict on ``answer`` to exercise ``name`` and return it (True when
    right); see :func:`check`."""
    if name not in EXERCISES:
        raise KeyError(
            f"no exercise named {name!r}; the exercises are "
            + ", ".join(repr(n) for n in EXERCISES)
        )
    exercise = EXERCISES[name]
    try:
        verdict = exercise.judge(answer)
    except Exception as exc:  # a learner's function may raise: that is an answer too
        verdict = f"It raised {type(exc).__name__}: {exc}"
    if verdict is True:
        print(f"Right: {name}")
        return True
    lines = [f"Not yet: {name}."]
    if isinstance(verdict, str):
        lines.append(_sentence(verdict))
    lines += [
        _sentence(f"It wants {exercise.question}"),
        _sentence(f"Hint: {exercise.hint}"),
    ]
    # Wrapped so the verdict reads whole in a narrow notebook column; a message of
    # several lines (a launch's timeout report) keeps its own lines.
    print(
        "\n".join(
            textwrap.fill(part, 88, subsequent_indent="  ") if len(part) > 88 else part
            for line in lines
            for part in line.splitlines()
        )
    )
    return False


def _sentence(text: str) -> str:
    return text if text.rstrip().endswith((".", "?", "!")) else text + "."
