"""Notebook 03 (many nodes): its exercises, checked with
``workshop.check("03.placement", answer)``, and the questions of its closing quiz,
shown by ``workshop.quiz("03")``.
"""

from __future__ import annotations

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
