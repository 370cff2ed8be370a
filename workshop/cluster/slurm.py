"""Slurm from a notebook cell: write, submit, watch and read batch jobs.

Notebook 03 submits the scripts in ``slurm/`` and watches them::

    cluster = slurm_cluster()       # a real cluster, or a private two-node one here
    print(cluster)
    job = submit("slurm/hello_ranks.sbatch", nodes=1, ntasks_per_node=2,
                 gpus_per_node=0, options={"cpus-per-task": 1})
    job.wait()                      # job 12: PENDING / RUNNING on vm / COMPLETED ...
    print(job.output())

:func:`submit` prints the ``sbatch`` line it runs, for a learner to type on a login
node; output files go to ``runs/`` at the repository root.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._procs import interrupted
from ..ranks.streams import display_path
from .slurm_here import conf_problem
from .slurm_options import (
    find_script,
    gives_output,
    project_root,
    relative,
    sbatch_environment,
    sbatch_options,
)
from .slurm_status import (
    JobStatus,
    parse_scontrol,
    status_from_sacct,
    status_from_scontrol,
)

__all__ = ["SlurmJob", "submit"]

_sleep = time.sleep  # the tests replace it to interrupt a wait
_NOT_INSTALLED = (
    "{tool} not found: Slurm's commands are not on PATH. On a cluster, run this on a "
    "login node or inside an allocation (some sites need `module load slurm`); on "
    "your own Debian/Ubuntu machine, `make setup` as root installs slurm-wlm, and "
    "slurm_cluster() starts a private cluster"
)


def _check_ready(tool: str) -> None:
    """Refuse a missing ``tool``, or a ``SLURM_CONF`` that names no file (every Slurm
    command would retry reading it for 60 s)."""
    if shutil.which(tool) is None:
        raise FileNotFoundError(_NOT_INSTALLED.format(tool=tool))
    problem = conf_problem()
    if problem:
        raise FileNotFoundError(
            problem + ", or call slurm_cluster(), which sets it when it starts a "
            "private cluster"
        )


def _slurm(command: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a Slurm command, text captured; RuntimeError past ``timeout``."""
    _check_ready(command[0])
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"`{shlex.join(command)}` did not answer in {timeout:g} s; is the "
            "controller up? Check with `scontrol ping`"
        ) from None


@dataclass
class SlurmJob:
    """A submitted batch job: its id, the script and where its output goes.

    Attributes:
        job_id: Slurm's id of the job.
        script: the batch script.
        output_path: the file Slurm writes the job's stdout and stderr to.
        command: the ``sbatch`` command that submitted it.
    """

    job_id: str
    script: Path
    output_path: Path
    command: list[str] = field(default_factory=list)

    def status(self) -> JobStatus:
        """The job's state with its reason, nodes, exit code and run time, from
        ``scontrol``, else ``sacct``, else UNKNOWN with why; never raises.

        Example:
            >>> job.status().line()                     # doctest: +SKIP
            'job 12: PENDING (Resources)'
        """
        try:
            done = _slurm(["scontrol", "show", "job", "-o", self.job_id])
        except (FileNotFoundError, RuntimeError) as exc:
            return JobStatus(self.job_id, "UNKNOWN", str(exc), source="error")
        found = status_from_scontrol(self.job_id, done.stdout)
        if found is not None:
            return found
        said = done.stderr.strip() or done.stdout.strip()
        if done.returncode != 0 and "Invalid job id" not in said:
            return JobStatus(
                self.job_id, "UNKNOWN", f"scontrol failed: {said}", source="error"
            )
        try:
            acct = _slurm(
                ["sacct", "-j", self.job_id, "-n", "-P", "-X", "-o",
                 "JobID,State,ExitCode,Elapsed,NodeList"]
            )  # fmt: skip
        except (FileNotFoundError, RuntimeError) as exc:
            why = str(exc)
        else:
            found = status_from_sacct(self.job_id, acct.stdout)
            if found is not None:
                return found
            why = (acct.stderr.strip() or "it has no record of the job").splitlines()
            why = why[-1]
        return JobStatus(
            self.job_id,
            "UNKNOWN",
            f"scontrol no longer knows job {self.job_id} and sacct cannot tell: "
            f"{why}; its output may still be in {display_path(self.output_path)}",
            source="forgotten",
        )

    def state(self) -> str:
        """Slurm's state of the job (PENDING, RUNNING, COMPLETED...), or UNKNOWN.

        Example:
            >>> job.state()                             # doctest: +SKIP
            'RUNNING'
        """
        return self.status().state

    def wait(
        self, timeout: float = 600, poll: float = 1.0, show: bool = True
    ) -> JobStatus:
        """Wait for the job to end, printing each change of state on one line.

        Args:
            timeout: seconds to wait; the job is not cancelled when they run out.
            poll: seconds between two looks at the job.
            show: print each change of state as it happens.

        Returns:
            The final :class:`JobStatus`.

        Raises:
            TimeoutError: still pending or running after ``timeout``; it keeps
                running.
            KeyboardInterrupt: the kernel was interrupted; the job was cancelled.

        Example:
            >>> job.wait(timeout=120)                   # doctest: +SKIP
            job 12: PENDING (None)
            job 12: RUNNING on vm
            job 12: COMPLETED, exit code 0, in 4 s
        """
        deadline = time.monotonic() + timeout
        shown = None
        try:
            while True:
                status = self.status()
                if show and (status.state, status.reason) != shown:
                    more = ""
                    if status.finished and status.state != "COMPLETED":
                        more = f"; output in {display_path(self.output_path)}"
                    print(status.line() + more, flush=True)
                    shown = (status.state, status.reason)
                if status.finished:
                    return status
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"job {self.job_id} is still {status.state} after "
                        f"{timeout:g} s; it was not cancelled. Wait longer with "
                        f"job.wait(timeout=...), or cancel it with job.cancel() "
                        f"(scancel {self.job_id})"
                    )
                _sleep(min(poll, left))
        except KeyboardInterrupt:  # the stop button: leave no allocation running
            self.cancel()
            final = self._settle(15)
            # Two lines in the cell instead of a traceback through the polling loop.
            raise interrupted(
                f"interrupted; cancelled job {self.job_id} (scancel {self.job_id})"
                f"\n{final.line()}"
            ) from None

    def _settle(self, timeout: float) -> JobStatus:
        """The status once the job ended, or the last one after ``timeout``."""
        deadline = time.monotonic() + timeout
        status = self.status()
        while not status.finished and time.monotonic() < deadline:
            time.sleep(0.2)
            status = self.status()
        return status

    def output(self) -> str:
        """What the job wrote to its output file (stdout and stderr) so far.

        Raises:
            FileNotFoundError: not there yet (Slurm creates it when the job starts).

        Example:
            >>> print(job.output())                     # doctest: +SKIP
        """
        if not self.output_path.is_file():
            raise FileNotFoundError(
                f"job {self.job_id} has no output yet: {self.output_path} does not "
                f"exist (the job is {self.state()}); Slurm creates it when the job "
                "starts, so wait with job.wait() and ask again"
            )
        return self.output_path.read_text(errors="replace")

    def cancel(self) -> None:
        """Cancel the job (``scancel``); nothing happens to a job that ended.

        Raises:
            RuntimeError: scancel failed; the message has what it said.

        Example:
            >>> job.cancel()                            # doctest: +SKIP
        """
        done = _slurm(["scancel", self.job_id])
        if done.returncode != 0:
            raise RuntimeError(
                f"scancel {self.job_id} failed (exit code {done.returncode}): "
                f"{done.stderr.strip()}"
            )


def submit(
    script: str | os.PathLike[str],
    *args: str,
    nodes: int | None = None,
    ntasks_per_node: int | None = None,
    gpus_per_node: int | None = None,
    time: str | int | None = None,
    options: Mapping[str, Any] | Sequence[str] = (),
    cwd: str | os.PathLike[str] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
) -> SlurmJob:
    """Submit a batch script with ``sbatch`` (printing the line first); options here
    override the script's ``#SBATCH`` lines.

    Args:
        script: the batch script; a relative path is looked for in ``cwd``, the
            current folder, then the repository root.
        *args: arguments for the script itself (``"$@"`` inside it).
        nodes, ntasks_per_node, gpus_per_node: ``--nodes``, ``--ntasks-per-node``,
            ``--gpus-per-node`` (0 for a node without GPUs).
        time: ``--time``: "HH:MM:SS", "D-HH:MM:SS", or whole minutes.
        options: more sbatch options; see :func:`sbatch_options`.
        cwd: the job's working directory (default: the repository root).
        output_dir: the output file's folder, unless ``options`` gives
            ``--output`` (default ``runs/`` at the repository root).

    Returns:
        The :class:`SlurmJob`.

    Raises:
        FileNotFoundError: no such script or sbatch, or a missing ``SLURM_CONF``.
        ValueError, TypeError: bad options (see :func:`sbatch_options`).
        RuntimeError: sbatch refused the job.

    Example:
        >>> job = submit("slurm/train_ddp.sbatch", "--epochs", "2", nodes=1,
        ...              ntasks_per_node=2, gpus_per_node=0,
        ...              options={"cpus-per-task": 1})    # doctest: +SKIP
        sbatch --parsable --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 ...
    """
    path = find_script(script, Path(cwd) if cwd is not None else None)
    root = project_root(path)
    workdir = Path(cwd).resolve() if cwd is not None else root
    extra = sbatch_options(nodes, ntasks_per_node, gpus_per_node, time, options)
    _check_ready("sbatch")
    command = ["sbatch", "--parsable", *extra]
    pattern = None
    if not gives_output(extra):
        folder = workdir / output_dir if output_dir is not None else root / "runs"
        folder.mkdir(parents=True, exist_ok=True)
        pattern = folder.resolve() / f"{path.stem}-%j.out"
        command.append(f"--output={relative(pattern, workdir)}")
    command += [relative(path, workdir), *map(str, args)]
    # Paths as the learner would type them (../runs/... from notebooks/), which
    # are also the same on every machine.
    print(f"{shlex.join(command)}    (in {display_path(workdir)})", flush=True)
    environ, left_out = sbatch_environment()
    if left_out:
        job = os.environ.get("SLURM_JOB_ID")
        print(
            f"(inside Slurm job {job}: sbatch gets this environment without the "
            f"job's {len(left_out)} SLURM_* variables, which the new job would "
            "otherwise inherit)",
            flush=True,
        )
    try:
        done = subprocess.run(
            command,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=60,
            env=environ,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"sbatch did not answer in 60 s: is the controller up (scontrol ping)? "
            f"command: {shlex.join(command)}"
        ) from None
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        hint = (
            "no Slurm controller is configured here: call slurm_cluster() first"
            if "configuration source" in said
            else "check the options against what slurm_cluster() describes"
        )
        raise RuntimeError(
            f"sbatch refused the job (exit code {done.returncode}): {said}\n"
            f"command: {shlex.join(command)} (in {workdir})\nHINT: {hint}"
        )
    job_id = done.stdout.strip().split(";")[0]
    if pattern is not None:
        output = Path(str(pattern).replace("%j", job_id))
    else:
        output = _stdout_of(job_id, workdir)
    print(
        f"submitted job {job_id}; its output goes to {display_path(output)}",
        flush=True,
    )
    return SlurmJob(job_id, path, output, command)


def _stdout_of(job_id: str, workdir: Path) -> Path:
    """The output file Slurm chose for a job submitted with its own ``--output``."""
    pairs = parse_scontrol(_slurm(["scontrol", "show", "job", "-o", job_id]).stdout)
    return workdir / pairs.get("StdOut", f"slurm-{job_id}.out")
