"""Ways to start one rank, and the handle the launcher keeps for it.

* fork: the notebook kernel forks itself. Fastest (torch is already imported), and
  safe only while CUDA is not initialised in the kernel (:func:`.forkable.fork_hazard`).
* server: the :class:`ForkServer`, a clean process started once per kernel with torch
  imported and CUDA never touched, forks the ranks: still fast, since a rank pays for
  neither the interpreter start nor torch's import. The kernel talks to it over a
  private socket pair (no file on disk, nothing another user can reach); the rank's
  pipes travel with each request as file descriptors. The server dies with the
  kernel (parent-death signal, and end-of-file on the socket), and its ranks die
  with the server.
* spawn: a fresh interpreter per rank, the function sent to it with cloudpickle.

Each rank is the leader of its own session, so a terminal's Ctrl-C reaches only the
launcher, which then stops every rank itself, and a signal to the rank's process group
also reaches whatever the rank started.

**What a rank imports, imported once before ranks are forked** (:func:`preload`). A
forked rank inherits the modules its parent imported and imports the rest itself, all
ranks at once on the same cores. The costly one is ``torch._dynamo`` (sympy and triton
behind it, about 900 modules), which the first optimizer and DDP's constructor import:
a 2-rank launch that builds DDP and AdamW and steps once took 1.82 s against 0.10 s
for a trivial launch, and 0.12 s with it imported in the parent first (issue 32). So
the fork path preloads before its first fork, and the fork server at its start: once
per kernel, not at ``import workshop`` (a process that never forks pays nothing; a
thread importing in the background could hold an import lock at a fork), for 1.3 to
3.0 s (4.5 s with the cores busy) and 149 MB of RSS, measured on a 2-core VM with
torch 2.15 (``docs/benchmarks.md``): pages the ranks share with the kernel. Imports
only, nothing touches CUDA, so a GPU kernel stays forkable.
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from .._procs import die_with_parent, signal_group, status_to_exit_code
from .rank import (
    HEADER,
    Job,
    child_main,
    prepare_stdio,
    report_failed_start,
    reset_signals,
    split_messages,
)


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
    """Fork this process into rank ``rank`` running ``job`` in exactly ``env``;
    ``keep_closed``: descriptors the rank must not hold (the other ranks' pipes, the
    rendezvous socket)."""
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


def _send(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    header = HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(body)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the socket closed")
        data += chunk
    return bytes(data)


def _recv_request(sock: socket.socket) -> tuple[Any, list[int]]:
    header, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, 3)
    if not header:
        raise EOFError("the kernel closed the socket")
    if len(header) < HEADER.size:
        header += _recv_exact(sock, HEADER.size - len(header))
    (size,) = HEADER.unpack(header)
    return pickle.loads(_recv_exact(sock, size)), list(fds)


# ----------------------------------------------------------------- server process


def _serve(sock_fd: int, parent: int) -> None:
    die_with_parent(parent)
    # Preload what every rank needs; CUDA stays untouched so forking remains safe.
    import cloudpickle  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401

    from . import worker  # noqa: F401

    preload()  # what ranks import on their first optimizer, DDP, FSDP, DTensor
    sock = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    _send(sock, ("ready", os.getpid()))

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            children.discard(pid)
            _send(sock, ("exited", pid, status_to_exit_code(status)))

    try:
        while True:
            ready, _, _ = select.select([sock, wake_r], [], [])
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
            if sock not in ready:
                continue
            try:
                request, fds = _recv_request(sock)
            except EOFError:
                return
            if request[0] in ("signal", "signal_rank"):
                _, pid, sig = request
                if pid in children:  # never signal a pid that is not ours any more
                    if request[0] == "signal":
                        signal_group(pid, sig)
                    else:
                        try:
                            os.kill(pid, sig)
                        except OSError:
                            pass
                continue
            _, rank, env, payload = request
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                try:
                    sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    reset_signals()
                    os.setsid()
                    die_with_parent(server)
                    prepare_stdio(fds[0], fds[1])
                    os.environ.clear()
                    os.environ.update(env)
                    job = enter_request(payload)
                except BaseException as exc:
                    report_failed_start(fds[2], exc)
                child_main(job, fds[2])
            for fd in fds:
                os.close(fd)
            children.add(pid)
            _send(sock, ("started", rank, pid))
    finally:
        for pid in children:
            signal_group(pid, signal.SIGKILL)


# ----------------------------------------------------------------- kernel side


class ServerRank(RankHandle):
    """A rank forked by the server; the server reaps it and reports its exit."""

    def __init__(self, server: ForkServer, rank: int, pid: int, reads: list[int]):
        super().__init__(rank, pid, *reads)
        self.server = server

    def poll(self) -> int | None:
        if self.exit_code is None:
            self.server.pump()
            self.exit_code = self.server.exits.pop(self.pid, None)
            if self.exit_code is None and not self.server.alive():
                self.exit_code = -signal.SIGKILL  # died with the server
        return self.exit_code

    def signal(self, sig: int) -> None:
        if self.exit_code is None and self.server.alive():
            self.server.send(("signal", self.pid, sig))

    def signal_rank(self, sig: int) -> None:
        if self.exit_code is None and self.server.alive():
            self.server.send(("signal_rank", self.pid, sig))


class ForkServer:
    """The kernel's handle on its fork server (one per kernel, started on first use)."""

    def __init__(self) -> None:
        self.popen: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.exits: dict[int, int] = {}
        self._buffer = bytearray()
        self._started: list[tuple] = []
        self.start_seconds: float | None = None
        self.ready = False  # it has said it imported torch

    def alive(self) -> bool:
        """True while the server process runs and its socket is open."""
        return (
            self.popen is not None
            and self.sock is not None
            and self.popen.poll() is None
        )

    def begin(self) -> None:
        """Start the server process and return at once; it imports torch in the
        background, and :meth:`start` waits for it. Nothing happens if it runs."""
        if self.alive():
            return
        self.close()
        ours, theirs = socket.socketpair()
        self.popen = subprocess.Popen(
            # -c rather than -m: the package already imports this module, and runpy
            # warns when a module it runs as __main__ is in sys.modules already.
            [
                sys.executable,
                "-c",
                "import sys; from workshop.ranks.start import _serve; "
                "_serve(int(sys.argv[1]), int(sys.argv[2]))",
                str(theirs.fileno()),
                str(os.getpid()),
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        self.ready = False

    def start(self, timeout: float = 180.0) -> None:
        """Start the server (unless :meth:`begin` did) and wait until it has imported
        torch. ``start_seconds`` is how long this call waited."""
        if self.alive() and self.ready:
            return
        t0 = time.monotonic()
        self.begin()
        try:
            self._wait_for(lambda m: m[0] == "ready", timeout)
        except Exception:
            self.close()
            raise
        self.ready = True
        self.start_seconds = time.monotonic() - t0

    def send(self, obj: Any, fds: list[int] | None = None) -> None:
        """Send one request to the server."""
        _send(self.sock, obj, fds)

    def pump(self, timeout: float = 0.0) -> None:
        """Read whatever the server has said, waiting at most ``timeout`` seconds."""
        if self.sock is None:
            return
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return
        data = self.sock.recv(1 << 16)
        if not data:
            self.close()
            return
        self._buffer += data
        for message in split_messages(self._buffer):
            if message[0] == "exited":
                self.exits[message[1]] = message[2]
            else:
                self._started.append(message)

    def _wait_for(self, match, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self._started):
                if match(message):
                    return self._started.pop(i)
            if not self.alive():
                code = self.popen.poll() if self.popen else None
                raise RuntimeError(
                    f"the fork server stopped (exit code {code}); its error, if any, "
                    "is in the Jupyter server's log. Pass start_method='spawn' to go on"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"the fork server gave no answer in {timeout:.0f} s; pass "
                    "start_method='spawn' to go on"
                )
            self.pump(min(left, 0.5))

    def start_rank(self, rank: int, env: dict[str, str], payload: dict) -> ServerRank:
        """Have the server fork rank ``rank``; returns its handle."""
        reads, writes = _pipes()
        try:
            self.send(("start", rank, env, payload), writes)
        finally:
            for fd in writes:
                os.close(fd)
        _, _, pid = self._wait_for(lambda m: m[0] == "started" and m[1] == rank, 60.0)
        return ServerRank(self, rank, pid, reads)

    def close(self) -> None:
        """Stop the server; its ranks die with it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.terminate()
                try:
                    self.popen.wait(5)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(5)
            self.popen = None
        self.ready = False


# The kernel's fork server, started on first use, stopped at the kernel's exit.
SERVER = ForkServer()

# Each entry is what a rank uses, as "module" or "module:name"; the first choice
# that imports (and has the name) is kept, and an entry none of whose modules this
# torch has (2.4 to 2.15) is skipped.
WANTED: tuple[tuple[str, ...], ...] = (
    # What torch.optim imports on the first optimizer built, and DDP on its first.
    ("torch._dynamo",),
    ("torch.nn.parallel:DistributedDataParallel",),
    # FSDP2's fully_shard: public from torch 2.6, under _composable in 2.4 and 2.5.
    (
        "torch.distributed.fsdp:fully_shard",
        "torch.distributed._composable.fsdp:fully_shard",
    ),
    ("torch.distributed.fsdp:FullyShardedDataParallel",),
    # DTensor: public from torch 2.5, torch.distributed._tensor in 2.4.
    ("torch.distributed.tensor:DTensor", "torch.distributed._tensor:DTensor"),
    ("torch.distributed.device_mesh:init_device_mesh",),
)

# Set to "0" to start ranks without preloading (to measure what it saves).
PRELOAD_VAR = "WORKSHOP_PRELOAD"


@dataclass
class Preloaded:
    """What :func:`preload` imported, what this torch lacks, and what it cost."""

    imported: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rss_mb: float = 0.0  # growth of this process's resident memory
    skipped: bool = False  # PRELOAD_VAR=0


_DONE: Preloaded | None = None


def _rss_mb() -> float:
    """This process's resident memory in MB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _import_first(choices: tuple[str, ...]) -> str | None:
    """Import the first of ``choices`` that exists; its "module[:name]", or None."""
    for choice in choices:
        module_name, _, name = choice.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception:  # not in this torch (or not built with distributed)
            continue
        if not name or hasattr(module, name):
            return choice
    return None


def preload(wanted: tuple[tuple[str, ...], ...] | None = None) -> Preloaded:
    """Import what ranks commonly use, without touching CUDA.

    Args:
        wanted: the entries to import, each a tuple of choices "module" or
            "module:name" of which the first that imports is kept. None (the
            launcher's call): ``WANTED``, once per process; a later call returns
            the first call's record and imports nothing.

    Returns:
        A :class:`Preloaded`: the choices imported, the entries this torch lacks,
        and the seconds and MB of RSS it cost. With ``WORKSHOP_PRELOAD=0`` in the
        environment nothing is imported and ``skipped`` is True.

    Example:
        >>> preload((("json:dumps",), ("no_such_module",))).missing
        ['no_such_module']
    """
    global _DONE
    if wanted is None and _DONE is not None:
        return _DONE
    done = Preloaded()
    if os.environ.get(PRELOAD_VAR, "1") == "0":
        done.skipped = True
    else:
        rss = _rss_mb()
        t0 = time.perf_counter()
        # A module that warns as it is imported would warn in the cell that
        # launched, about something its code never asked for: the notebook's
        # outputs stay as they were.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for choices in WANTED if wanted is None else wanted:
                found = _import_first(choices)
                if found is None:
                    done.missing.append(choices[0])
                else:
                    done.imported.append(found)
        done.seconds = time.perf_counter() - t0
        done.rss_mb = max(0.0, _rss_mb() - rss)
    if wanted is None:
        _DONE = done
    return done
