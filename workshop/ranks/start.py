"""Ways to start one rank, and the handle the launcher keeps for it.

* fork: the notebook kernel forks itself. Fastest (torch is already imported), and
  safe only while CUDA is not initialised in the kernel.
* server: a clean server process, started once with torch imported and CUDA never
  touched, forks the ranks (see ``forkserver``).
* spawn: a fresh interpreter per rank, the function sent to it with cloudpickle.

Each rank is the leader of its own session, so a terminal's Ctrl-C reaches only the
launcher, which then stops every rank itself, and a signal to the rank's process group
also reaches whatever the rank started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from .._procs import die_with_parent, signal_group, status_to_exit_code
from .rank import Job, child_main, prepare_stdio

START_METHODS = ("auto", "fork", "server", "spawn")


class RankHandle:
    """The launcher's view of one running rank: its pipes, how to poll and stop it."""

    def __init__(
        self, rank: int, pid: int, stdout_fd: int, stderr_fd: int, result_fd: int
    ):
        self.rank = rank
        self.pid = pid
        self.fds = {"stdout": stdout_fd, "stderr": stderr_fd, "result": result_fd}
        self.exit_code: int | None = None

    def poll(self) -> int | None:
        """The exit code once the rank has ended (negative: killed by that signal)."""
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the rank and everything it started."""
        if self.exit_code is None:
            signal_group(self.pid, sig)

    def signal_rank(self, sig: int) -> None:
        """Send ``sig`` to the rank alone, not to the processes it started."""
        if self.exit_code is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended meanwhile; not reaped, so still ours
                pass


class ForkedRank(RankHandle):
    """A rank forked from this process: this process reaps it."""

    def poll(self) -> int | None:
        if self.exit_code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.exit_code = -1  # reaped elsewhere; nothing more can be known
                return self.exit_code
            if pid:
                self.exit_code = status_to_exit_code(status)
        return self.exit_code


class SpawnedRank(RankHandle):
    """A rank in a fresh interpreter started with subprocess."""

    def __init__(
        self,
        rank: int,
        popen: subprocess.Popen,
        stdout_fd: int,
        stderr_fd: int,
        result_fd: int,
    ):
        super().__init__(rank, popen.pid, stdout_fd, stderr_fd, result_fd)
        self.popen = popen

    def poll(self) -> int | None:
        if self.exit_code is None:
            self.exit_code = self.popen.poll()
        return self.exit_code


def _pipes() -> tuple[list[int], list[int]]:
    """Three pipes (stdout, stderr, result): the launcher's read ends and the rank's
    write ends. Pipes are private to the two processes: nothing touches the disk."""
    reads, writes = [], []
    for _ in range(3):
        r, w = os.pipe()
        reads.append(r)
        writes.append(w)
    return reads, writes


def fork_rank(
    rank: int, env: dict[str, str], job: Job, keep_closed: list[int]
) -> ForkedRank:
    """Fork this process into rank ``rank`` running ``job``.

    Args:
        rank: the global rank.
        env: the complete environment of the rank.
        job: what to run.
        keep_closed: descriptors of this process the rank must not hold (the other
            ranks' pipes, the rendezvous socket).
    """
    reads, writes = _pipes()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            os.setsid()
            die_with_parent(parent)
            for fd in reads + keep_closed:
                try:
                    os.close(fd)
                except OSError:
                    pass
            prepare_stdio(writes[0], writes[1])
            os.environ.clear()
            os.environ.update(env)
        except BaseException:
            os._exit(70)
        child_main(job, writes[2])
    for fd in writes:
        os.close(fd)
    return ForkedRank(rank, pid, *reads)


def spawn_rank(rank: int, env: dict[str, str], payload: bytes) -> SpawnedRank:
    """Start rank ``rank`` in a fresh interpreter; ``payload`` is the cloudpickled
    request (job, working directory, sys.path) it reads from its standard input."""
    reads, writes = _pipes()
    try:
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workshop.ranks.spawn",
                str(os.getpid()),
                str(writes[2]),
            ],
            stdin=subprocess.PIPE,
            stdout=writes[0],
            stderr=writes[1],
            pass_fds=(writes[2],),
            env=env,
            start_new_session=True,
        )
    finally:
        for fd in writes:
            os.close(fd)
    try:
        popen.stdin.write(payload)
        popen.stdin.close()
    except BrokenPipeError:
        pass  # it died at start; its exit code and stderr will say why
    return SpawnedRank(rank, popen, *reads)


def request_payload(job_bytes: bytes) -> dict[str, Any]:
    """What a rank started outside this process needs besides its environment."""
    return {"job": job_bytes, "cwd": os.getcwd(), "sys_path": list(sys.path)}


def enter_request(request: dict[str, Any]) -> Job:
    """In a rank started outside the kernel: take on the kernel's working directory and
    import path, then unpickle the job (which may import the kernel's modules)."""
    import cloudpickle

    try:
        os.chdir(request["cwd"])
    except OSError:
        pass
    sys.path[:] = request["sys_path"]
    return cloudpickle.loads(request["job"])
