"""Notebook 03 (many nodes): its exercises, checked with
``workshop.check("03.placement", answer)``, and the questions of its closing quiz,
shown by ``workshop.quiz("03")``.

The exercises, in the notebook's order: where a rank runs (03 §3), the local rank
under either launcher (03 §4), the ranks and threads of a hybrid MPI job (03 §6),
efficiency from measured figures (03 §7) and the ring model (03 §8).
"""

from __future__ import annotations

import math
from typing import Any

from ..comm.costmodel import ring_all_reduce_time
from .judges import Exercise, first_wrong_case
from .questions import question

__all__ = ["EXERCISES", "QUESTIONS", "QUIZ"]


def _placement_function(answer: Any) -> bool | str:
    cases = [(0, 4), (3, 4), (4, 4), (7, 4), (13, 8), (5, 1), (0, 1), (11, 2)]
    return first_wrong_case(
        answer,
        "placement",
        cases,
        divmod,
        lambda got, want: isinstance(got, (tuple, list)) and tuple(got) == want,
    )


def _local_rank_expected(argv: list[str], environ: dict[str, str]) -> int:
    if "LOCAL_RANK" in environ:  # torchrun, and torch.distributed.launch --use-env
        return int(environ["LOCAL_RANK"])
    for word in argv:  # torch.distributed.launch: --local-rank=N (before 2.0: _)
        if word.startswith(("--local-rank=", "--local_rank=")):
            return int(word.split("=", 1)[1])
    return 0  # one process, started by plain python


def _local_rank_function(answer: Any) -> bool | str:
    cases = [
        ([], {"LOCAL_RANK": "3"}),
        (["--local-rank=1", "--epochs", "1"], {}),
        (["--epochs", "2", "--local_rank=2"], {}),
        (["--epochs", "2"], {}),
        (["--local-rank=1"], {"LOCAL_RANK": "1"}),
        (["--local-rank=11"], {}),
        (["--checkpoint", "run.pt"], {"LOCAL_RANK": "0", "RANK": "6"}),
    ]
    return first_wrong_case(
        answer,
        "local_rank",
        cases,
        _local_rank_expected,
        lambda got, want: type(got) is int and got == want,
    )


def _hybrid_expected(
    nodes: int, cores_per_node: int, gpus_per_node: int
) -> tuple[int, int, int]:
    # One rank per GPU, each bound to an equal share of its node's cores.
    return nodes * gpus_per_node, gpus_per_node, cores_per_node // gpus_per_node


def _hybrid_function(answer: Any) -> bool | str:
    cases = [
        (4, 32, 2),  # Graham's P100 nodes [doc 004]: the slides' 16 cores per rank
        (1, 2, 2),  # this machine's 2 cores, 2 ranks
        (2, 28, 8),  # Graham's V100 nodes: 3.5 cores per GPU, so 3 (4 left idle)
        (3, 48, 4),
        (1, 16, 1),
    ]
    return first_wrong_case(
        answer,
        "hybrid",
        cases,
        _hybrid_expected,
        lambda got, want: (
            isinstance(got, (tuple, list))
            and all(type(g) is int for g in got)
            and tuple(got) == want
        ),
    )


def _efficiency_expected(points: list[tuple[int, float]], is_time: bool) -> list[float]:
    (n0, v0) = points[0]
    speedups = [v0 / v if is_time else v / v0 for _, v in points]
    # Rounded, so that a wrong answer is shown beside four digits, not sixteen.
    return [round(s / (n / n0), 4) for s, (n, _) in zip(speedups, points, strict=True)]


def _efficiency_function(answer: Any) -> bool | str:
    cases = [
        ([(1, 100.0), (2, 150.0)], False),
        ([(1, 60.0), (4, 20.0)], True),
        # W. Guan's Horovod table (images/s from 2 GPUs on) and MNIST on V100s
        # (seconds), both of doc 004, and this workshop's SmallCNN (samples/s).
        ([(2, 322.93), (4, 629.01), (64, 9318.2)], False),
        ([(1, 2791.0), (2, 1246.0), (8, 714.0)], True),
        ([(1, 1208.0), (2, 1192.0)], False),
        ([(8, 1000.0)], False),
    ]

    def same(got: Any, want: list[float]) -> bool:
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(want)
            and all(isinstance(g, (int, float)) for g in got)
            and all(
                math.isclose(g, w, abs_tol=1e-4) for g, w in zip(got, want, strict=True)
            )
        )

    return first_wrong_case(answer, "efficiency", cases, _efficiency_expected, same)


def _ring_time_function(answer: Any) -> bool | str:
    cases = [
        (100e6, 2, 5e-6, 12.5e9),
        (100e6, 16, 5e-6, 12.5e9),
        (4096, 64, 2e-5, 1e9),
        (1e9, 8, 0.0, 25e9),
        (1000, 1, 1e-6, 1e9),
    ]
    return first_wrong_case(answer, "ring_time", cases, ring_all_reduce_time)


EXERCISES: dict[str, Exercise] = {
    "03.placement": Exercise(
        "a function placement(rank, ranks_per_node) giving (node_rank, local_rank) "
        "when a launcher fills each node before the next, as torchrun and srun do",
        _placement_function,
        "rank = node_rank * ranks_per_node + local_rank: divide, and keep the rest",
    ),
    "03.local_rank": Exercise(
        "a function local_rank(argv, environ) giving the local rank as an int: "
        "LOCAL_RANK from environ where it is set (torchrun), else N of a "
        "--local-rank=N or --local_rank=N in argv (torch.distributed.launch), else 0",
        _local_rank_function,
        "look in environ first; then for a word of argv that starts with "
        "'--local-rank=' or '--local_rank=', and take int() of what follows the '='",
    ),
    "03.hybrid": Exercise(
        "a function hybrid(nodes, cores_per_node, gpus_per_node) giving (np, "
        "ranks_per_node, pe) for mpirun -np np --map-by ppr:ranks_per_node:node:PE=pe: "
        "one rank per GPU, each bound to an equal share of its node's whole cores",
        _hybrid_function,
        "a rank per GPU on every node; cores per rank = cores_per_node // "
        "gpus_per_node (whole cores: // leaves the rest idle)",
    ),
    "03.efficiency": Exercise(
        "a function efficiency(points, is_time) giving, for measured (count, value) "
        "pairs, the efficiency of each against the first: speed-up / (count / first "
        "count), the speed-up a ratio of rates, or of times (is_time) the other way up",
        _efficiency_function,
        "speed-up = value / first value for a rate, first value / value for a "
        "time; then divide by count / first count, not by count",
    ),
    "03.ring_time": Exercise(
        "a function ring_time(size, world_size, alpha, beta) giving the seconds of a "
        "ring all-reduce of size bytes: 2(N-1) steps of latency alpha, and 2(N-1)/N "
        "of the data through a link of beta bytes/s",
        _ring_time_function,
        "add the two terms: 2 * (world_size - 1) * alpha, and "
        "2 * (world_size - 1) / world_size * size / beta (both 0 on one rank)",
    ),
}

QUESTIONS = (
    question(
        "How do you start one training job on two nodes with torchrun?",
        "rdzv_endpoint",
        "b",
        (
            "Once, on the first node, with --nnodes=2: it reaches the other node",
            "torchrun starts ranks only on its own node; the other node's ranks need "
            "a torchrun there too.",
        ),
        (
            "On both nodes, the same command with one --rdzv_endpoint",
            "With --nnodes=2 and the same --rdzv_id, the two agents meet there, number "
            "the nodes, and each starts its own ranks.",
        ),
        (
            "On each node, with --standalone",
            "--standalone hosts a private rendezvous on each node: two separate jobs "
            "that never meet.",
        ),
    ),
    question(
        "You hand Slurm a batch script with sbatch. What does Slurm call the piece "
        "of work it then queues and schedules?",
        "job",
        "c",
        (
            "A task",
            "A task is one process of the job (srun starts one per rank); the job "
            "holds them all.",
        ),
        (
            "A job step",
            "Each srun inside the running job is a step; what sbatch queued is the "
            "job around them.",
        ),
        (
            "A job",
            "What users submit to a cluster is a job: the term the quiz of Alves's "
            "chapter asks for (doc 002).",
        ),
        (
            "A process",
            "Slurm starts processes for you, but it queues, schedules and accounts "
            "for jobs.",
        ),
    ),
    question(
        "A rank dies in a torchrun job started with --max_restarts=1. What happens "
        "next?",
        "max_restarts",
        "a",
        (
            "torchrun restarts the whole group, which resumes from its checkpoint",
            "Restarts are of the whole group, and the checkpoint makes the result "
            "equal to an unbroken run.",
        ),
        (
            "torchrun starts a new rank in place of the dead one; the others go on",
            "torchrun cannot replace one rank inside a running process group.",
        ),
        (
            "The other ranks finish the epoch without it",
            "A collective cannot finish without every rank: the others fail too.",
        ),
    ),
    question(
        "What does mpirun do for a PyTorch job?",
        "mpirun",
        "b",
        (
            "It carries the tensors between the ranks, instead of NCCL or gloo",
            "The ranks still talk through NCCL or gloo, as in Alves's chapter: Open "
            "MPI launches, NCCL communicates (doc 002).",
        ),
        (
            "It starts and numbers the ranks; nothing more",
            "It sets OMPI_COMM_WORLD_RANK and friends; you pass MASTER_ADDR and "
            "MASTER_PORT to every rank with -x.",
        ),
        (
            "It runs a c10d rendezvous for the ranks, as torchrun does",
            "Open MPI knows nothing of PyTorch's rendezvous; that is why you pass the "
            "address yourself.",
        ),
    ),
    question(
        "What are the two main tasks of a workload manager such as Slurm?",
        "workload manager",
        "a",
        (
            "Managing the cluster's resources and scheduling the jobs",
            "It tracks free nodes, cores, GPUs and memory, and decides which job runs "
            "where and when (Alves, doc 002).",
        ),
        (
            "Starting the ranks and carrying their tensors",
            "Starting ranks is a launcher's work (srun, mpirun, torchrun); NCCL or "
            "gloo carries the tensors.",
        ),
        (
            "Allocating memory to threads and scheduling the threads on cores",
            "That is each node's operating system; Slurm decides for whole jobs, "
            "which nodes and cores they get.",
        ),
    ),
    question(
        "In weak scaling across nodes, what mostly decides the efficiency?",
        "weak scaling",
        "c",
        (
            "The number of GPUs, because each rank sends more bytes as N grows",
            "A ring rank sends 2(N-1)/N of the gradient, which tends to twice the "
            "gradient; only the latency term grows with N.",
        ),
        (
            "The compute time per step, which grows with N",
            "Weak scaling keeps the batch per rank, so each step's compute time stays "
            "the same.",
        ),
        (
            "The network: its bandwidth, and how well backward hides it",
            "The all-reduce's bytes per link stay near twice the gradient; how fast "
            "they move, and how much overlaps backward, sets the efficiency.",
        ),
    ),
)

#: The quiz that closes the notebook: its title and questions.
QUIZ = ("Many nodes: torchrun, Open MPI and Slurm", QUESTIONS)
