"""workshop.cluster.slurm: writing, submitting, watching and reading Slurm jobs.

The parsing of scontrol/sacct output, the sbatch command submit() builds, the lines
wait() prints and every error message are checked without Slurm (fake commands on
PATH, a fake job status). Then the batch scripts in slurm/ run for real on a private
two-node cluster (scripts/local_slurm.sh, shared by this module), and the private
cluster's clean-up is checked: at exit, and by its watchdog when the process that
started it is SIGKILLed. Nothing may be left running: no daemon, watchdog or job."""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest
from conftest import ROOT

from workshop.cluster import slurm as slurm_module
from workshop.cluster import slurm_here as _slurm_cluster
from workshop.cluster.slurm import SlurmJob, submit
from workshop.cluster.slurm_here import slurm_cluster
from workshop.cluster.slurm_options import find_script, project_root, sbatch_options
from workshop.cluster.slurm_status import (
    JobStatus,
    format_seconds,
    parse_scontrol,
    parse_seconds,
    status_from_sacct,
    status_from_scontrol,
)

CPU_NODE = {"nodes": 1, "ntasks_per_node": 2, "gpus_per_node": 0}

# One line of `scontrol show job -o`, as Slurm 22.05 prints it (shortened).
RUNNING = (
    "JobId=12 JobName=hello-ranks UserId=root(0) JobState=RUNNING Reason=None "
    "Dependency=(null) Requeue=1 Restarts=0 ExitCode=0:0 RunTime=00:00:03 "
    "TimeLimit=00:05:00 AllocNode:Sid=localhost:10821 NodeList=vm BatchHost=vm "
    "NumNodes=1 NumCPUs=2 CPUs/Task=1 TRES=cpu=2,mem=1000M,node=1,billing=2 "
    "Command=/work/my project/slurm/hello.sbatch WorkDir=/work "
    "StdOut=/work/runs/hello_ranks-12.out Power="
)


# --- parsing: no Slurm needed --------------------------------------------------------


def test_a_scontrol_line_is_read_into_whole_values():
    pairs = parse_scontrol(RUNNING)
    assert pairs["JobState"] == "RUNNING"
    assert pairs["TRES"] == "cpu=2,mem=1000M,node=1,billing=2"  # '=' inside a value
    assert pairs["AllocNode:Sid"] == "localhost:10821"
    assert pairs["CPUs/Task"] == "1"
    assert pairs["Command"] == "/work/my project/slurm/hello.sbatch"  # a space inside
    assert pairs["Power"] == ""


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"JobState": "PENDING", "Reason": "Resources", "NodeList": "(null)"},
         "job 12: PENDING (Resources)"),
        ({"JobState": "PENDING", "NodeList": "(null)"}, "job 12: PENDING"),
        ({}, "job 12: RUNNING on vm"),
        ({"JobState": "COMPLETED", "RunTime": "00:00:04"},
         "job 12: COMPLETED, exit code 0, in 4 s"),
        ({"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "1:0"},
         "job 12: FAILED (NonZeroExitCode), exit code 1, in 3 s"),
        ({"JobState": "CANCELLED", "ExitCode": "0:15", "RunTime": "00:02:05"},
         "job 12: CANCELLED, ended by signal 15, in 2 min 5 s"),
        ({"JobState": "TIMEOUT", "Reason": "TimeLimit", "RunTime": "00:05:00"},
         "job 12: TIMEOUT (TimeLimit), exit code 0, in 5 min 0 s"),
    ],
)  # fmt: skip
def test_the_status_and_its_line_from_scontrol(changes, line):
    text = RUNNING
    for key, value in changes.items():
        text = re.sub(rf"\b{key}=\S*", f"{key}={value}", text)
    status = status_from_scontrol("12", "some other line\n" + text)
    assert status.line() == line
    assert status.finished == (status.state not in ("PENDING", "RUNNING"))
    assert status.source == "scontrol"


def test_scontrol_output_without_the_job_gives_none():
    assert status_from_scontrol("13", RUNNING) is None


def test_the_status_from_sacct_once_scontrol_forgot_the_job():
    text = "12|CANCELLED by 0|0:15|00:00:07|vm\n"
    status = status_from_sacct("12", text)
    assert (status.state, status.signal, status.elapsed, status.nodes) == (
        "CANCELLED",
        15,
        7.0,
        "vm",
    )
    assert status.finished and status.source == "sacct"
    pending = status_from_sacct("12", "12|PENDING|0:0|00:00:00|None assigned\n")
    assert (pending.state, pending.nodes, pending.exit_code) == ("PENDING", "", None)
    assert status_from_sacct("12", "12.batch|COMPLETED|0:0|00:00:01|vm\n") is None


def test_slurm_durations_are_read_and_written_for_people():
    assert parse_seconds("05") == 5
    assert parse_seconds("02:05") == 125
    assert parse_seconds("1-02:00:05") == 93605
    assert parse_seconds("Unknown") is None
    assert [format_seconds(s) for s in (4.4, 125, 3725)] == [
        "4 s",
        "2 min 5 s",
        "1 h 2 min",
    ]


# --- the sbatch command: no Slurm needed ---------------------------------------------


def test_submit_options_override_the_scripts_lines_in_a_fixed_order():
    assert sbatch_options(
        nodes=2,
        ntasks_per_node=4,
        gpus_per_node=0,
        time="00:10:00",
        options={"cpus_per_task": 1, "--exclusive": True, "requeue": False, "J": "x"},
    ) == [
        "--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=0", "--time=00:10:00",
        "--cpus-per-task=1", "--exclusive", "-J", "x",
    ]  # fmt: skip
    assert sbatch_options(time=30, options=["--cpus-per-task=1"]) == [
        "--time=30",
        "--cpus-per-task=1",
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"nodes": 0}, ValueError, r"nodes must be a whole number, 1 or more, "
         r"not 0; e\.g\. submit\("),
        ({"gpus_per_node": -1}, ValueError, r"gpus_per_node must be a whole "
         r"number, 0 or more, not -1"),
        ({"ntasks_per_node": True}, ValueError, r"ntasks_per_node must be .* not True"),
        ({"nodes": 1, "options": {"nodes": 2}}, ValueError,
         r"nodes is given twice, as an argument of submit\(\) and in options"),
        ({"options": "--exclusive"}, TypeError,
         r"not the string '--exclusive'; write \['--exclusive'\]"),
        ({"options": [3]}, TypeError, r"strings like '--cpus-per-task=1', got 3"),
    ],
)  # fmt: skip
def test_bad_submit_options_say_what_was_wrong(kwargs, error, match):
    with pytest.raises(error, match=match):
        sbatch_options(**kwargs)


def test_scripts_are_found_from_the_repository_root_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a notebook runs in notebooks/, say
    found = find_script("slurm/hello_ranks.sbatch", None)
    assert found == ROOT / "slurm" / "hello_ranks.sbatch"
    assert project_root(found) == ROOT
    with pytest.raises(FileNotFoundError, match=r"no batch script 'slurm/nope.sbatch'"):
        find_script("slurm/nope.sbatch", None)


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + textwrap.dedent(body))
    (bin_dir / name).chmod(0o755)


def test_submit_runs_sbatch_from_the_repository_and_prints_it(
    tmp_path, monkeypatch, capsys
):
    log = tmp_path / "sbatch.log"
    _fake(tmp_path / "bin", "sbatch", f'pwd > {log}; printf "%s\\n" "$@" >> {log}\n'
          'echo "4242;cluster"\n')  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.chdir(ROOT / "notebooks")  # where a notebook's kernel runs
    job = submit(
        "slurm/train_ddp.sbatch", "--epochs", "2", **CPU_NODE,
        options={"cpus-per-task": 1}, output_dir=tmp_path / "out",
    )  # fmt: skip
    cwd, *argv = log.read_text().splitlines()
    assert Path(cwd) == ROOT
    assert argv == [
        "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0",
        "--cpus-per-task=1", f"--output={tmp_path}/out/train_ddp-%j.out",
        "slurm/train_ddp.sbatch", "--epochs", "2",
    ]  # fmt: skip
    assert (job.job_id, job.output_path) == (
        "4242",
        tmp_path / "out/train_ddp-4242.out",
    )
    assert job.script == ROOT / "slurm" / "train_ddp.sbatch"
    printed = capsys.readouterr().out
    # The folder it ran in, from the notebook's; a path outside the checkout (and
    # the home folder) as it is.
    assert f"sbatch {' '.join(argv)}    (in ..)" in printed
    assert f"submitted job 4242; its output goes to {job.output_path}" in printed


def test_submit_prints_paths_from_the_current_folder_not_this_machines(
    tmp_path, monkeypatch, capsys
):
    _fake(tmp_path / "bin", "sbatch", 'echo "4243;cluster"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.chdir(ROOT / "notebooks")
    job = submit("slurm/hello_ranks.sbatch", **CPU_NODE)  # output into runs/
    printed = capsys.readouterr().out.splitlines()
    assert job.output_path == ROOT / "runs" / "hello_ranks-4243.out"
    assert printed == [
        "sbatch --parsable --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 "
        "--output=runs/hello_ranks-%j.out slurm/hello_ranks.sbatch    (in ..)",
        "submitted job 4243; its output goes to ../runs/hello_ranks-4243.out",
    ]
    assert (Path("..") / "runs" / "hello_ranks-4243.out").resolve() == job.output_path
    assert not [line for line in printed if str(ROOT) in line]


def test_submit_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"no batch script 'nope.sbatch'"):
        submit("nope.sbatch")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no Slurm at all
    with pytest.raises(FileNotFoundError, match=r"sbatch not found: .*make setup"):
        submit("slurm/hello_ranks.sbatch", output_dir=tmp_path)
    _fake(tmp_path / "bin", "sbatch", """\
        echo "sbatch: error: Batch job submission failed: Invalid account" >&2
        exit 1
    """)  # fmt: skip
    with pytest.raises(
        RuntimeError,
        match=r"sbatch refused the job \(exit code 1\): sbatch: error: Batch job "
        r"submission failed: Invalid account\ncommand: sbatch --parsable --nodes=3 ",
    ):
        submit("slurm/hello_ranks.sbatch", nodes=3, output_dir=tmp_path)


def _slurm_conf_missing(tmp_path, monkeypatch, tools) -> tuple[Path, Path]:
    """Fake Slurm ``tools`` that log each call, and SLURM_CONF naming no file;
    returns (the log, which stays absent while no tool ran; the missing file)."""
    log = tmp_path / "ran"
    for tool in tools:
        _fake(tmp_path / "bin", tool, f"echo {tool} >> {log}\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    missing = tmp_path / "gone" / "slurm.conf"
    monkeypatch.setenv("SLURM_CONF", str(missing))
    return log, missing


def test_a_slurm_conf_that_names_no_file_is_refused_before_sbatch_runs(
    tmp_path, monkeypatch, capsys
):
    # A real sbatch would retry the missing file for 60 s, then blame the options.
    log, missing = _slurm_conf_missing(
        tmp_path, monkeypatch, ("sbatch", "scontrol", "sacct")
    )
    with pytest.raises(
        FileNotFoundError,
        match=rf"^SLURM_CONF={re.escape(str(missing))} names a file that does not "
        r"exist, not a Slurm "
        r"configuration file, so Slurm's commands would retry reading it for 60 s "
        r"and then fail\. HINT: unset it to use this machine's own configuration "
        r"\(os\.environ\.pop\(\"SLURM_CONF\"\) here, `unset SLURM_CONF` in a "
        r"shell\), or point it at an existing slurm\.conf, or call "
        r"slurm_cluster\(\)",
    ):
        submit("slurm/hello_ranks.sbatch", output_dir=tmp_path / "out")
    assert not log.exists() and not (tmp_path / "out").exists()
    assert capsys.readouterr().out == ""  # not even the sbatch line was printed
    status = _job(tmp_path).status()  # scontrol too: UNKNOWN, with the reason
    assert (status.state, status.source) == ("UNKNOWN", "error")
    assert status.reason.startswith(f"SLURM_CONF={missing} names a file that does ")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path))
    with pytest.raises(
        FileNotFoundError,
        match=rf"^SLURM_CONF={re.escape(str(tmp_path))} names a folder, not a Slurm",
    ):
        submit("slurm/hello_ranks.sbatch", output_dir=tmp_path / "out")
    assert not log.exists()


def test_slurm_cluster_names_a_slurm_conf_that_is_not_there(tmp_path, monkeypatch):
    # It used to wait for scontrol ping's minute of retries, then start a private
    # cluster over the user's setting.
    log, missing = _slurm_conf_missing(
        tmp_path, monkeypatch, ("sbatch", "scontrol", "sinfo")
    )
    cluster = slurm_cluster()
    assert (cluster.available, cluster.kind) == (False, "none")
    assert str(cluster) == (
        f"no Slurm to submit to: SLURM_CONF={missing} names a file that does not "
        "exist, not a Slurm configuration file, so Slurm's commands would retry "
        "reading it for 60 s and then fail. HINT: unset it to use this machine's own "
        'configuration (os.environ.pop("SLURM_CONF") here, `unset SLURM_CONF` in a '
        "shell), or point it at an existing slurm.conf"
    )
    assert not log.exists()  # no Slurm command was asked


# --- watching a job: a fake status, no Slurm needed ----------------------------------


def _play(monkeypatch, *states: JobStatus) -> list[str]:
    """Make SlurmJob.status return ``states`` in turn (the last one forever);
    return the list that records scancel calls."""
    todo = list(states)
    cancelled: list[str] = []

    def status(self):
        return todo.pop(0) if len(todo) > 1 else todo[0]

    monkeypatch.setattr(SlurmJob, "status", status)
    monkeypatch.setattr(SlurmJob, "cancel", lambda self: cancelled.append(self.job_id))
    monkeypatch.setattr(slurm_module, "_sleep", lambda seconds: None)
    return cancelled


def _job(tmp_path) -> SlurmJob:
    return SlurmJob("12", tmp_path / "x.sbatch", tmp_path / "x-12.out")


def test_wait_prints_each_change_once(tmp_path, monkeypatch, capsys):
    pending = JobStatus("12", "PENDING", "Priority")
    _play(
        monkeypatch, pending, pending, replace(pending, reason="Resources"),
        JobStatus("12", "RUNNING", nodes="vm"), JobStatus("12", "RUNNING", nodes="vm"),
        JobStatus("12", "FAILED", exit_code=2, elapsed=3),
    )  # fmt: skip
    final = _job(tmp_path).wait(timeout=10)
    assert final.state == "FAILED"
    assert capsys.readouterr().out.splitlines() == [
        "job 12: PENDING (Priority)",
        "job 12: PENDING (Resources)",
        "job 12: RUNNING on vm",
        f"job 12: FAILED, exit code 2, in 3 s; output in {tmp_path}/x-12.out",
    ]


def test_a_wait_that_times_out_leaves_the_job_and_says_what_to_do(
    tmp_path, monkeypatch
):
    cancelled = _play(monkeypatch, JobStatus("12", "RUNNING", nodes="vm"))
    with pytest.raises(
        TimeoutError,
        match=r"job 12 is still RUNNING after 0.2 s; it was not cancelled. Wait "
        r"longer with job.wait\(timeout=...\), or cancel it with job.cancel\(\) "
        r"\(scancel 12\)",
    ):
        _job(tmp_path).wait(timeout=0.2, show=False)
    assert cancelled == []


def test_an_interrupted_wait_cancels_the_job_then_says_so_in_two_lines(
    tmp_path, monkeypatch, capsys
):
    cancelled = _play(
        monkeypatch,
        JobStatus("12", "RUNNING", nodes="vm"),
        JobStatus("12", "CANCELLED", signal=15, elapsed=2),
    )

    def interrupt(seconds):
        raise KeyboardInterrupt  # what a kernel interrupt raises in a cell

    monkeypatch.setattr(slurm_module, "_sleep", interrupt)
    with pytest.raises(
        KeyboardInterrupt, match=r"^interrupted; cancelled job 12 \(scancel 12\)\n"
    ) as caught:
        _job(tmp_path).wait()
    assert cancelled == ["12"]
    assert capsys.readouterr().out.splitlines() == ["job 12: RUNNING on vm"]
    # What a notebook shows in place of a traceback through the polling loop.
    assert caught.value._render_traceback_() == [
        "KeyboardInterrupt: interrupted; cancelled job 12 (scancel 12)",
        "job 12: CANCELLED, ended by signal 15, in 2 s",
    ]


def test_a_job_slurm_has_forgotten_is_unknown_with_the_reason(tmp_path, monkeypatch):
    _fake(tmp_path / "bin", "scontrol", """\
        echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
    """)  # fmt: skip
    _fake(tmp_path / "bin", "sacct", 'echo "Slurm accounting storage is disabled" >&2'
          "; exit 1\n")  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    job = _job(tmp_path)
    status = job.status()
    assert (status.state, status.source, status.finished) == (
        "UNKNOWN",
        "forgotten",
        True,
    )
    assert status.reason == (
        "scontrol no longer knows job 12 and sacct cannot tell: Slurm accounting "
        f"storage is disabled; its output may still be in {job.output_path}"
    )
    with pytest.raises(
        FileNotFoundError,
        match=rf"job 12 has no output yet: {job.output_path} does not exist \(the "
        r"job is UNKNOWN\); Slurm creates it when the job starts",
    ):
        job.output()
    _fake(tmp_path / "bin", "sacct", 'echo "12|TIMEOUT|0:15|00:10:00|n[1-2]"\n')
    assert job.status().line() == "job 12: TIMEOUT, ended by signal 15, in 10 min 0 s"


# --- is there a Slurm? no Slurm needed -----------------------------------------------


def test_no_slurm_says_what_to_install(monkeypatch):
    monkeypatch.setattr(_slurm_cluster, "_PRIVATE", None)
    monkeypatch.setattr(_slurm_cluster.shutil, "which", lambda name: None)
    cluster = slurm_cluster()
    assert (cluster.available, cluster.kind) == (False, "none")
    assert str(cluster) == (
        "no Slurm to submit to: sbatch not found: on a cluster, run this notebook on "
        "a login node or inside an allocation (some sites need `module load slurm` "
        "first); on your own Debian/Ubuntu machine, run `make setup` as root to "
        "install slurm-wlm"
    )


def test_without_a_controller_or_root_no_private_cluster_is_started(monkeypatch):
    monkeypatch.setattr(_slurm_cluster, "_PRIVATE", None)
    monkeypatch.setattr(_slurm_cluster.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        _slurm_cluster, "_query", lambda command: (False, "Unable to contact slurm")
    )
    monkeypatch.setattr(_slurm_cluster, "_start_private", pytest.fail)
    assert slurm_cluster(start_private=False).reason == (
        "no Slurm controller answers (scontrol ping: Unable to contact slurm); "
        "start_private=False"
    )
    monkeypatch.setattr(_slurm_cluster.os, "geteuid", lambda: 1000)
    assert re.fullmatch(
        r"no Slurm controller answers \(.*\), and a private cluster needs root "
        r"\(slurmd starts the jobs' processes\): .*",
        slurm_cluster().reason,
    )


def test_sinfo_is_read_into_partitions_nodes_cpus_and_gpus():
    text = (
        "gpu1|gpu|64|gpu:a100:4(S:0-1)\n"
        "gpu1|debug*|64|gpu:a100:4(S:0-1)\n"
        "gpu2|gpu|64|gpu:4,shard:8\n"
        "cpu1|debug*|128|(null)\n"
    )
    assert _slurm_cluster._parse_sinfo(text) == (
        ["debug", "gpu"],
        ["gpu1", "gpu2", "cpu1"],
        256,
        8,
        4,  # the CPU-only node does not pull the GPUs per node down
    )
    # Nodes of 8 and of 4 GPUs: a job asking the same of every node can have 4.
    mixed = text.replace("gpu:4,shard:8", "gpu:h100:8")
    assert _slurm_cluster._parse_sinfo(mixed)[3:] == (12, 4)
    assert _slurm_cluster._parse_sinfo("cpu1|debug*|128|(null)\n")[3:] == (0, 0)
    cluster = _slurm_cluster.SlurmCluster(True, "cluster", "SLURM_CONF=/x")
    cluster.partitions, cluster.hosts, cluster.cpus, cluster.gpus, _ = (
        _slurm_cluster._parse_sinfo(text)
    )
    assert str(cluster) == (
        "Slurm cluster (SLURM_CONF=/x): partitions debug, gpu; 3 nodes, 256 CPUs, "
        "8 GPUs"
    )


# --- real jobs on a private two-node cluster -----------------------------------------


# The next tests start clusters of their own, not the run's: each is stopped (at
# exit, by its watchdog, by the stop script), and what it leaves is checked.
