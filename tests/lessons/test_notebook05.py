"""Notebook 05's exercises: the notebook's solutions pass, typical wrong answers get
the first failing case and a hint. RIGHT_05 and WRONG_05 also feed the check of every
exercise in test_exercises.py."""

from __future__ import annotations

import pytest

from workshop.lessons.exercises import EXERCISES, judge
from workshop.lessons.notebook05 import EXERCISES as CLUSTER_EXERCISES
from workshop.lessons.notebook05 import WHERE_ITEMS
from workshop.training.profiling import recorded_steps


def to_purge(mtimes, now, days):
    """The notebook's solution to 05.purge."""
    return [name for name, t in mtimes.items() if now - t > days * 86_400]


def per_rank(sent_before, sent_after, world_size, size_bytes):
    """The notebook's solution to 05.counters."""
    measured = (sent_after - sent_before) / world_size
    model = 2 * (world_size - 1) / world_size * size_bytes
    return measured, model


def recorded(steps, wait, warmup, active, repeat):
    """The notebook's solution to 05.schedule."""
    cycle = wait + warmup + active
    return [
        s
        for s in range(steps)
        if s % cycle >= wait + warmup and (repeat == 0 or s // cycle < repeat)
    ]


RIGHT_05 = {
    "05.where": {
        "your virtual environment": "home",
        "the group dataset, packed": "project",
        "checkpoints of a running job": "scratch",
        "an unpacked copy for one job": "local",
    },
    "05.purge": to_purge,
    "05.counters": per_rank,
    "05.schedule": recorded,
}
WRONG_05 = {
    # the dataset on scratch, where the purge would take it
    "05.where": {**RIGHT_05["05.where"], "the group dataset, packed": "scratch"},
    # ">=": a file of exactly 60 days is not older than 60 days
    "05.purge": lambda m, now, days: [
        n for n, t in m.items() if now - t >= days * 86_400
    ],
    # forgets that loopback carries every rank's bytes
    "05.counters": lambda b, a, n, s: (a - b, 2 * (n - 1) / n * s),
    # forgets repeat: records every cycle
    "05.schedule": lambda steps, w, u, a, r: [
        s for s in range(steps) if s % (w + u + a) >= w + u
    ],
}
WHY_WRONG_05 = {
    "05.where": "'the group dataset, packed' is not best kept on 'scratch'.",
    "05.purge": "returned ['ckpt.pt']; it should be [].",
    "05.counters": "returned (32000000, 16000000.0); it should be (16000000, 16000000)",
    "05.schedule": "recorded(20, 2, 1, 2, 3) returned [3, 4, 8, 9, 13, 14, 18, 19]; "
    "it should be [3, 4, 8, 9, 13, 14].",
}


def test_the_exercises_are_registered_with_the_others():
    assert set(CLUSTER_EXERCISES) == set(RIGHT_05) == set(WRONG_05)
    assert all(name in EXERCISES for name in CLUSTER_EXERCISES)


@pytest.mark.parametrize("name", sorted(CLUSTER_EXERCISES))
def test_solutions_pass_and_wrong_answers_say_where(name, capsys):
    assert judge(name, RIGHT_05[name]) is True
    assert capsys.readouterr().out == f"Right: {name}\n"
    assert judge(name, WRONG_05[name]) is False
    out = capsys.readouterr().out
    assert out.startswith(f"Not yet: {name}.\n") and "\nHint: " in out
    assert WHY_WRONG_05[name] in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 88


def test_the_schedule_solution_is_the_packages():
    assert judge("05.schedule", lambda *a: recorded_steps(
        a[0], wait=a[1], warmup=a[2], active=a[3], repeat=a[4]))  # fmt: skip


def test_answers_of_the_wrong_shape_are_told_so(capsys):
    assert judge("05.where", ["home"]) is False
    assert "the answer should be a dict, but it is list" in capsys.readouterr().out
    partial = dict(list(WHERE_ITEMS.items())[:2])
    assert judge("05.where", partial) is False
    assert "the dict has no entry for 'checkpoints of a running job'" in (
        capsys.readouterr().out
    )
    assert (
        judge("05.where", {**RIGHT_05["05.where"], "your virtual environment": "/home"})
        is False
    )
    assert "'/home' is none of the file systems 'home'" in capsys.readouterr().out
    assert judge("05.purge", 60) is False
    assert "to_purge should be a function, but it is int 60" in capsys.readouterr().out
    assert judge("05.counters", lambda b, a, n, s: (a - b) / n) is False
    assert "it should be (16000000, 16000000)" in " ".join(
        capsys.readouterr().out.split()
    )
