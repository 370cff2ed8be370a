"""Run real launchers (``torchrun``, ``mpirun``) from a notebook cell (notebook 03).

``torchrun_command`` and ``mpirun_command`` build the lines a learner would type on a
cluster; ``run_command`` runs one and ``run_commands`` several at once (two torchrun
agents standing in for two nodes), output shown live. Whatever happens, every
process they started is stopped: each runs under a keeper (``reaper.py``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..allocation import slurm_allocation, usable_cores
from .arguments import check_count, check_script
from .gpu_split import split_for
from .ports import quiet_ports
from .run import check_program, failure_message, run_all, timeout_message

__all__ = [
    "CommandError",
    "CommandResult",
    "free_port",
    "mpirun_command",
    "run_command",
    "run_commands",
    "torchrun_command",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the range the
    system hands out to outgoing connections (``ports.py``).

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    return quiet_ports(1)[0]


def torchrun_command(
    script: str | os.PathLike,
    *args: object,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "workshop",
    max_restarts: int = 0,
    python: str | None = None,
) -> list[str]:
    """The ``torchrun`` command line that starts ``script`` on one node of a job.

    Args:
        script: the training script; relative paths start from the current folder.
        *args: the script's own arguments.
        nproc_per_node: processes (ranks) on each node, usually one per GPU.
        nnodes: nodes in the job, each running this command (needs
            ``rdzv_endpoint`` above 1).
        rdzv_endpoint: "host:port" where the agents meet (c10d); None:
            ``--standalone``.
        rdzv_id: the job's name at the rendezvous; every node passes the same.
        max_restarts: how many times torchrun restarts all ranks after a failure.
        python: the interpreter whose ``torchrun`` to use (default: this one's), else
            ``python -m torch.distributed.run``.

    Returns:
        The command as a list of words.

    Raises:
        ValueError: a count below its minimum, or a missing or malformed endpoint.
        FileNotFoundError: ``script`` does not exist.

    Example:
        >>> torchrun_command("slurm/train_ddp.py", "--epochs", 1, nproc_per_node=2)[1:]
        ['--standalone', '--nproc_per_node=2', 'slurm/train_ddp.py', '--epochs', '1']
    """
    check_count("nproc_per_node", nproc_per_node, 1, "nproc_per_node=2")
    check_count("nnodes", nnodes, 1, "nnodes=2")
    check_count("max_restarts", max_restarts, 0, "max_restarts=1")
    check_script(script)
    if nnodes > 1 and rdzv_endpoint is None:
        raise ValueError(
            f"nnodes={nnodes} needs rdzv_endpoint='host:port', where the torchrun of "
            "every node meets: the first node's host name and a free port on it, or "
            'rdzv_endpoint=f"127.0.0.1:{free_port()}" when all the nodes are this '
            "machine"
        )
    python = python or sys.executable
    beside = Path(shutil.which(python) or python).parent / "torchrun"
    words = (
        [str(beside)] if beside.exists() else [python, "-m", "torch.distributed.run"]
    )
    if rdzv_endpoint is None:
        words.append("--standalone")
    else:
        host, _, port = rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"rdzv_endpoint={rdzv_endpoint!r} is not 'host:port'; pass, e.g., "
                'f"127.0.0.1:{free_port()}" or "node001:29400"'
            )
        words.append(f"--nnodes={nnodes}")
    words.append(f"--nproc_per_node={nproc_per_node}")
    if rdzv_endpoint is not None:
        words += ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}"]
        words.append(f"--rdzv_id={rdzv_id}")
    if max_restarts:
        words.append(f"--max_restarts={max_restarts}")
    return [*words, str(script), *map(str, args)]


def mpirun_command(
    script: str | os.PathLike,
    *args: object,
    np: int,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    python: str | None = None,
    options: Sequence[str] = (),
) -> list[str]:
    """The Open MPI ``mpirun`` command line that starts ``np`` ranks of ``script``
    on this machine (inside a Slurm job, kept off the job's allocation).

    Args:
        script: the training script; relative paths start from the current folder.
        *args: the script's own arguments.
        np: number of ranks.
        master_addr: the host of rank 0, where the ranks meet (``MASTER_ADDR``).
        master_port: a free port there (``MASTER_PORT``); None picks one here.
        python: the interpreter that runs the script (default: this one).
        options: more mpirun options, as words, e.g. ``["--bind-to", "core"]``.

    Returns:
        The command as a list of words.

    Raises:
        ValueError: ``np`` below 1, a port out of range, or ``options`` a string.
        FileNotFoundError: no ``mpirun`` on PATH, or ``script`` does not exist.

    Example:
        >>> mpirun_command("slurm/train_ddp.py", np=2, master_port=29400)[:3]
        ['mpirun', '-np', '2']
    """
    check_count("np", np, 1, "np=2")
    if master_port is not None and (
        isinstance(master_port, bool)
        or not isinstance(master_port, int)
        or not 0 < master_port < 65536
    ):
        raise ValueError(
            f"master_port must be a port number 1-65535, got {master_port!r}; pass "
            "master_port=None to pick a free one"
        )
    if isinstance(options, str):
        raise ValueError(
            f"options must be a list of words, got the string {options!r}; pass "
            f"{_listed(options)}"
        )
    check_program("mpirun", os.environ.get("PATH"))
    check_script(script)
    words = ["mpirun", "-np", str(np)]
    if np > usable_cores():  # inside a Slurm job: the job's cores on this node
        words.append("--oversubscribe")  # more ranks than cores: allowed, but slower
    if os.geteuid() == 0:
        # Open MPI refuses to run as root unless told to; in a container (this
        # workshop's image) everything runs as root. On a cluster you never are.
        words.append("--allow-run-as-root")
    not_launchers = []  # Open MPI's process launchers (plm) not to use
    if not (shutil.which("ssh") or shutil.which("rsh")):
        # Open MPI 4 refuses to start, even on one node, when its remote-shell
        # launcher finds neither ssh nor rsh (as in a slim container); without that
        # launcher it starts the ranks here.
        not_launchers.append("rsh")
    if slurm_allocation().inside:
        # Inside a Slurm job (a notebook kernel on a cluster's portal), Open MPI
        # takes its slots from the job (one per task: too few for np ranks of a
        # one-task job) and starts its daemons with srun, which waits forever for
        # the CPUs the kernel's own job step holds. These ranks run on this node, so
        # Open MPI is kept off Slurm's allocation (ras) and launcher (plm).
        words += ["--mca", "ras", "^slurm"]
        not_launchers.append("slurm")
    if not_launchers:  # one --mca per parameter: Open MPI refuses a repeated one
        words += ["--mca", "plm", "^" + ",".join(not_launchers)]
    port = free_port() if master_port is None else master_port
    words += ["-x", f"MASTER_ADDR={master_addr}", "-x", f"MASTER_PORT={port}"]
    if os.environ.get("PYTHONPATH"):
        words += ["-x", "PYTHONPATH"]  # so the ranks import what this kernel does
    words += [str(option) for option in options]
    return [*words, python or sys.executable, str(script), *map(str, args)]


@dataclass
class CommandResult:
    """What one command did: exit code (-N: signal N), output as shown, seconds."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    label: str | None = None


class CommandError(RuntimeError):
    """A command failed or ran past its timeout; ``.results`` holds every
    command's :class:`CommandResult`, output included."""

    def __init__(self, message: str, results: list[CommandResult]) -> None:
        """The message, and the results of the commands that ran."""
        super().__init__(message)
        self.results = results


def run_command(
    command: Sequence[str],
    *,
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float = 600.0,
    check: bool = True,
    show: bool = True,
    grace: float = 5.0,
) -> CommandResult:
    """Run ``command``, show its output live in the cell (torchrun's log lines
    tidied), and return it. On ``timeout``, an error, an interrupt or the kernel's
    death, every process it started is stopped (SIGTERM, ``grace`` s, SIGKILL).

    Args:
        command: the program and its arguments, e.g. from :func:`torchrun_command`.
        env: variables to add; a value of None removes the variable.
        cwd: the folder to run in (default: the current one).
        timeout: seconds before everything is stopped and CommandError raised.
        check: raise :class:`CommandError` if the command exits with an error.
        show: show the output live; it is returned either way.
        grace: seconds between SIGTERM and SIGKILL when stopping.

    Returns:
        A :class:`CommandResult`.

    Raises:
        CommandError: a non-zero exit (with ``check``), or ``timeout`` passed.
        FileNotFoundError: the program is not installed, with what to install.
        TypeError: ``command`` is a string, not a list of words.
        KeyboardInterrupt: the kernel was interrupted; everything was stopped.

    Example:
        >>> import sys
        >>> run_command([sys.executable, "-c", "print('hi')"], show=False).stdout
        'hi\\n'
    """
    _words(command, "run_command(command)")
    return run_commands(
        [command], env=env, cwd=cwd, timeout=timeout, check=check, show=show,
        grace=grace, labels=[None],
    )[0]  # fmt: skip


def run_commands(
    commands: Sequence[Sequence[str]],
    *,
    labels: Sequence[str | None] | None = None,
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float = 600.0,
    check: bool = True,
    show: bool = True,
    grace: float = 5.0,
) -> list[CommandResult]:
    """Run several commands at once, as the nodes of one job, each line shown with
    its label; one failing stops the others. Torchrun agents share this machine's
    GPUs (``gpu_split.py``).

    Args:
        commands: the commands, e.g. one :func:`torchrun_command` per node.
        labels: a name for each (default "command 0", "command 1", ...).
        env, cwd, timeout, check, show, grace: as for :func:`run_command`; ``env``
            and ``cwd`` apply to every command, ``timeout`` to all of them together.

    Returns:
        One :class:`CommandResult` per command, in order.

    Raises:
        CommandError, FileNotFoundError, KeyboardInterrupt: as :func:`run_command`.
        TypeError: ``commands`` is not a list of commands, each a list of words.

    Example:
        >>> import sys
        >>> hi = [sys.executable, "-c", "print('hi')"]
        >>> [r.stdout for r in run_commands([hi, hi], show=False)]
        ['hi\\n', 'hi\\n']
    """
    if isinstance(commands, (str, bytes)):
        line = commands.decode() if isinstance(commands, bytes) else commands
        raise TypeError(
            f"run_commands takes a list of commands, each a list of words; got the "
            f"string {line!r}. For one command call run_command({_listed(line)}), "
            f"or run_commands([{_listed(line)}])"
        )
    commands = list(commands)
    if commands and all(isinstance(c, (str, os.PathLike)) for c in commands):
        # Its words would each be taken for a command, and their letters for words.
        words = [os.fspath(c) for c in commands]
        each = [_listed(c) for c in words]
        raise TypeError(
            f"run_commands takes a list of commands, each a list of words; got a "
            f"list of strings, {words!r}. If that is one command, call "
            f"run_command({words!r}); if each string is a command, split each: "
            f"run_commands([{', '.join(each)}])"
        )
    commands = [_words(c, f"run_commands: command {i}") for i, c in enumerate(commands)]
    labels = list(labels) if labels else [f"command {i}" for i in range(len(commands))]
    split = split_for(commands, env)
    if show and split.note:
        print(split.note, flush=True)
    run = run_all(commands, labels, env, cwd, timeout, show, grace, split.envs)
    results = [
        CommandResult(c, p.returncode, run.text("stdout", i), run.text("stderr", i),
                      run.seconds[i] or 0.0, labels[i])
        for i, (c, p) in enumerate(zip(commands, run.procs, strict=True))
    ]  # fmt: skip
    if run.outcome == "timeout":
        raise CommandError(timeout_message(commands, timeout, grace), results)
    if check and run.first_failed is not None:
        failed = results[run.first_failed]
        raise CommandError(
            failure_message(failed.command, failed.returncode, failed.stderr,
                            others_stopped=len(commands) > 1),
            results,
        )  # fmt: skip
    return results


def _listed(line: str) -> str:
    """A shell line as the list of words it stands for, as Python source."""
    try:
        return repr(shlex.split(line))
    except ValueError:  # unbalanced quotes: show the line split on spaces
        return repr(line.split())


def _words(command: object, what: str) -> list[str]:
    """``command`` as a list of words; a string is refused (its letters would be
    taken for words)."""
    if isinstance(command, (str, bytes)):
        text = command.decode() if isinstance(command, bytes) else command
        raise TypeError(
            f"{what} must be a list of words, not a string: got {text!r}. Pass "
            f"{_listed(text)} (shlex.split({text!r}) gives it); no shell runs the "
            "command, so pipes, $VARIABLES and && would not work in a string anyway"
        )
    if isinstance(command, os.PathLike) or not isinstance(command, Sequence):
        raise TypeError(
            f"{what} must be a list of words, like [sys.executable, 'train.py'], "
            f"got {command!r}"
        )
    return [str(word) for word in command]
