"""The slow tests of test_slurm.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: jobs on the private Slurm
cluster, and the cluster's own start and stop."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from conftest import ROOT, clean_env, needs_private_slurm
from test_slurm import CPU_NODE

from workshop.bench.scaling_plots import load_scaling, plot_scaling
from workshop.cluster import slurm as slurm_module
from workshop.cluster import slurm_watchdog
from workshop.cluster.slurm import submit
from workshop.cluster.slurm_here import slurm_cluster
from workshop.cluster.slurm_status import (
    format_seconds,
)
from workshop.env import choose_backend

# What two ranks on one node of the private cluster pick ("auto"): gloo on a CPU
# machine or a one-GPU node, NCCL where the node has a GPU for each.
BACKEND_2 = choose_backend("auto", 2)


def _started(launcher: str, attempt: int) -> str:
    """The line slurm/train_ddp.py prints first, for 2 ranks on 1 node."""
    return (
        f"2 ranks on 1 node(s), started by {launcher}, backend {BACKEND_2}, "
        f"attempt {attempt}"
    )


PYTHON = sys.executable


def _pgrep(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def _left_behind(
    folder: Path, marker: str | None = None, within: float = 20, daemons: bool = True
) -> list:
    """Processes of the private cluster in ``folder`` (its daemons and watchdog
    unless ``daemons`` is False, and its jobs) and those with ``marker`` in their
    command line, still there after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left: list = slurm_watchdog.job_processes(folder)
        left += _pgrep(str(folder)) if daemons else []
        left += _pgrep(marker) if marker else []
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(private_slurm):
    """The private cluster slurm_cluster() started here: the run's one, lent to this
    module (tests/conftest.py); its stop, and what it leaves, are checked at the end
    of the run, and by the tests below that start clusters of their own."""
    return private_slurm


@needs_private_slurm
def test_slurm_cluster_reuses_the_private_cluster(cluster):
    assert slurm_cluster() is cluster
    assert (cluster.available, cluster.kind, cluster.nodes) == (True, "private", 2)
    assert os.environ["SLURM_CONF"] == str(cluster.folder / "slurm.conf")
    assert cluster.hosts == ["127.0.0.2", "127.0.0.3"]
    # Each node offers all of this machine's CPUs.
    assert cluster.cpus == 2 * os.cpu_count()
    assert str(cluster) == (
        "private Slurm cluster for this notebook, stopped when the kernel ends:\n"
        f"2 nodes on this machine (127.0.0.2, 127.0.0.3), {os.cpu_count()} "
        f"CPU{'s' if os.cpu_count() > 1 else ''} each, shared, no GPUs"
    )
    # munged, slurmctld, a slurmd for each node, the watchdog
    assert len(_pgrep(str(cluster.folder))) == 5


@needs_private_slurm
def test_hello_ranks_is_submitted_watched_and_read(cluster, tmp_path, capsys):
    job = submit(
        "slurm/hello_ranks.sbatch", **CPU_NODE, options={"cpus-per-task": 1},
        output_dir=tmp_path,
    )  # fmt: skip
    status = job.wait(timeout=120, poll=0.3)
    printed = capsys.readouterr().out.splitlines()
    host = cluster.hosts[0]
    assert printed[0].startswith("sbatch --parsable --nodes=1 --ntasks-per-node=2 ")
    assert (
        printed[1]
        == f"submitted job {job.job_id}; its output goes to {job.output_path}"
    )
    assert f"job {job.job_id}: RUNNING on {host}" in printed  # ~4 s, polled every 0.3
    assert printed[-1] == (
        f"job {job.job_id}: COMPLETED, exit code 0, in {format_seconds(status.elapsed)}"
    )
    assert job.output_path == tmp_path / f"hello_ranks-{job.job_id}.out"
    text = job.output()
    assert f"job {job.job_id}: 1 nodes ({host}), 2 tasks" in text
    for rank in (0, 1):
        assert (
            f"hello from rank {rank} of 2 (local rank {rank}, node 0, started by "
            f"srun, {BACKEND_2}): sum of ranks = 1"
        ) in text


@needs_private_slurm
def test_train_ddp_fails_then_resumes_when_submitted_again(cluster, tmp_path):
    checkpoint = tmp_path / "train.pt"
    args = ("--epochs", "2", "--checkpoint", str(checkpoint))
    options = {"cpus-per-task": 1}
    crashed = submit("slurm/train_ddp.sbatch", *args, "--crash-in-epoch", "1",
                     **CPU_NODE, options=options, output_dir=tmp_path)  # fmt: skip
    status = crashed.wait(timeout=180, poll=0.5)
    text = crashed.output()
    # srun stopped rank 0 with SIGTERM when rank 1 died: its exit code, 143, is the
    # step's and so the script's.
    assert (status.state, status.exit_code) == ("FAILED", 143), text
    # The script's own checkpoint (the one --checkpoint replaces), relative to
    # the folder the job runs in: no path of this machine in the output.
    assert "checkpoint runs/checkpoints/train-ddp.pt; requeued 0 times" in text
    assert _started("srun", 0) in text
    assert "epoch 0: eval accuracy" in text and "rank 1 dies in epoch 1" in text
    # The same job again: it resumes from the checkpoint of epoch 0.
    again = submit("slurm/train_ddp.sbatch", *args, **CPU_NODE, options=options,
                   output_dir=tmp_path)  # fmt: skip
    assert again.wait(timeout=180, poll=0.5).state == "COMPLETED", again.output()
    text = again.output()
    assert f"resuming from {checkpoint} at epoch 1" in text
    assert "epoch 0:" not in text and "epoch 1: eval accuracy" in text
    assert re.search(r"done: weight checksum -?\d+\.\d{6}", text)


@needs_private_slurm
def test_train_torchrun_restarts_the_ranks_within_the_job(cluster, tmp_path):
    checkpoint = tmp_path / "train.pt"
    job = submit(
        "slurm/train_torchrun.sbatch",
        *("--epochs", "2", "--checkpoint", str(checkpoint), "--crash-in-epoch", "1"),
        nodes=1, ntasks_per_node=1, gpus_per_node=0, options={"cpus-per-task": 2},
        output_dir=tmp_path,
    )  # fmt: skip
    status = job.wait(timeout=240, poll=0.5)
    text = job.output()
    assert status.state == "COMPLETED", text
    assert "2 ranks per node (GPUs per node: 0, CPUs per node: 2)" in text
    assert "up to 1 restarts" in text
    assert _started("torchrun", 0) in text
    assert "rank 1 dies in epoch 1" in text
    assert _started("torchrun", 1) in text
    assert f"resuming from {checkpoint} at epoch 1" in text
    assert "done: weight checksum" in text


@needs_private_slurm
def test_the_scaling_job_writes_results_that_load_and_plot(cluster, tmp_path):
    job = submit("slurm/scaling.sbatch", **CPU_NODE, options={"cpus-per-task": 1},
                 output_dir=tmp_path)  # fmt: skip
    status = job.wait(timeout=300, poll=0.5)
    text = job.output()
    assert status.state == "COMPLETED", text
    # Paths relative to the folder the job ran in (the repository), the same on
    # every machine: none of this one's in the output.
    shown = Path(re.search(r"results in (\S+)", text).group(1))
    assert shown == Path("runs") / f"scaling-{job.job_id}"
    assert f"wrote {shown}/scaling-1rank.json" in text
    assert str(ROOT) not in text, text
    results = ROOT / shown
    try:
        one, two = (load_scaling(results / f"{name}.json") for name in
                    ("scaling-1rank", "scaling-1node"))  # fmt: skip
        assert [(r.mode, r.world_size) for r in one.rows] == [
            ("weak", 1),
            ("strong", 1),
        ]
        assert [(r.mode, r.world_size) for r in two.rows] == [
            ("weak", 2),
            ("strong", 2),
        ]
        assert (one.launcher, two.launcher) == ("srun", "srun")
        for row in two.rows:  # compared with the baseline's 1 rank
            assert row.base_world_size == 1
            base = one.row(row.mode, 1)
            expected = (
                row.samples_per_second / base.samples_per_second / 2
                if row.mode == "weak"
                else base.step_seconds / row.step_seconds / 2
            )
            assert row.efficiency == pytest.approx(expected)
        # Each file alone holds one world size; the folder, read as one, makes one
        # curve a mode from 1 rank up.
        merged = load_scaling(results)
        assert [(r.mode, r.world_size) for r in merged.rows] == [
            ("weak", 1), ("weak", 2), ("strong", 1), ("strong", 2),
        ]  # fmt: skip
        figure = plot_scaling(results)
        lines = [line for line in figure.axes[0].get_lines() if line.get_gid() is None]
        assert sorted(list(line.get_xdata()) for line in lines) == [[1, 2], [1, 2]]
        plt.close(figure)
    finally:
        shutil.rmtree(results, ignore_errors=True)


def _sleeper(tmp_path: Path) -> Path:
    script = tmp_path / "sleeper.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=sleeper\n"
        "srun bash -c 'sleep 300; echo MARKER-workshop'\n"
    )
    return script


def _until_task_runs(within: float = 60) -> None:
    """Wait for the sleeper's task: a job is RUNNING as soon as its batch script
    starts, a moment before srun has started the task."""
    deadline = time.monotonic() + within
    while not _pgrep("MARKER-workshop"):
        assert time.monotonic() < deadline, f"no task after {within} s"
        time.sleep(0.2)


@needs_private_slurm
def test_a_timeout_leaves_the_job_and_an_interrupt_cancels_it(
    cluster, tmp_path, monkeypatch, capsys
):
    job = submit(
        _sleeper(tmp_path), options=["--ntasks=1"], cwd=tmp_path, output_dir="out"
    )
    assert job.output_path == tmp_path / "out" / f"sleeper-{job.job_id}.out"
    with pytest.raises(TimeoutError, match=rf"job {job.job_id} is still (PENDING|"
                       r"RUNNING) after 1 s; it was not cancelled"):  # fmt: skip
        job.wait(timeout=1, poll=0.2)
    _until_task_runs()
    assert job.state() == "RUNNING"

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(slurm_module, "_sleep", interrupt)
    with pytest.raises(
        KeyboardInterrupt, match=rf"^interrupted; cancelled job {job.job_id} "
    ) as caught:
        job.wait()
    assert job.state() == "CANCELLED"
    assert str(caught.value).splitlines()[1].startswith(f"job {job.job_id}: ")
    left = _left_behind(cluster.folder, "MARKER-workshop", within=15, daemons=False)
    assert left == [], "the cancelled job's processes are still there"
    assert "CANCELLED AT" in job.output()


@needs_private_slurm
def test_sbatch_refuses_more_nodes_than_there_are(cluster, tmp_path):
    with pytest.raises(RuntimeError, match=r"sbatch refused the job .*\n"
                       r"command: sbatch --parsable --nodes=3 "):  # fmt: skip
        submit("slurm/hello_ranks.sbatch", nodes=3, output_dir=tmp_path)


@needs_private_slurm
def test_a_controller_that_answers_is_used_not_started(cluster):
    done = subprocess.run(
        [PYTHON, "-c", "from workshop.cluster.slurm_here import slurm_cluster; "
         "c = slurm_cluster(); print(c.kind, c.nodes); print(c)"],
        env=clean_env(SLURM_CONF=os.environ["SLURM_CONF"]),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kind, text = done.stdout.splitlines()
    assert kind == "cluster 2"
    assert text.startswith(f"Slurm cluster (SLURM_CONF={os.environ['SLURM_CONF']}): ")


KERNEL = """\
    import os, sys, time
    os.environ.pop("SLURM_CONF", None)
    from workshop.cluster.slurm import submit
    from workshop.cluster.slurm_here import slurm_cluster
    cluster = slurm_cluster()
    print("folder", cluster.folder, cluster.kind, flush=True)
    if sys.argv[-1] == "exit":
        sys.exit(0)  # no stop(): atexit has to do it
    job = submit(sys.argv[-1], options=["--ntasks=1"], output_dir=cluster.folder)
    deadline = time.monotonic() + 60
    while job.state() != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    print(job.state().lower(), flush=True)
    time.sleep(300)
"""


def _kernel(tmp_path: Path, *args: str) -> subprocess.Popen:
    (tmp_path / "kernel.py").write_text(textwrap.dedent(KERNEL))
    return subprocess.Popen(
        [PYTHON, str(tmp_path / "kernel.py"), *args],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _folder(kernel: subprocess.Popen) -> Path:
    for line in kernel.stdout:
        if line.startswith("folder "):
            _, folder, kind = line.split()
            assert kind == "private", line
            return Path(folder)
    raise AssertionError(f"the kernel printed no folder; exit code {kernel.wait(5)}")


@needs_private_slurm
def test_a_private_cluster_stops_when_the_process_exits(tmp_path):
    kernel = _kernel(tmp_path, "exit")
    try:
        folder = _folder(kernel)
        assert kernel.wait(60) == 0, kernel.stdout.read()
        # atexit stopped it before the process ended: nothing for the watchdog.
        assert not folder.exists()
        assert _left_behind(folder, within=0) == []
    finally:
        kernel.kill()
        kernel.wait(10)
        kernel.stdout.close()


@needs_private_slurm
def test_a_killed_kernel_leaves_nothing_behind(tmp_path):
    kernel = _kernel(tmp_path, str(_sleeper(tmp_path)))
    try:
        folder = _folder(kernel)
        said = [kernel.stdout.readline() for _ in range(3)]  # sbatch, submitted, ...
        assert said[2] == "running\n", said
        _until_task_runs()
        kernel.kill()  # SIGKILL: no atexit, no finally; only the watchdog is left
        kernel.wait(10)
        started = time.monotonic()
        assert _left_behind(folder, "MARKER-workshop", within=20) == []
        assert time.monotonic() - started < 20
        assert not folder.exists()
    finally:
        kernel.kill()
        kernel.wait(10)
        kernel.stdout.close()


@needs_private_slurm
@pytest.mark.parametrize("action", ["stop", "stop-daemons"])
def test_the_stop_script_ends_running_jobs_too(tmp_path, tmp_path_factory, action):
    # A job's slurmstepd and tasks outlive slurmd by design: `stop` cancels the jobs
    # first and kills what is left; `stop-daemons` stops the daemons alone.
    # (A short folder: Slurm's socket paths in it must fit 108 bytes.)
    folder = tmp_path_factory.mktemp("stop")
    script = str(ROOT / "scripts" / "local_slurm.sh")
    started = subprocess.run(["bash", script, "start", str(folder)], env=clean_env(),
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        submitted = subprocess.run(
            ["sbatch", "--ntasks=1", f"--output={tmp_path}/%j.out", _sleeper(tmp_path)],
            env=clean_env(SLURM_CONF=str(folder / "slurm.conf")),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        _until_task_runs()
    finally:
        stop = ["bash", script, action, str(folder)]
        stopped = subprocess.run(stop, capture_output=True, text=True, timeout=120)
    try:
        assert stopped.returncode == 0, stopped.stderr
        daemons = [line for line in _pgrep(str(folder)) if Path(line.split()[1]).name
                   in ("slurmctld", "slurmd", "munged")]  # fmt: skip
        assert daemons == []  # stopped either way
        left = _left_behind(folder, "MARKER-workshop", within=3)
        assert (left == []) == (action == "stop"), left
    finally:
        if action == "stop-daemons":  # what a bare stop-daemons leaves: clean it up
            slurm_watchdog.stop_cluster(folder, script)


@needs_private_slurm
@pytest.mark.parametrize(
    ("script", "cpus", "ranks"),
    [("slurm/train_ddp.sbatch", 1, 2), ("slurm/train_torchrun.sbatch", 2, 4)],
)
def test_the_training_scripts_span_both_nodes(
    cluster, tmp_path, monkeypatch, script, cpus, ranks
):
    """On the two-node cluster a job of two nodes is a job of two nodes: srun (or one
    torchrun per node) starts ranks on each, and they train together to the end."""
    # Both "nodes" are this machine: on a GPU node their local rank 0s would share
    # one GPU, which NCCL refuses. The job inherits this environment (sbatch's
    # --export=ALL), so its ranks run on the CPU with gloo.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    job = submit(
        script, "--epochs", "1", "--checkpoint", str(tmp_path / "train.pt"),
        nodes=2, ntasks_per_node=1, gpus_per_node=0, options={"cpus-per-task": cpus},
        output_dir=tmp_path,
    )  # fmt: skip
    status = job.wait(timeout=300, poll=0.5)
    text = job.output()
    assert status.state == "COMPLETED", text
    assert f"{ranks} ranks on 2 node(s)" in text
    assert f"({', '.join(cluster.hosts)})" in text or "127.0.0.[2-3]" in text, text
    for rank in range(ranks):
        node = rank * 2 // ranks  # ranks fill node 0 first
        assert re.search(rf"rank {rank}: local rank \d on node {node} ", text), text
    assert re.search(r"done: weight checksum -?\d+\.\d{6}", text)
