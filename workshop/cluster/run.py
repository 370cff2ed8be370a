"""Several commands running at once, each under a keeper (``reaper.py``): their
output shown in the cell as it comes and kept, and all of them stopped together."""

from __future__ import annotations

import atexit
import functools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._procs import interrupted
from ..allocation import task_variables
from ..ranks.streams import Pipes, display_command, rewrite_line
from .reaper import descendants

# torchrun shares its rendezvous store with the workers; after a restart they can
# read the previous attempt's gloo/NCCL addresses from it and fail ("Gloo
# connectFullMesh failed ... Connection refused") or hang (pytorch issue #135712).
# With this set, every rendezvous round uses a fresh store.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# Without a log folder torchrun makes one in /tmp per run and never removes it.
# PET_LOG_DIR is its --log-dir read from the environment (torch 2.4 and later): the
# command line stays as the learner would type it.
TORCHRUN_LOGS = "PET_LOG_DIR"
TORCHRUN_LOGS_PREFIX = "workshop-torchrun-"
# A stopped mpirun leaves its session folder in /tmp, so each gets a folder of its
# own, removed with the others, through the MCA parameter its version reads from the
# environment (Open MPI 4's, then 5's), leaving the command line as it is.
MPIRUN_SESSION = {4: "OMPI_MCA_orte_tmpdir_base", 5: "PRTE_MCA_prte_top_session_dir"}
MPIRUN_SESSION_PREFIX = "workshop-mpirun-"
_MPIRUNS = ("mpirun", "mpiexec", "orterun", "prterun")
_INSTALL = {
    "torchrun": "it comes with PyTorch: pip install torch, in the environment of "
    "the python that runs this notebook",
    "mpirun": "install Open MPI (apt install openmpi-bin), or on a cluster: "
    "module load openmpi",
    "srun": "Slurm's commands exist on a cluster's login and compute nodes",
}
_KEEPER = str(Path(__file__).with_name("reaper.py"))
_LINGER = 5.0  # seconds to wait for the last output once every command has ended
LIVE_COMMANDS: set[subprocess.Popen] = set()


class Run:
    """Commands started together; ``pump`` shows their output, ``stop`` ends them."""

    def __init__(
        self,
        commands: Sequence[list[str]],
        envs: Sequence[dict[str, str]],
        cwd: str | None,
        prefixes: Sequence[str],
        show: bool,
        grace: float,
    ) -> None:
        """Nothing starts until :meth:`start`."""
        self.commands, self.envs, self.cwd = commands, envs, cwd
        self.prefixes, self.show, self.grace = prefixes, show, grace
        self.procs: list[subprocess.Popen] = []
        self.pipes = Pipes()
        self.lines: dict[str, list[list[str]]] = {
            "stdout": [[] for _ in commands],
            "stderr": [[] for _ in commands],
        }
        self.seconds: list[float | None] = [None] * len(commands)
        # torchrun's log folders and mpirun's session folders, removed by close()
        self.scratch: list[str] = []
        self.first_failed: int | None = None
        self.outcome = ""
        self.open = 0
        self.started = time.monotonic()

    def start(self) -> None:
        """Start every command under its keeper, in a session of its own, with its
        scratch folder (:func:`scratch_variable`), which its keeper removes."""
        keeper = [sys.executable, "-I", _KEEPER, str(os.getpid()), str(self.grace)]
        for index, (command, env) in enumerate(
            zip(self.commands, self.envs, strict=True)
        ):
            remove = []
            variable, prefix = scratch_variable(command, env)
            if variable is not None:
                folder = tempfile.mkdtemp(prefix=prefix)
                self.scratch.append(folder)
                env = {**env, variable: folder}
                remove = ["--remove", folder]
            proc = subprocess.Popen(
                [*keeper, *remove, "--", *command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
            self.procs.append(proc)
            LIVE_COMMANDS.add(proc)
            for name in ("stdout", "stderr"):
                self.pipes.follow(index, name, getattr(proc, name))
                self.open += 1

    def pump(self, deadline: float, stop_on_failure: bool = True) -> str:
        """Show and keep output until "done", "failed" (one of several, with
        ``stop_on_failure``) or "timeout" (``deadline``, monotonic, passed)."""
        all_ended_at = None
        while True:
            self._poll()
            if all(s is not None for s in self.seconds):
                all_ended_at = all_ended_at or time.monotonic()
                if self.open == 0 or time.monotonic() > all_ended_at + _LINGER:
                    return "done"
            elif stop_on_failure and self.first_failed is not None:
                return "failed"
            if time.monotonic() > deadline:
                return "timeout"
            try:
                index, name, line = self.pipes.queue.get(timeout=0.05)
            except queue.Empty:
                continue
            self._take(index, name, line)

    def _take(self, index: int, name: str, line: str | Exception | None) -> None:
        if line is None:
            self.open -= 1
            return
        if isinstance(line, Exception):
            raise RuntimeError(f"reading the output of command {index}") from line
        text = rewrite_line(line)
        if text is None:
            return
        self.lines[name][index].append(text)
        if self.show:
            stream = sys.stdout if name == "stdout" else sys.stderr
            stream.write(f"{self.prefixes[index]}{text}\n")
            stream.flush()

    def _poll(self) -> None:
        for index, proc in enumerate(self.procs):
            if self.seconds[index] is None and proc.poll() is not None:
                self.seconds[index] = time.monotonic() - self.started
                if proc.returncode != 0 and self.first_failed is None:
                    self.first_failed = index

    def stop(self) -> None:
        """SIGTERM every keeper (which stops its tree); SIGKILL from here what is
        still there a little after the grace period."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 2.0
        try:
            for proc in self.procs:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:  # also when interrupted again while waiting
            for proc in self.procs:
                if proc.poll() is None:
                    _kill_tree(proc)
            self._poll()

    def close(self) -> None:
        """Collect the last output (a few seconds at most) and forget the keepers."""
        self.pump(time.monotonic() + 2.0, stop_on_failure=False)
        self.pipes.join(2.0)
        for proc in self.procs:
            LIVE_COMMANDS.discard(proc)
        # The keeper removed it already, unless it was killed (SIGKILL from stop)
        # or never started.
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)

    def text(self, name: str, index: int) -> str:
        """What command ``index`` printed on ``name`` ("stdout" or "stderr")."""
        return "".join(f"{line}\n" for line in self.lines[name][index])


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL everything under a keeper, then the keeper (while it lives, orphans
    are re-parented to it and stay in sight)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        tree = descendants(proc.pid)
        if not tree:
            break
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    proc.kill()
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        pass


def run_all(
    commands: list[list[str]],
    labels: list[str | None],
    env: Mapping[str, str | None] | None,
    cwd: str | os.PathLike | None,
    timeout: float,
    show: bool,
    grace: float,
    extra_env: Sequence[Mapping[str, str]] | None = None,
) -> Run:
    """Run ``commands`` to their end, or stop them all on timeout, one's failure or
    any exception; ``extra_env`` adds variables to one command's ``env``."""
    if not commands or any(not c for c in commands) or len(labels) != len(commands):
        raise ValueError(
            f"need one or more non-empty commands and a label for each; got "
            f"{len(commands)} command(s) and {len(labels)} label(s)"
        )
    for name, value in (("timeout", timeout), ("grace", grace)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(
                f"{name} must be a number of seconds above 0, got {value!r}"
            )
    prefixes = [f"[{label}] " if label else "" for label in labels]
    folder = None if cwd is None else os.fspath(cwd)
    if folder is not None and not os.path.isdir(folder):
        raise FileNotFoundError(
            f"cwd={folder!r} is not a folder (looked for from {os.getcwd()}); pass "
            "an existing folder, or leave cwd out to run here"
        )
    envs = []
    extras = extra_env or [{} for _ in commands]
    for command, prefix, extra in zip(commands, prefixes, extras, strict=True):
        child, shown = environment(command, {**(env or {}), **extra})
        check_program(command[0], child.get("PATH"), folder)
        envs.append(child)
        if show:
            print(f"{prefix}$ {display_command(command, shown, folder)}", flush=True)
    run = Run(commands, envs, folder, prefixes, show, float(grace))
    try:
        try:
            run.start()
            run.outcome = run.pump(run.started + timeout)
        finally:
            try:
                if run.outcome != "done":  # timeout, a failed node, or an exception
                    run.stop()
            finally:
                run.close()
    except KeyboardInterrupt:  # the stop button; everything is stopped by now
        # One line in the cell instead of a traceback through the keeper's pipes.
        raise interrupted(
            f"interrupted; stopped {short_names(commands)} and every process "
            f"{'it' if len(commands) == 1 else 'they'} started"
        ) from None
    return run


def environment(
    command: list[str], env: Mapping[str, str | None] | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The command's whole environment, and the part worth showing with it; without
    the kernel's Slurm task variables (an ``srun`` in it would pin every new task
    onto the kernel's cores)."""
    shown = dict(TORCHRUN_ENV) if is_torchrun(command) else {}
    child = dict(os.environ, PYTHONUNBUFFERED="1", **shown)
    for name in task_variables(child):
        del child[name]
    for key, value in (env or {}).items():
        if value is None:
            child.pop(key, None)
            shown.pop(key, None)
        else:
            child[key] = shown[key] = str(value)
    return child, shown


def is_torchrun(command: Sequence[str]) -> bool:
    """True for ``torchrun ...`` and ``python -m torch.distributed.run ...``."""
    return bool(command) and (
        Path(command[0]).name == "torchrun" or "torch.distributed.run" in command[1:3]
    )


def needs_log_folder(command: Sequence[str], env: Mapping[str, str]) -> bool:
    """True for a torchrun (or the old ``torch.distributed.launch``) given no log
    folder (``TORCHRUN_LOGS``)."""
    chosen = any(str(w).startswith(("--log-dir", "--log_dir")) for w in command)
    old = bool(command) and "torch.distributed.launch" in command[1:3]
    return (is_torchrun(command) or old) and not chosen and TORCHRUN_LOGS not in env


def scratch_variable(
    command: Sequence[str], env: Mapping[str, str]
) -> tuple[str | None, str]:
    """The variable that gives ``command`` a scratch folder of its own, and the
    folder's prefix; (None, "") where it needs none."""
    if needs_log_folder(command, env):
        return TORCHRUN_LOGS, TORCHRUN_LOGS_PREFIX
    if not command or Path(command[0]).name not in _MPIRUNS:
        return None, ""
    variable = MPIRUN_SESSION.get(open_mpi_major(command[0], env.get("PATH")))
    # --tmpdir, or --mca orte_tmpdir_base / prte_top_session_dir on the line
    named = ("--tmpdir", "orte_tmpdir_base", "prte_top_session_dir")
    chosen = any(str(word).startswith(named) for word in command)
    if variable is None or chosen or any(v in env for v in MPIRUN_SESSION.values()):
        return None, ""
    return variable, MPIRUN_SESSION_PREFIX


@functools.cache
def open_mpi_major(program: str, path: str | None) -> int | None:
    """Open MPI's major version (4 up to 4.x, else 5) from ``program --version``;
    None for another MPI."""
    where = shutil.which(program, path=path)
    if where is None:
        return None
    try:
        said = subprocess.run(
            [where, "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\(Open MPI\) (\d+)\.", said.stdout + said.stderr)
    return None if found is None else max(4, min(5, int(found.group(1))))


def check_program(program: str, path: str | None, cwd: str | None = None) -> None:
    """Raise FileNotFoundError, saying what to install, if ``program`` is missing."""
    if os.sep in program:
        found = os.access(os.path.join(cwd or os.getcwd(), program), os.X_OK)
    else:
        found = shutil.which(program, path=path) is not None
    if not found:
        hint = _INSTALL.get(Path(program).name, "install it, or pass its full path")
        raise FileNotFoundError(
            f"program {program!r} not found (on PATH or at that path): {hint}"
        )


def short_names(commands: list[list[str]]) -> str:
    """Commands as short shell lines in backquotes, for messages."""
    lines = [display_command(c, {}) for c in commands]
    short = [
        line if len(line) <= 100 else f"{line[:70]} ... {line[-25:]}" for line in lines
    ]
    return ", ".join(f"`{line}`" for line in short)


def timeout_message(commands: list[list[str]], timeout: float, grace: float) -> str:
    """What :class:`.commands.CommandError` says when ``timeout`` passed."""
    return (
        f"{short_names(commands)} ran past timeout={timeout:g} s, so every process "
        f"was stopped (SIGTERM, then SIGKILL after {grace:g} s). If it needs longer, "
        f"pass a longer timeout, e.g. timeout={2 * timeout:g}"
    )


def failure_message(
    command: list[str], returncode: int, stderr: str, others_stopped: bool
) -> str:
    """What :class:`.commands.CommandError` says when ``command`` failed."""
    tail = stderr.splitlines()[-10:]
    return (
        f"{short_names([command])} exited with code {returncode}"
        + (" (the others were stopped, as a job ends when a node fails)"
           if others_stopped else "")
        + (". The end of its stderr:\n    " + "\n    ".join(tail) if tail else
           ". It printed nothing on stderr; its output is above")
    )  # fmt: skip


@atexit.register
def _stop_live() -> None:
    """At interpreter exit, ask every keeper still running to stop its command."""
    for proc in list(LIVE_COMMANDS):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
