"""Notebook 04 (beyond data parallelism): its exercises, checked with
``workshop.check("04.row_split", answer)``, and the questions of its closing quiz,
shown by ``workshop.quiz("04")``; the planner's exercises (section 8) are in
:mod:`~workshop.lessons.notebook04_planner`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .judges import Exercise, close, first_wrong_case, passes_on_ranks
from .questions import question

__all__ = ["EXERCISES", "QUESTIONS", "QUIZ"]


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
    return passes_on_ranks(_matches_row_split, answer, ((2, 4, 8), (4, 4, 8)))


def _server_bytes_function(answer: Any) -> bool | str:
    cases = [(8, 4e6), (2, 1000), (1, 4), (64, 25_557_032 * 4)]
    return first_wrong_case(answer, "server_bytes", cases, lambda w, b: 2 * w * b)


EXERCISES: dict[str, Exercise] = {
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
}

QUESTIONS = (
    question(
        "An MLP block fc2(gelu(fc1(x))) is split with fc1 cut by columns and fc2 by "
        "rows. What crosses the network in its forward pass?",
        "GELU",
        "b",
        (
            "An all-gather after fc1, then an all-reduce after fc2",
            "fc1's slices need no joining: each rank applies GELU to its own slice and "
            "feeds it to its own rows of fc2.",
        ),
        (
            "One all-reduce of fc2's partial outputs",
            "GELU acts on each number alone, so the hidden slices stay put; only fc2's "
            "partial sums are added.",
        ),
        (
            "Every weight's gradient, once per step",
            "That is data parallelism; tensor parallelism moves activations, in every "
            "layer.",
        ),
        (
            "The activations, from rank r to rank r+1",
            "That is a pipeline, whose stages are whole layers.",
        ),
    ),
    question(
        "For the same p stages and m micro-batches, what does the 1F1B schedule "
        "change compared with GPipe?",
        "1F1B",
        "c",
        (
            "A smaller bubble, so fewer micro-batches are needed",
            "The bubble is the same, (p-1)/(m+p-1); what changes is memory.",
        ),
        (
            "The batch no longer needs cutting into micro-batches",
            "1F1B runs the same micro-batches; it changes only their order.",
        ),
        (
            "Stage 0 holds the activations of at most p micro-batches instead of m",
            "Each micro-batch's backward follows soon after its forward, which frees "
            "its activations.",
        ),
    ),
    question(
        "With fp32 weights and Adam, how many bytes per parameter does each rank keep "
        "under DDP, and under ZeRO stage 3 on N ranks?",
        "ZeRO",
        "c",
        (
            "4 under DDP, 4/N under stage 3",
            "Besides the 4-byte weight there are a 4-byte gradient and 8 bytes of "
            "Adam's two moments.",
        ),
        (
            "16 under both: ZeRO saves communication, not memory",
            "ZeRO shards what DDP replicates to save memory; stage 3 even costs more "
            "traffic, about 1.5 times DDP's.",
        ),
        (
            "16 under DDP, 16/N under stage 3",
            "4 for the weight, 4 for its gradient, 8 for Adam's state: stage 3 keeps "
            "1/N of all of it.",
        ),
    ),
    question(
        "Why did the ring all-reduce replace the parameter server for training on "
        "GPUs?",
        "parameter server",
        "a",
        (
            "A server's traffic grows with every worker; a ring rank's does not",
            "Every worker pushes a gradient and pulls the weights through one link; a "
            "ring rank sends under twice the gradient at any scale.",
        ),
        (
            "A parameter server ends with different weights",
            "The synchronous server and the all-reduce ended with the same weights "
            "in section 5.",
        ),
        (
            "A parameter server cannot run on GPUs",
            "Nothing stops it; the limit is the server's link, which every byte must "
            "cross.",
        ),
    ),
    question(
        "8 workers push their gradients to 2 parameter servers, each holding half "
        "of the parameters. How much does each server receive per step?",
        "W/S",
        "d",
        (
            "8 gradients' worth, as a single server would",
            "Each worker sends a server only the half that server holds: 8 halves, "
            "4 gradients.",
        ),
        (
            "2 gradients' worth: the workers are split between the servers",
            "Every worker talks to every server; it is the parameters that are split, "
            "not the workers.",
        ),
        (
            "1 gradient's worth, as much as each worker sends",
            "Only with S = W, a server per worker: that is the all-reduce itself.",
        ),
        (
            "4 gradients' worth: W/S",
            "Doc 004 weighs this workers-to-servers ratio; section 5 counted W/S "
            "gradients through each server.",
        ),
    ),
    question(
        "An asynchronous parameter server applies each gradient as soon as it "
        "arrives. What is the price?",
        "staleness",
        "b",
        (
            "Some gradients are dropped before the server applies them",
            "Every gradient is applied, once, as the run in section 5 showed.",
        ),
        (
            "Stale gradients, computed on weights changed since",
            "Nobody waits, but a slow worker's gradient arrives after other updates: "
            "its staleness.",
        ),
        (
            "Every step waits for the slowest worker",
            "That is the synchronous server; the asynchronous one removes the waiting.",
        ),
    ),
    question(
        "Which strategy belongs inside a node, on its fastest links?",
        "NVLink",
        "c",
        (
            "Data parallelism",
            "It all-reduces the gradients once per step, overlapped with backward, so "
            "it goes across nodes.",
        ),
        (
            "Pipeline parallelism",
            "A stage edge sends one tensor per micro-batch, point to point: that "
            "crosses nodes well.",
        ),
        (
            "Tensor parallelism",
            "Its all-reduces sit inside every layer's forward and backward, and "
            "nothing computes while they run.",
        ),
    ),
    question(
        "One process plays rank 5 of a 1,024-rank world on PyTorch's fake backend and "
        "shards an 8B-parameter model with fully_shard. What can it tell you?",
        "fake backend",
        "b",
        (
            "How long a step of the 1,024-GPU job takes",
            "Its collectives return at once and move nothing: no link is timed. The "
            "step time is the estimator's.",
        ),
        (
            "The bytes its shards hold and the collectives a step calls",
            "The sharding is PyTorch's own, so the shapes are real; only the contents "
            "are not, and CommDebugMode counts the calls.",
        ),
        (
            "Whether the loss still falls at that scale",
            "No data crosses between ranks, so the values it computes are not the "
            "real job's.",
        ),
        (
            "How fast NCCL's all-reduce runs across InfiniBand",
            "That needs the real network: read published bus bandwidths, or run "
            "nccl-tests on the cluster.",
        ),
    ),
)

#: The quiz that closes the notebook: its title and questions.
QUIZ = ("Beyond data parallelism", QUESTIONS)
