"""Notebook 05 (working on a cluster): its exercises, checked with
``workshop.check("05.purge", answer)``, and the questions of its closing quiz, shown
by ``workshop.quiz("05")``.

Each entry is (what the exercise wants, its judge, a hint): the fields of
:class:`workshop.lessons.judges.Exercise`; its function judges are
:func:`~workshop.lessons.judges.first_wrong_case`, as the other notebooks' are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..comm.costmodel import bus_factor
from ..training.profiling import recorded_steps
from .judges import Exercise, first_wrong_case
from .questions import question

__all__ = ["EXERCISES", "FILE_SYSTEMS", "QUESTIONS", "QUIZ", "WHERE_ITEMS"]

_DAY = 86_400.0


def _purge_expected(mtimes: dict[str, float], now: float, days: float) -> list[str]:
    return sorted(name for name, t in mtimes.items() if now - t > days * _DAY)


def _purge_function(answer: Any) -> bool | str:
    now = 1_800_000_000.0
    cases = [
        ({"a.log": now - 90 * _DAY, "b.log": now - _DAY}, now, 60),
        ({"ckpt.pt": now - 60 * _DAY}, now, 60),  # exactly 60 days: not older
        ({"ckpt.pt": now - 60 * _DAY - 1}, now, 60),  # one second more: older
        ({"x": now - 10.5 * _DAY, "y": now - 9.5 * _DAY, "z": now}, now, 10),
        ({}, now, 60),
        ({"new": now - 5, "old": now - 3 * _DAY}, now, 0),
    ]

    def same(got: Any, want: list[str]) -> bool:
        return isinstance(got, (list, tuple, set)) and sorted(got) == want

    return first_wrong_case(answer, "to_purge", cases, _purge_expected, same)


def _counters_expected(
    before: float, after: float, world_size: int, size_bytes: float
) -> tuple[float, float]:
    pair = (after - before) / world_size, bus_factor(world_size) * size_bytes
    # Whole numbers shown without ".0" when a wrong answer is compared with them.
    return tuple(int(v) if float(v).is_integer() else v for v in pair)


def _counters_function(answer: Any) -> bool | str:
    cases = [
        (1_000, 32_001_000, 2, 16e6),
        (5_000, 96_005_000, 4, 16e6),
        (0, 56_000_000, 8, 4e6),
        (123, 123, 3, 1e6),
    ]

    def same(got: Any, want: tuple[float, float]) -> bool:
        return (
            isinstance(got, (tuple, list))
            and len(got) == 2
            and all(isinstance(g, (int, float)) for g in got)
            and all(
                math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want, strict=True)
            )
        )

    return first_wrong_case(answer, "per_rank", cases, _counters_expected, same)


def _schedule_expected(
    steps: int, wait: int, warmup: int, active: int, repeat: int
) -> list[int]:
    return recorded_steps(steps, wait=wait, warmup=warmup, active=active, repeat=repeat)


def _schedule_function(answer: Any) -> bool | str:
    cases = [
        (12, 1, 1, 3, 2),
        (12, 1, 1, 3, 0),
        (10, 0, 0, 2, 0),
        (20, 2, 1, 2, 3),
        (4, 1, 1, 3, 1),  # the loop ends inside the first recording
        (30, 5, 2, 1, 1),
    ]

    def same(got: Any, want: list[int]) -> bool:
        return isinstance(got, (list, tuple)) and list(got) == want

    return first_wrong_case(answer, "recorded", cases, _schedule_expected, same)


#: The file systems a learner may name in "05.where", and the items to place.
FILE_SYSTEMS = ("home", "project", "scratch", "local")
WHERE_ITEMS = {
    "your virtual environment": "home",
    "the group dataset, packed": "project",
    "checkpoints of a running job": "scratch",
    "an unpacked copy for one job": "local",
}


def _where(answer: Any) -> bool | str:
    if not isinstance(answer, dict):
        return f"the answer should be a dict, but it is {type(answer).__name__}"
    missing = [item for item in WHERE_ITEMS if item not in answer]
    if missing:
        return f"the dict has no entry for {missing[0]!r}"
    for item, right in WHERE_ITEMS.items():
        given = answer[item]
        if given not in FILE_SYSTEMS:
            return (
                f"{item!r}: {given!r} is none of the file systems "
                f"{', '.join(map(repr, FILE_SYSTEMS))}"
            )
        if given != right:
            return f"{item!r} is not best kept on {given!r}"
    return True


_SPECS: dict[str, tuple[str, Callable[[Any], bool | str], str]] = {
    "05.where": (
        "a dict that puts each of the four items on 'home', 'project', 'scratch' or "
        "'local' (the node's disk, $SLURM_TMPDIR)",
        _where,
        "small and kept: home; large and kept: project; large and temporary: "
        "scratch (purged); needed by one job only: the node's own disk",
    ),
    "05.purge": (
        "a function to_purge(mtimes, now, days) giving the names, among mtimes "
        "(name -> modification time in seconds), of the files older than days days "
        "at now",
        _purge_function,
        "a file's age in seconds is now - mtime; a day is 86,400 s; older than "
        "means strictly more",
    ),
    "05.counters": (
        "a function per_rank(sent_before, sent_after, world_size, size_bytes) giving "
        "(bytes each rank sent, by the counters; bytes the ring model says), for one "
        "all-reduce of size_bytes by world_size ranks on one machine",
        _counters_function,
        "on one machine the interface carries every rank's bytes: divide the "
        "difference by world_size; the ring sends 2(N-1)/N of the tensor per rank",
    ),
    "05.schedule": (
        "a function recorded(steps, wait, warmup, active, repeat) listing the steps "
        "(0 to steps-1) that torch.profiler.schedule records",
        _schedule_function,
        "a cycle is wait + warmup + active steps and only its last active ones are "
        "recorded; with repeat > 0, no step after repeat cycles is",
    ),
}
EXERCISES = {name: Exercise(*spec) for name, spec in _SPECS.items()}

QUESTIONS = (
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

#: The quiz that closes the notebook: its title and questions.
QUIZ = ("Working on a cluster: data, monitoring, stuck ranks", QUESTIONS)
