"""The slow tests of test_job.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: real jobs on ranks."""

from __future__ import annotations

import pytest
from conftest import needs_private_slurm
from test_job import CPU, DP_PP, DP_TP

from workshop.planner.job import (
    job_against_estimate,
    job_figures,
    job_rows,
    write_job,
)


# --- the job, on the private two-node cluster ---------------------------------------
def _holds_the_estimate(figures, layout):
    """Parameters and gradients to the byte; the optimizer state plus Adam's 4-byte
    step counter per parameter tensor (the estimate leaves them out); activations
    (measured outside a pipeline) plus the cross-entropy's 4-byte total_weight; every
    collective of the estimate, calls and bytes, and no other (a pipeline's receives
    set apart: the estimate counts sends)."""
    assert len(figures) == 4 and [f["node"] for f in figures] == [0, 0, 1, 1]
    for row in job_rows(figures):
        guess, seen = row["estimate"], row["measured"]
        if row["term"] == "activations" and layout.pp > 1:
            assert seen is None
            continue
        if isinstance(guess, int):
            assert seen - guess == row["explained"], row
        else:
            assert seen == guess, row
    table = job_against_estimate(figures)
    assert "DIFFERENT" not in table and "unexplained" not in table, table
    assert all(len(line) <= 88 for line in table.splitlines())
    return table


@pytest.fixture(scope="module")
def ran(private_slurm, tmp_path_factory):
    """Both layouts written and submitted to the two nodes (one job each, queued
    together), then waited for: ``{name: (job, figures or the job's output)}``."""
    from workshop.cluster import submit

    jobs = {}
    for name, layout in (("dp-tp", DP_TP), ("dp-pp", DP_PP)):
        job = write_job("tiny", layout, tmp_path_factory.mktemp(name), **CPU)
        jobs[name] = (job, submit(job.script, output_dir=job.folder))
    done = {}
    for name, (job, run) in jobs.items():
        status = run.wait(timeout=240, poll=0.3, show=False)
        assert status.state == "COMPLETED", run.output()
        done[name] = (job, job_figures(job), run.output())
    return done


@needs_private_slurm
def test_a_dp_x_tp_job_holds_and_sends_what_the_estimate_says(ran):
    _, figures, output = ran["dp-tp"]
    assert "2 nodes (127.0.0.[2-3]), 2 ranks per node" in output
    assert {f["how"] for f in figures} == {
        "DTensor tensor parallel over 2; FSDP2 fully_shard over 2"
    }
    assert {f["backend"] for f in figures} == {"gloo"}
    table = _holds_the_estimate(figures, DP_TP)
    assert table.splitlines()[1] == (
        "ranks 0, 1, 2, 3: DTensor tensor parallel over 2; FSDP2 fully_shard over 2"
    )
    assert {tuple(f["collectives"]) for f in figures} == {
        ("all_gather dp", "all_reduce tp", "reduce_scatter dp")
    }


@needs_private_slurm
def test_a_dp_x_pp_job_holds_and_sends_what_the_estimate_says(ran):
    _, figures, _ = ran["dp-pp"]
    assert [f["stage"] for f in figures] == [0, 0, 1, 1]
    table = _holds_the_estimate(figures, DP_PP)
    assert "ranks 2, 3: stage 1 of 2; DDP over 2" in table
    assert table.endswith("weights after the steps: yes"), table
    for fig in figures:  # one activation on or one gradient back, one received
        assert fig["collectives"]["send_recv pp"][0] == 1
        assert fig["collectives"]["recv pp"][0] == 1
