"""The closing quiz of notebook 05 (working on a cluster: data, monitoring, stuck
ranks); see :mod:`workshop.lessons.quizzes` for the form of a question."""

from __future__ import annotations

from .quizzes import Question, question

__all__ = ["QUIZZES_CLUSTER"]

QUIZ_05 = (
    question(
        "A data set of a million small image files on Lustre loads slowly. Why, and "
        "what helps most?",
        "metadata",
        "c",
        (
            "Too many bytes to read: compress the images further",
            "The same bytes in one large file read fast; the cost is per file, not "
            "per byte.",
        ),
        (
            "Too few loader workers: start more of them",
            "Workers open the same files, only in parallel: every open still asks the "
            "one shared metadata server.",
        ),
        (
            "Too many files: pack them into a few large ones",
            "Every open asks the one shared metadata server; a few large files cost a "
            "few requests, then stream.",
        ),
    ),
    question(
        "A job on Graham wrote its checkpoints to /scratch. You come back three "
        "months later to resume it. What do you find?",
        "purge",
        "b",
        (
            "The checkpoints, restored from the nightly backup if a disk failed",
            "Graham's scratch is not backed up; only home and project are.",
        ),
        (
            "Perhaps nothing: scratch purges files older than 60 days",
            "Scratch is for running jobs; copy what you keep to project before the "
            "purge reaches it.",
        ),
        (
            "The checkpoints, moved to /project when they aged",
            "No file system moves your files for you: a purge deletes them.",
        ),
    ),
    question(
        "Why copy the packed data set to $SLURM_TMPDIR at the start of a job?",
        "SLURM_TMPDIR",
        "b",
        (
            "Files there are kept after the job, safe from scratch purging",
            "$SLURM_TMPDIR is deleted when the job ends; keep the master copy in "
            "project storage.",
        ),
        (
            "Reading from it never touches the shared file system",
            "It is the node's own disk: one sequential copy in, then every epoch reads "
            "locally.",
        ),
        (
            "All nodes of the job then share one copy",
            "It is local to each node: on several nodes, each node copies its own.",
        ),
    ),
    question(
        "nvidia-smi dmon shows a GPU busy only 30% of the time, with gaps between "
        "steps. What is the likely cause?",
        "utilisation",
        "d",
        (
            "The GPU is too slow for this model: ask for a newer, faster one",
            "A faster GPU would wait even longer for the same input.",
        ),
        (
            "The model is too large for the GPU's memory",
            "A model too large fails with out of memory; a heavy model keeps the GPU "
            "busy.",
        ),
        (
            "nvidia-smi dmon itself slows the GPU down",
            "Sampling counters once a second costs next to nothing.",
        ),
        (
            "The GPU waits for data: add DataLoader workers, pin memory",
            "Gaps between steps mean a data-starved GPU: more num_workers and "
            "pin_memory=True feed it faster.",
        ),
    ),
    question(
        "One rank of four never reaches an all_reduce that the other three call. "
        "What do the other three do?",
        "timeout",
        "a",
        (
            "They wait until the process group's timeout, then fail",
            "A collective needs every rank; the error then appears on the ranks that "
            "waited, not on the culprit.",
        ),
        (
            "They fail at once with an error naming the missing rank",
            "No rank can know that another will never come: they wait, and the error "
            "says that a rank did not come, not which.",
        ),
        (
            "They finish the all_reduce among the three of them",
            "A collective involves every rank of its group, so it cannot finish "
            "without the fourth.",
        ),
    ),
    question(
        "A job hangs. How do you see the line of code where each rank is stuck?",
        "py-spy",
        "c",
        (
            "nvidia-smi on each node shows what each GPU runs",
            "It shows utilisation and memory per GPU, not which line of Python a "
            "process runs.",
        ),
        (
            "sacct shows the job's exit code and state",
            "A hung job has not exited, so there is no exit code yet.",
        ),
        (
            "py-spy dump --pid PID, on each rank",
            "It prints each rank's Python stack (so does faulthandler): the odd one "
            "out is the culprit.",
        ),
        (
            "export TORCH_DISTRIBUTED_DEBUG=DETAIL in your shell",
            "It makes the ranks compare each collective's operation and shapes, if set "
            "before the job starts; it shows no stacks.",
        ),
    ),
)

QUIZZES_CLUSTER: dict[str, tuple[str, tuple[Question, ...]]] = {
    "05": ("Working on a cluster: data, monitoring, stuck ranks", QUIZ_05),
}
