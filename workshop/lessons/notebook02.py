"""Notebook 02 (distributed data parallel training): its exercises, checked with
``workshop.check("02.ring", answer)``, and the questions of its closing quiz, shown
by ``workshop.quiz("02")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..comm.costmodel import bus_factor
from ..training.checkpoint import save_checkpoint
from .judges import Exercise, first_wrong_case, passes_on_ranks
from .questions import question

__all__ = ["EXERCISES", "QUESTIONS", "QUIZ"]


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


def _ring_all_reduce_function(answer: Any) -> bool | str:
    return passes_on_ranks(_matches_all_reduce, answer, ((2, 6), (3, 7), (4, 16)))


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


EXERCISES: dict[str, Exercise] = {
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
}

QUESTIONS = (
    question(
        "Rank 0 has computed A = B*C and rank 1 D = E*F. Which one call leaves "
        "G = A*D on both ranks, and which kind of communication is it?",
        "collective computation",
        "c",
        (
            "dist.barrier(): synchronisation",
            "A barrier only makes the ranks wait for each other; no tensor moves "
            "and nothing is multiplied.",
        ),
        (
            "dist.broadcast(t, src=0): data movement",
            "Broadcast copies rank 0's A over rank 1's D: both end with A, and "
            "nobody has multiplied.",
        ),
        (
            "dist.all_reduce(t, op=ReduceOp.PRODUCT): collective computation",
            "It combines the ranks' tensors on the way (here by a product) and "
            "leaves the result on every rank.",
        ),
        (
            "dist.all_gather(out, t): collective computation",
            "all_gather moves the tensors unchanged, so it is data movement; each "
            "rank would still have to multiply.",
        ),
    ),
    question(
        "A ring all-reduce of a tensor of S bytes runs on N ranks. How many bytes "
        "does each rank send?",
        "2(N-1)/N",
        "a",
        (
            "2(N-1)/N * S",
            "2(N-1) steps of one chunk of S/N each: just under twice the tensor, "
            "whatever N.",
        ),
        (
            "(N-1) * S",
            "That is each rank sending its whole tensor to every other; the ring sends "
            "one chunk of S/N per step to one neighbour.",
        ),
        (
            "2 * (N-1) * S",
            "That sends the whole tensor in each of the 2(N-1) steps; each step sends "
            "one chunk, S/N.",
        ),
        (
            "S / N",
            "One chunk per step, but there are 2(N-1) steps: N-1 to reduce-scatter "
            "and N-1 to all-gather.",
        ),
    ),
    question(
        "You use a DistributedSampler but forget sampler.set_epoch(epoch). What "
        "happens?",
        "set_epoch",
        "b",
        (
            "Ranks read overlapping samples",
            "Each rank still gets its own share of the indices; only the order is "
            "affected.",
        ),
        (
            "Every epoch repeats the first epoch's order",
            "The sampler shuffles with seed + epoch; without set_epoch the epoch "
            "stays 0.",
        ),
        (
            "An error stops training at the second epoch",
            "Nothing complains: the mistake is silent, which is why workshop.train "
            "calls set_epoch for you.",
        ),
    ),
    question(
        "ResNet-50 has about 100 MB of gradients. Why does DDP, with its default "
        "bucket_cap_mb of 25, all-reduce them in one bucket more than 100 / 25?",
        "first bucket",
        "c",
        (
            "It all-reduces the weights of the first step in a bucket of their own",
            "DDP copies rank 0's weights once, when it wraps the model; the buckets "
            "hold only gradients.",
        ),
        (
            "It keeps one bucket spare for the optimizer's state",
            "The optimizer's state never travels: every rank steps its own optimizer "
            "with the same averaged gradients.",
        ),
        (
            "The first bucket has a cap of its own, 1 MiB",
            "So the last layers' gradients, ready first, start their all-reduce at "
            "once while backward goes on.",
        ),
        (
            "Each bucket holds gradients of one layer type only",
            "DDP fills buckets in backward order whatever the layer; only dtype and "
            "device keep gradients apart.",
        ),
    ),
    question(
        "Why does rank 0 write a checkpoint to a temporary file and then os.replace "
        "it over the old one?",
        "os.replace",
        "a",
        (
            "A job killed while writing leaves the previous checkpoint whole",
            "The rename happens in one step, so the file under the checkpoint's name "
            "is always complete.",
        ),
        (
            "It makes saving faster",
            "It writes the same bytes, and a rename besides: the point is safety, "
            "not speed.",
        ),
        (
            "So the other ranks can read the checkpoint while it is written",
            "The other ranks wait at a barrier until rank 0 is done; nobody reads a "
            "checkpoint being written.",
        ),
    ),
    question(
        "A DistributedSampler with its defaults deals 10 samples to 4 ranks. What "
        "does each rank read in one epoch?",
        "drop_last",
        "d",
        (
            "3 samples on ranks 0 and 1, 2 on ranks 2 and 3",
            "Unequal shares would give ranks unequal steps, and the rank with one "
            "more would wait in an all-reduce forever.",
        ),
        (
            "2 samples each; samples 8 and 9 are left out",
            "That is drop_last=True; by default the sampler pads the shares "
            "instead of dropping the tail.",
        ),
        (
            "Nothing: it raises an error, since 10 does not divide by 4",
            "The sampler never complains; it evens the shares out by itself.",
        ),
        (
            "3 samples each; two samples are read twice",
            "It pads to 12 by repeating the first indices, so every rank gets the "
            "same count.",
        ),
    ),
)

#: The quiz that closes the notebook: its title and questions.
QUIZ = ("Distributed data parallel training", QUESTIONS)
