"""The slow tests of test_calibrate.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the command, and a job on
the private cluster."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, clean_env, needs_private_slurm
from test_calibrate import TIMED, _within

from workshop.planner.calibration import (
    calibration_from,
    load_calibration,
)
from workshop.planner.job import job_figures, write_job
from workshop.planner.job_time import job_step_time, job_time_against_estimate
from workshop.planner.job_train import WARM_UP


# --- the command line -------------------------------------------------------------
def test_the_command_measures_prints_and_saves(tmp_path):
    out = tmp_path / "cal.json"
    done = subprocess.run(
        [sys.executable, "-m", "workshop.planner", "calibrate", "--quick",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("calibrated: ") and lines[-1] == f"saved {out}"
    assert all(len(line) <= 88 for line in lines[:-1])
    assert load_calibration(out).name == lines[0]


@needs_private_slurm
def test_the_calibrated_estimate_of_the_job_is_its_measured_step(
    private_slurm, tmp_path
):
    from workshop.cluster import submit

    # Each rank measures the machine just before its steps (calibrate=True), with
    # the threads it steps with and beside the other rank, as its steps will find
    # it: a busy shared machine slows both alike.
    job = write_job("tiny", TIMED, tmp_path, nodes=2, gpus_per_node=0,
                    ranks_per_node=1, steps=WARM_UP + 8, calibrate=True)  # fmt: skip
    run = submit(job.script, output_dir=job.folder)
    status = run.wait(timeout=300, poll=0.5, show=False)
    assert status.state == "COMPLETED", run.output()
    figures = job_figures(job)
    own = [calibration_from(f["calibration"], "rank") for f in figures]
    assert {f["threads"] for f in figures} == {c.threads for c in own} == {1}
    _within(job_step_time(figures), job_time_against_estimate(figures))


# A GPU job's group names a backend per device, "cpu:gloo,cuda:nccl" (an H200 run
# found its calibration refused for it). Here one of the same form on the CPU.
_COMPOUND_GROUP = """
import os, sys
import torch.distributed as dist
from workshop.planner.calibrating import calibrate_here
store = dist.FileStore(os.path.join(sys.argv[1], "store"), 1)
dist.init_process_group("cpu:gloo,cuda:gloo", store=store, rank=0, world_size=1)
print(dist.get_backend(), calibrate_here("tiny", "fp32", 64).allreduce_backend)
dist.destroy_process_group()
"""


def test_a_compound_group_is_recorded_as_its_all_reduce_backend(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _COMPOUND_GROUP, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu:gloo,cuda:gloo", "gloo"]
