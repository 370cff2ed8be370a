"""workshop.machine.doctor and ``python -m workshop``.

The rows carry this machine's real values; faked Slurm variables, GPUs and tools on
PATH show up as they should; a failing probe becomes a row, not a crash; and CUDA is
never initialised in the calling process.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import io
import os
import platform
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, repo_env

from workshop import env
from workshop.__main__ import main
from workshop.machine.doctor import WIDTH, Row, collect_rows, doctor, format_rows
from workshop.machine.doctor_probes import slurm_unconfigured, version_line
from workshop.ranks.forkable import choose_start_method, fork_hazard
from workshop.ranks.streams import display_path

# The module, beside its function doctor imported above: tests patch its globals.
doctor_module = importlib.import_module("workshop.machine.doctor")

SECTIONS = [
    "Python",
    "PyTorch",
    "GPUs",
    "CPU",
    "Memory",
    "Backends",
    "Launchers",
    "Slurm",
    "This process",
    "Workshop defaults",
]

_LAUNCHER_NAMES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORKSHOP_LAUNCHER_STORE",
}


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher or Slurm variables, even when the tests run inside a job."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_")) or name in _LAUNCHER_NAMES:
            monkeypatch.delenv(name)


@pytest.fixture
def bin_dir(monkeypatch, tmp_path, clean_env):
    """PATH is only this (empty) folder: no nvidia-smi, mpirun or srun unless a test
    puts a fake one there."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


def fake_tool(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def as_dict(rows: list[Row]) -> dict[tuple[str, str], str]:
    return {(row.section, row.item): row.value for row in rows}


def errors(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.item == "error"]


# --- the rows ------------------------------------------------------------------------


def test_rows_are_plain_data_in_section_order(clean_env):
    rows = collect_rows()
    assert all(isinstance(row, Row) for row in rows)
    assert all(isinstance(field, str) for row in rows for field in row)
    sections = list(dict.fromkeys(row.section for row in rows))
    assert sections == SECTIONS
    assert errors(rows) == []


def test_python_and_torch_rows_show_the_real_versions(clean_env):
    rows = as_dict(collect_rows())
    assert rows["Python", "version"].startswith(platform.python_version() + " (")
    assert rows["Python", "executable"] == display_path(sys.executable)
    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda} build"
    elif getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip} build"
    else:
        build = "CPU build"
    assert rows["PyTorch", "torch"] == f"{torch.__version__} ({build})"


def test_torchvision_row_has_its_build_tag_or_says_not_installed(clean_env):
    torchvision = pytest.importorskip("torchvision")
    assert as_dict(collect_rows())["PyTorch", "torchvision"] == torchvision.__version__


def test_missing_torchvision_is_a_row(clean_env, monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert as_dict(collect_rows())["PyTorch", "torchvision"] == "not installed"


def test_gpu_count_is_the_nvml_count(clean_env):
    rows = as_dict(collect_rows())
    assert rows["GPUs", "visible to torch"].split()[0] == str(torch.cuda.device_count())


def test_no_gpu_gives_a_clear_none_row_and_cpu_defaults(bin_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    rows = collect_rows()
    values = as_dict(rows)
    assert values["GPUs", "visible to torch"] == "0 (none: CPU ranks)"
    assert values["GPUs", "nvidia-smi"] == "not found"
    assert not [row for row in rows if row.item.startswith("GPU ")]
    world_size, cores = env.default_world_size(0), env.usable_cores()
    assert values["Workshop defaults", "world_size"] == (
        f"{world_size} (CPU ranks, for {cores} usable core{'s' if cores != 1 else ''})"
    )
    assert values["Workshop defaults", "backend"] == "gloo (CPU ranks: no GPU visible)"


def test_cpu_backends_and_defaults_match_torch_and_env(clean_env):
    values = as_dict(collect_rows())
    assert values["CPU", "cores"].split()[0] == str(os.cpu_count())

    assert dist.is_gloo_available()
    assert values["Backends", "gloo"] == "available"
    assert values["Backends", "nccl"].startswith("available") == (
        dist.is_nccl_available()
    )
    if dist.is_nccl_available():
        major, minor, patch = torch.cuda.nccl.version()[:3]
        assert f"(NCCL {major}.{minor}.{patch})" in values["Backends", "nccl"]
    mpi = values["Backends", "mpi"]
    assert mpi.startswith("available") == dist.is_mpi_available()
    if not dist.is_mpi_available():
        assert mpi == "not available (pip wheels are built without MPI)"

    world_size = env.default_world_size()
    backend = env.choose_backend("auto", world_size)
    method, reason = choose_start_method("auto", fork_hazard())
    assert values["Workshop defaults", "world_size"].startswith(f"{world_size} (")
    assert values["Workshop defaults", "backend"].startswith(f"{backend} (")
    assert values["Workshop defaults", "start method"] == f"{method} ({reason})"


def test_fake_gpus_are_listed_from_nvidia_smi_without_touching_cuda(
    bin_dir, monkeypatch
):
    fake_tool(
        bin_dir,
        "nvidia-smi",
        """\
        test "$1" = "--query-gpu=index,name,memory.total" || exit 3
        test "$2" = "--format=csv,noheader" || exit 4
        echo "0, NVIDIA H100 80GB HBM3, 81559 MiB"
        echo "WARNING: infoROM is corrupted at gpu 0000:9A:00.0, see the manual" >&2
        echo "1, NVIDIA H100 80GB HBM3, 81559 MiB"
        """,
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)

    def forbidden(*args, **kwargs):
        raise AssertionError("the doctor initialised CUDA (or called cuInit)")

    # _lazy_init is behind get_device_properties, current_device, ...; is_available
    # calls cudaGetDeviceCount, whose cuInit makes forked ranks unable to use CUDA.
    monkeypatch.setattr(torch.cuda, "_lazy_init", forbidden)
    monkeypatch.setattr(torch.cuda, "is_available", forbidden)

    rows = collect_rows()
    assert errors(rows) == []
    values = as_dict(rows)
    assert values["GPUs", "visible to torch"] == "2"
    assert values["GPUs", "GPU 0"] == "NVIDIA H100 80GB HBM3, 79.6 GiB"
    assert values["GPUs", "GPU 1"] == "NVIDIA H100 80GB HBM3, 79.6 GiB"
    assert ("GPUs", "note") not in values
    assert [row.item for row in rows if row.section == "GPUs"] == [
        "visible to torch",
        "GPU 0",
        "GPU 1",
    ]
    assert values["Workshop defaults", "world_size"] == "2 (one per GPU)"
    assert values["Workshop defaults", "backend"] == "nccl (one GPU per rank)"
    assert not values["Backends", "nccl"].endswith("needs a GPU per rank")


def test_more_gpus_on_the_node_than_visible_gives_a_note(bin_dir, monkeypatch):
    lines = "".join(f'echo "{i}, NVIDIA A100-SXM4-40GB, 40960 MiB"\n' for i in range(4))
    fake_tool(bin_dir, "nvidia-smi", lines)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    values = as_dict(collect_rows())
    assert values["GPUs", "GPU 3"] == "NVIDIA A100-SXM4-40GB, 40.0 GiB"
    assert values["GPUs", "note"].startswith("torch sees 1 of the 4 GPUs nvidia-smi")


def test_failing_nvidia_smi_is_reported(bin_dir, monkeypatch):
    fake_tool(
        bin_dir,
        "nvidia-smi",
        """\
        echo "NVIDIA-SMI has failed because it couldn't communicate with the driver."
        exit 9
        """,
    )
    values = as_dict(collect_rows())
    assert values["GPUs", "nvidia-smi"] == (
        "exited with status 9: NVIDIA-SMI has failed because it couldn't "
        "communicate with the driver."
    )


def test_launchers_not_found(bin_dir):
    values = as_dict(collect_rows())
    assert values["Launchers", "mpirun"] == "not found"
    assert values["Launchers", "srun"] == "not found"


def test_launchers_found_with_their_version_line(bin_dir):
    mpirun = fake_tool(
        bin_dir,
        "mpirun",
        """\
        test "$1" = "--version" || exit 2
        echo "mpirun (Open MPI) 4.1.5"
        echo
        echo "Report bugs to https://www.open-mpi.org/community/help/"
        """,
    )
    srun = fake_tool(bin_dir, "srun", 'test "$1" = "--version" && echo "slurm 23.02.7"')
    values = as_dict(collect_rows())
    shown = display_path(mpirun), display_path(srun)
    assert values["Launchers", "mpirun"] == f"mpirun (Open MPI) 4.1.5 ({shown[0]})"
    assert values["Launchers", "srun"] == f"slurm 23.02.7 ({shown[1]})"


def test_paths_are_shown_from_the_current_folder_and_home_as_tilde(
    bin_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path))  # the fake tools are in ~/bin
    fake_tool(bin_dir, "srun", 'test "$1" = "--version" && echo "slurm 23.02.7"')
    monkeypatch.chdir(ROOT / "notebooks")  # where a notebook's kernel runs
    values = as_dict(collect_rows())
    assert values["Launchers", "srun"] == "slurm 23.02.7 (~/bin/srun)"
    # The interpreter: relative to notebooks/ where it is in this checkout (a
    # .venv), ~/... in the home folder, else as it is; the same file either way.
    executable = values["Python", "executable"]
    where = os.path.abspath(os.path.expanduser(executable))  # abspath normalises
    assert where == os.path.abspath(sys.executable)
    if Path(sys.executable).absolute().is_relative_to(ROOT):
        assert not Path(executable).is_absolute()


def test_the_report_shows_no_path_of_the_checkout_or_the_home_folder(
    clean_env, monkeypatch
):
    monkeypatch.chdir(ROOT / "notebooks")
    out = io.StringIO()
    doctor(file=out)
    text = out.getvalue()
    home = os.path.expanduser("~")
    found = re.findall(r"(?:^|[\s(:])(/\S+)", text, flags=re.M)
    assert not [p for p in found if p.startswith((f"{ROOT}/", f"{home}/"))], text


def test_srun_without_a_cluster_is_said_in_plain_words(bin_dir):
    # What Debian's srun 22.05 prints where slurm-wlm is installed but not configured.
    fake_tool(
        bin_dir,
        "srun",
        'echo "srun: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown '
        'host" >&2; exit 1',
    )
    said = as_dict(collect_rows())["Launchers", "srun"]
    assert said.startswith("Slurm is installed but no cluster is configured here")
    assert "resolve_ctls" not in said and "local_slurm.sh" in said


def test_other_srun_failures_are_shown_as_they_are():
    assert slurm_unconfigured("srun: error: Invalid user for SlurmUser slurm") is None
    said = slurm_unconfigured(
        "sinfo: fatal: Could not establish a configuration source"
    )
    assert said is not None and said.startswith("Slurm is installed but no cluster")


def test_version_line_skips_a_heading():
    mpich = "HYDRA build details:\n    Version:      4.1.2\n    Release Date: x\n"
    assert version_line(mpich) == "Version: 4.1.2"
    assert version_line("") == "(printed no version)"


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_hanging_launcher_times_out_and_leaves_nothing_behind(
    bin_dir, monkeypatch, tmp_path
):
    pidfile = tmp_path / "sleep.pid"
    # The shell's child holds the output pipe: only killing the whole group ends it.
    fake_tool(bin_dir, "srun", f"sleep 60 &\necho $! > {pidfile}\nwait\n")
    monkeypatch.setattr(doctor_module, "COMMAND_TIMEOUT_S", 0.5)
    started = time.monotonic()
    values = as_dict(collect_rows())
    assert time.monotonic() - started < 10
    assert values["Launchers", "srun"] == "no answer within 0.5 s"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(pid), f"the fake srun's child {pid} is still running"


def test_slurm_rows_outside_an_allocation(clean_env):
    values = as_dict(collect_rows())
    assert values["Slurm", "allocation"] == "none (not inside a Slurm job)"
    assert values["This process", "rank"] == "0 of 1 (no launcher)"


def test_slurm_rows_reflect_the_allocation(clean_env, monkeypatch):
    for name, value in {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu[003-004]",
        "SLURM_NTASKS": "8",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2)",
    }.items():
        monkeypatch.setenv(name, value)
    rows = collect_rows()
    slurm = [(row.item, row.value) for row in rows if row.section == "Slurm"]
    assert slurm == [
        ("job id", "4242"),
        ("partition", "gpu"),
        ("nodes", "2 (gpu[003-004])"),
        ("tasks", "8"),
        ("CPUs on node", "not set"),
        ("memory on node", "not set (the whole node's)"),
        ("GPUs on node", "4"),
        ("job step", STEP_ROW),
    ]
    values = as_dict(rows)
    assert values["This process", "rank"] == (
        "5 of 8, local rank 1 of 4, node 1 (from srun)"
    )
    assert values["This process", "master"] == "gpu003, port not set"


STEP_ROW = (
    "this process is a task of a job step (a notebook kernel that a portal started "
    "with srun): ranks and commands it starts get the job's variables but not the "
    "step's, and srun from a cell needs --overlap (workshop.cluster.srun_command adds "
    "it)"
)


def _in_a_job(monkeypatch, **variables: str) -> None:
    """This process inside Slurm job 8 (its variables), with no cgroup limits."""
    from workshop import allocation

    monkeypatch.setattr(allocation, "cgroup_cpus", lambda *a: [])
    monkeypatch.setattr(allocation, "cgroup_memory", lambda *a: None)
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_inside_a_job_the_doctor_reads_the_jobs_cpus_and_memory(clean_env, monkeypatch):
    # A kernel of a portal: one task of step 0 of a job of 1 CPU and 300 MiB on a
    # node of 64 cores, and Slurm's task/none (no binding: affinity is every core).
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}
    _in_a_job(monkeypatch, SLURM_CPUS_ON_NODE="1", SLURM_MEM_PER_NODE="300", **step)
    values = as_dict(collect_rows())
    assert values["CPU", "cores"] == (
        "64 (1 usable by this process: Slurm job 8 on this node: SLURM_CPUS_ON_NODE=1)"
    )
    assert values["Memory", "available"].endswith(
        "of a 0.3 GiB limit (Slurm job 8 on this node)"
    )
    assert values["Slurm", "CPUs on node"] == "1"
    assert values["Slurm", "memory on node"] == "0.3 GiB"
    assert values["Slurm", "job step"] == STEP_ROW
    assert (
        values["Workshop defaults", "world_size"] == "2 (CPU ranks, for 1 usable core)"
    )


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_a_kernel_bound_to_fewer_cores_than_its_job_is_told(clean_env, monkeypatch):
    # srun without --cpus-per-task (Slurm 22.05 and later) binds the kernel to 1 core
    # of the job's 4 (task/affinity): every rank it forks inherits that one core.
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    _in_a_job(monkeypatch, SLURM_CPUS_ON_NODE="4")
    values = as_dict(collect_rows())
    assert values["CPU", "cores"] == "64 (1 usable by this process: CPU affinity)"
    assert values["CPU", "note"].startswith(
        "this process may run on 1 core (CPU affinity), but Slurm job 8 has 4 on this "
        "node: ranks started here share those. Start the kernel's step with all"
    )


def test_gpus_of_the_job_that_torch_does_not_see_are_named(bin_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    _in_a_job(monkeypatch, SLURM_JOB_GPUS="0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    values = as_dict(collect_rows())
    assert values["GPUs", "Slurm job"] == (
        "has 2 GPUs on this node, but torch sees 0: check CUDA_VISIBLE_DEVICES "
        "(not set)"
    )


def test_salloc_without_gpus_or_partition(clean_env, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    values = as_dict(collect_rows())
    assert values["Slurm", "job id"] == "7"
    assert values["Slurm", "partition"] == "not set"
    assert values["Slurm", "nodes"] == "not set"
    assert values["Slurm", "GPUs on node"] == "none requested"


def test_a_broken_probe_becomes_an_error_row_not_a_crash(clean_env, monkeypatch):
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = io.StringIO()
    rows = doctor(file=out)
    assert errors(rows) == [
        Row(
            "This process",
            "error",
            "ValueError: environment variable RANK='x' is not an integer; unset it "
            "or give it a whole number",
        )
    ]
    assert list(dict.fromkeys(row.section for row in rows)) == SECTIONS
    assert "RANK='x' is not an integer" in out.getvalue()


# --- the table -----------------------------------------------------------------------


def test_format_rows_aligns_values_under_section_headings():
    rows = [
        Row("CPU", "cores", "8"),
        Row("Backends", "gloo", "available"),
        Row("Backends", "nccl", "not available"),
    ]
    assert format_rows(rows).splitlines() == [
        "CPU",
        "  cores  8",
        "",
        "Backends",
        "  gloo   available",
        "  nccl   not available",
    ]


def test_format_rows_wraps_long_values_within_the_width():
    long = " ".join(["word"] * 60)
    text = format_rows([Row("S", "item", long), Row("S", "x" * 40, "short")])
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert lines[1].startswith("  item")
    # continuation lines start under the first value
    value_column = lines[1].index("word")
    assert all(line.index("word") == value_column for line in lines[2:-2])
    # an item too long for the column gets its value on the next line
    assert lines[-2] == "  " + "x" * 24 + "x" * 16
    assert lines[-1].strip() == "short"
    assert " ".join(text.split()).count("word") == 60


def test_doctor_prints_the_table_and_returns_the_rows(clean_env, capsys):
    rows = doctor()
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("workshop ") and "doctor" in lines[0]
    assert set(lines[1]) == {"="}
    assert max(len(line) for line in lines) <= WIDTH
    assert re.search(rf"^  torch +{re.escape(torch.__version__)} \(", out, re.MULTILINE)
    assert out.rstrip("\n").endswith(format_rows(rows))


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() == 0,
    reason="needs a CUDA GPU to show forking still works",
)
def test_a_rank_forked_after_doctor_can_use_the_gpu():
    code = textwrap.dedent(
        """\
        import io, os, torch, workshop
        workshop.doctor(io.StringIO())
        pid = os.fork()
        if pid == 0:
            try:
                torch.ones(1, device="cuda").add_(1)
                torch.cuda.synchronize()
                os._exit(0)
            except BaseException as e:
                print("child:", e, flush=True)
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=repo_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("child exit 0"), result.stdout


# --- python -m workshop --------------------------------------------------------------


def test_main_doctor_returns_0(clean_env, capsys):
    assert main(["doctor"]) == 0
    assert "Workshop defaults" in capsys.readouterr().out


def test_main_without_a_command_prints_help_and_returns_2(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m workshop")
    assert "doctor" in err


def test_main_with_an_unknown_command_is_argparses_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
