"""The workshop inside a Slurm job step, as a cluster's Jupyter portal runs it.

JupyterHub's batchspawner submits a batch script that runs ``srun
jupyterhub-singleuser``: the notebook kernel is one task of a job step, as a user
without privileges, with the step's variables (``SLURM_PROCID=0``, ``SLURM_STEP_ID``,
``SLURM_CPUS_ON_NODE``, ...) and the job's CPUs. Here a script plays that kernel on
the private two-node cluster (one cluster for this module): ``sbatch`` of a script
that runs ``srun --export=ALL python kernel.py``, as the user ``workshop-site`` (made
by scripts/test_site.sh) or ``nobody`` where this runs as root, with 1 CPU and
400 MiB. The kernel launches ranks, runs ``srun`` and ``mpirun`` from a "cell",
submits a job, and asks the doctor, the node check and the monitor; the tests read
what it found. Then a job is cancelled while its ranks run, and nothing of it may be
left on the machine. A site's CPU binding (task/affinity) is stood in for with a
``SLURM_CPU_BIND`` in the kernel: the private cluster binds nothing (task/none).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, needs_private_slurm, open_to_all

pytestmark = needs_private_slurm

MARK = "WORKSHOP_IN_JOB_TEST"  # in the environment of everything the jobs start


@dataclass
class Kernel:
    """How the jobs run: as whom, with which Python, in which shared folder."""

    user: str | None  # None: as root, where no other user can run the Python
    python: str
    pythonpath: str
    folder: Path
    conf: str
    mark: str

    def env(self) -> dict[str, str]:
        """What sbatch gets, and through --export=ALL the job and its steps."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "SLURM_CONF": self.conf,
            "PYTHONPATH": self.pythonpath,
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "",  # two "nodes" on one machine share its GPUs
            "HOME": str(self.folder),
            MARK: self.mark,
        }

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``command`` as the kernel's user, in the shared folder."""
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        return subprocess.run(
            [*prefix, *command], env=self.env(), cwd=self.folder,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def submit(self, script: str, *options: str) -> str:
        """Submit ``script`` (the kernel's batch script) and return the job id."""
        path = self.folder / f"{script}.sbatch"
        path.write_text(
            "#!/bin/bash\n# As batchspawner does: the kernel is a job step.\n"
            f"srun --export=ALL {self.python} {self.folder / script}.py\n"
        )
        done = self.run("sbatch", "--parsable", f"--output={script}-%j.out",
                        *options, str(path))  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]


def _user() -> str | None:
    """A user without privileges to run the jobs as: None where this is not root."""
    if os.geteuid() != 0:
        return None
    for name in ("workshop-site", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return None


def _interpreters() -> list[tuple[str, str]]:
    """(python, PYTHONPATH) to try, best first: this one; else the system's Python
    of the same version with this environment's packages (a virtual environment
    whose base Python sits in /root is unreadable to other users)."""
    here = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [(sys.executable, str(ROOT))]
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system:
        found.append((system, here))
    return found


@pytest.fixture(scope="module")
def kernel(private_slurm):
    """The private cluster, and how its jobs run as a user without privileges."""
    with open_to_all(private_slurm):  # the user's sbatch reads its slurm.conf
        folder = Path(tempfile.mkdtemp(prefix="in-job-", dir="/tmp"))
        folder.chmod(0o777)  # the user writes its output here
        conf = os.environ["SLURM_CONF"]
        user, chosen = _user(), None
        for python, path in _interpreters():
            kernel = Kernel(user, python, path, folder, conf, uuid.uuid4().hex)
            if kernel.run(python, "-c", "import torch, workshop").returncode == 0:
                chosen = kernel
                break
        if chosen is None:  # no Python the user can run: the jobs run as root
            chosen = Kernel(
                None, sys.executable, str(ROOT), folder, conf, uuid.uuid4().hex
            )
        try:
            yield chosen
        finally:
            # What the jobs started and left, as stopping the cluster ended it when
            # this module had a cluster of its own; private_slurm then cancels
            # whatever job is left.
            _kill_marked(chosen.mark)
            shutil.rmtree(folder, ignore_errors=True)


def _marked(mark: str) -> list[int]:
    """Processes that carry ``mark`` in their environment: those the jobs started."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _kill_marked(mark: str) -> None:
    for pid in _marked(mark):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _wait_for(done, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:g} s")


def _state(kernel: Kernel, job: str) -> str:
    done = kernel.run("scontrol", "show", "job", "-o", job)
    for word in done.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "GONE"


# What the kernel does, cell by cell, and what it found, as one JSON line.
KERNEL = """
import json, os, shutil, sys
from pathlib import Path

# A site with task/affinity binds the kernel's task: srun exports its mask.
os.environ["SLURM_CPU_BIND"] = "quiet,mask_cpu:0x1"
import workshop
from workshop import allocation, env
from workshop.allocation import cpu_limit, memory_limit
from workshop.instructor.check_node import allocation_line
from workshop.machine.doctor import collect_rows
from workshop.machine.monitor_probes import scope_line

HERE = Path(__file__).parent
found = {"kernel": {
    "launcher": env.rank_info().launcher, "cores": env.usable_cores(),
    "source": cpu_limit().source, "default_world_size": env.default_world_size(0),
    "memory_limit": memory_limit().limit, "node_cores": os.cpu_count(),
}}


def rank_view():
    import torch
    import torch.distributed as dist

    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    info = workshop.env.rank_info()
    return {"rank": info.rank, "world_size": info.world_size,
            "local_rank": info.local_rank, "launcher": info.launcher,
            "sum": int(total), "threads": torch.get_num_threads(),
            "task_variables": allocation.task_variables(),
            "job": os.environ.get("SLURM_JOB_ID")}


for n in (1, 3):
    result = workshop.launch(rank_view, world_size=n, backend="gloo", show="none",
                             timeout=120)
    found[f"launch {n}"] = result.returns

# A "cell" that starts a step of its own, and one that starts Open MPI's ranks.
command = workshop.cluster.srun_command(HERE / "task.py", ntasks=1)
ran = workshop.cluster.run_command(command, timeout=60, show=False, check=False)
found["srun"] = {"command": command[:2], "code": ran.returncode,
                 "stdout": ran.stdout, "stderr": ran.stderr[-500:]}
if shutil.which("mpirun"):
    command = workshop.cluster.mpirun_command(HERE / "task.py", np=2)
    ran = workshop.cluster.run_command(command, timeout=60, show=False, check=False)
    found["mpirun"] = {"code": ran.returncode, "stdout": ran.stdout,
                       "stderr": ran.stderr[-500:]}

# A batch job submitted from the kernel, with --mem-per-cpu where the kernel's job
# has --mem: srun in it fails if it inherits the kernel job's SLURM_MEM_PER_NODE.
job = workshop.cluster.submit(HERE / "inner.sbatch", nodes=1,
                              options={"mem-per-cpu": 100}, cwd=HERE, output_dir=HERE)
status = job.wait(timeout=60, show=False)
found["sbatch"] = {"state": status.state, "output": job.output()}

found["doctor"] = {f"{r.section}|{r.item}": r.value for r in collect_rows()}
found["monitor"] = scope_line()
found["check"] = allocation_line()
print("FOUND " + json.dumps(found), flush=True)
"""

# A task of srun's or mpirun's: what it sees of its launcher.
TASK = """
import json, os
names = ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_CPU_BIND", "OMPI_COMM_WORLD_RANK")
print("TASK " + json.dumps({n: os.environ.get(n) for n in names}), flush=True)
"""

INNER = """#!/bin/bash
echo "step=${SLURM_STEP_ID:-none} mem=${SLURM_MEM_PER_NODE:-none}" \\
    "bind=${SLURM_CPU_BIND:-none}"
srun hostname >/dev/null && echo "srun ran"
"""


@pytest.fixture(scope="module")
def found(kernel) -> dict:
    """Run the kernel's job to its end; what it found."""
    for name, text in {"kernel.py": KERNEL, "task.py": TASK,
                       "inner.sbatch": INNER}.items():  # fmt: skip
        (kernel.folder / name).write_text(textwrap.dedent(text).lstrip())
    job = kernel.submit("kernel", "--ntasks=1", "--cpus-per-task=1", "--mem=400")
    _wait_for(lambda: _state(kernel, job) in ("COMPLETED", "FAILED", "GONE"), 240,
              f"job {job} did not end")  # fmt: skip
    output = (kernel.folder / f"kernel-{job}.out").read_text()
    lines = [ln for ln in output.splitlines() if ln.startswith("FOUND ")]
    assert lines, f"the kernel found nothing; its output:\n{output}"
    return json.loads(lines[-1].removeprefix("FOUND "))


def test_the_kernel_is_a_task_of_a_step_and_reads_the_jobs_cpus(found):
    kernel = found["kernel"]
    assert kernel["launcher"] == "srun"  # rank 0 of a one-task step: the kernel
    assert kernel["cores"] == 1  # the job's one CPU, not the node's
    assert kernel["default_world_size"] == 2  # 2 ranks for 1 core, not 4
    assert kernel["memory_limit"] == 400 << 20


def test_launched_ranks_know_their_own_place_not_the_kernels(found):
    for n in (1, 3):
        ranks = found[f"launch {n}"]
        assert [r["rank"] for r in ranks] == list(range(n))
        assert [r["local_rank"] for r in ranks] == list(range(n))
        for r in ranks:
            assert (r["world_size"], r["launcher"]) == (n, "workshop")
            assert r["sum"] == n * (n + 1) // 2  # the all-reduce worked
            # Not SLURM_PROCID=0, SLURM_STEP_ID, nor the kernel's CPU binding.
            assert r["task_variables"] == []
            assert r["job"] is not None  # still inside the job
            assert r["threads"] == 1  # the job's 1 core, not the node's cores


def test_srun_from_a_cell_overlaps_the_kernels_step(found):
    srun = found["srun"]
    assert srun["command"] == ["srun", "--overlap"]
    assert srun["code"] == 0, srun["stderr"]
    task = json.loads(srun["stdout"].split("TASK ", 1)[1])
    assert task["SLURM_PROCID"] == "0"
    assert task["SLURM_STEP_ID"] not in (None, "0")  # a step of its own
    assert task["SLURM_CPU_BIND"] is None  # not the kernel's binding


def test_mpirun_from_a_cell_runs_its_ranks_here(found):
    if "mpirun" not in found:
        pytest.skip("no mpirun on this machine (apt install openmpi-bin)")
    mpirun = found["mpirun"]
    assert mpirun["code"] == 0, mpirun["stderr"]
    # Two ranks share mpirun's stdout, and a line of one can land in the middle of
    # the other's (seen once: '...}TASK {...}'), so read each TASK record wherever
    # it is.
    ranks = sorted(
        json.loads(record)["OMPI_COMM_WORLD_RANK"]
        for record in re.findall(r"TASK (\{[^{}]*\})", mpirun["stdout"])
    )
    assert ranks == ["0", "1"]


def test_a_job_submitted_from_the_kernel_inherits_none_of_its_jobs_variables(found):
    sbatch = found["sbatch"]
    assert sbatch["state"] == "COMPLETED", sbatch["output"]
    assert sbatch["output"].splitlines() == [
        "step=none mem=none bind=none",
        "srun ran",
    ]


def test_doctor_check_and_monitor_read_the_allocation(found):
    doctor, kernel = found["doctor"], found["kernel"]
    if kernel["node_cores"] > 1:
        # The job's variable, unless this machine itself (a container's cgroup, an
        # affinity mask) already allows one core only.
        job = doctor["Slurm|job id"]
        assert kernel["source"] in (
            f"Slurm job {job} on this node: SLURM_CPUS_ON_NODE=1",
            "CPU affinity", "cgroup cpu.max", "cgroup cpuset.cpus.effective",
            "cgroup cpuset.effective_cpus",
        )  # fmt: skip
        assert doctor["CPU|cores"] == (
            f"{kernel['node_cores']} (1 usable by this process: {kernel['source']})"
        )
        assert found["monitor"].startswith(
            f"CPU % and memory are the whole node's ({kernel['node_cores']} cores); "
            f"this process may use 1 of {kernel['node_cores']} cores"
        )
    assert doctor["Slurm|CPUs on node"] == "1"
    assert doctor["Slurm|memory on node"] == "0.4 GiB"
    assert doctor["Slurm|job step"].startswith("this process is a task of a job step")
    job = doctor["Slurm|job id"]
    assert doctor["Memory|available"].endswith(
        f"GiB limit (Slurm job {job} on this node)"
    )
    assert doctor["Workshop defaults|world_size"] == "2 (CPU ranks, for 1 usable core)"
    assert found["check"].startswith(f"inside Slurm job {doctor['Slurm|job id']}: ")


# The ranks start a child each and a daemon that leaves its parent (forks twice): Slurm
# without cgroups (proctrack/linuxproc) follows parents and cannot find the daemon.
STUCK = """
import os, subprocess, time
import workshop


def stuck():
    import torch.distributed as dist

    subprocess.Popen(["sleep", "301"])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(302)
        os._exit(0)
    print("ready", flush=True)
    time.sleep(300)


workshop.launch(stuck, world_size=2, backend="gloo", show="lines", timeout=280)
"""


def test_nothing_of_a_launch_outlives_scancel(kernel):
    (kernel.folder / "stuck.py").write_text(textwrap.dedent(STUCK).lstrip())
    job = kernel.submit("stuck", "--ntasks=1", "--cpus-per-task=1")
    output = kernel.folder / f"stuck-{job}.out"
    try:
        ready = {"[rank 0] ready", "[rank 1] ready"}
        _wait_for(
            lambda: output.exists() and ready <= set(output.read_text().splitlines()),
            120, f"the ranks of job {job} were not ready")  # fmt: skip
        # Both ranks, their children and their daemons are running now.
        assert len(_marked(kernel.mark)) >= 8
        cancelled = kernel.run("scancel", job)
        assert cancelled.returncode == 0, cancelled.stderr
        left = []
        try:
            _wait_for(lambda: not _marked(kernel.mark), 20, "processes were left")
        except AssertionError:
            left = [_describe(pid) for pid in _marked(kernel.mark)]
        assert left == [], f"left running after scancel {job}: {left}"
        if kernel.user == "workshop-site":  # nothing of the test user's at all
            assert _running_as(kernel.user) == []
    finally:
        _kill_marked(kernel.mark)


def _describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"pid {pid} (gone)"


def _running_as(user: str) -> list[str]:
    """The user's processes that still run. A zombie has ended, and waits only for
    its parent (a container's first process may never reap it); a process inside
    exit() is gone a moment later, as the launcher's sweep counts it (CI once saw
    one listed as 'R [w50x.1]', its command line already released)."""
    from workshop._procs import proc_stat as _stat

    ps = subprocess.run(["ps", "-u", user, "-o", "pid=,stat=,args="],
                        capture_output=True, text=True)  # fmt: skip
    running = []
    for line in ps.stdout.splitlines():
        pid, stat, args = [*line.split(None, 2), "", ""][:3]
        state = _stat(pid)
        if not stat.startswith("Z") and state is not None and state[1] != b"X":
            running.append(f"{stat} {args}")
    return running
