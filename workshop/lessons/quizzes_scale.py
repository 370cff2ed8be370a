"""The closing quizzes of notebooks 03 (many nodes) and 04 (beyond data parallelism);
see :mod:`workshop.lessons.quizzes` for the form of a question."""

from __future__ import annotations

from .quizzes import Question, question

__all__ = ["QUIZZES_SCALE"]

QUIZ_03 = (
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

QUIZ_04 = (
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

QUIZZES_SCALE: dict[str, tuple[str, tuple[Question, ...]]] = {
    "03": ("Many nodes: torchrun, Open MPI and Slurm", QUIZ_03),
    "04": ("Beyond data parallelism", QUIZ_04),
}
