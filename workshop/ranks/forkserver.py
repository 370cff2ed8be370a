"""A clean process that forks ranks for a kernel that must not fork itself.

A notebook kernel that has initialised CUDA cannot safely fork (the child inherits a
CUDA context it cannot use). This server is started once per kernel with torch
imported and CUDA never touched, so forking it is safe and still fast: a rank pays for
neither the interpreter start nor torch's import.

The kernel talks to it over a private socket pair (no file on disk, nothing another
user can reach); the rank's pipes travel with each request as file descriptors.
The server dies with the kernel (parent-death signal, and end-of-file on the socket),
and its ranks die with the server.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from .._procs import die_with_parent, signal_group, status_to_exit_code
from .rank import split_messages
from .start import RankHandle, _pipes

_HEADER = struct.Struct("!Q")


def _send(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(len(body))
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
    header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 3)
    if not header:
        raise EOFError("the kernel closed the socket")
    if len(header) < _HEADER.size:
        header += _recv_exact(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return pickle.loads(_recv_exact(sock, size)), list(fds)


# ----------------------------------------------------------------- server process


def _serve(sock_fd: int, parent: int) -> None:
    die_with_parent(parent)
    # Preload what every rank needs; CUDA stays untouched so forking remains safe.
    import cloudpickle  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401

    from . import worker  # noqa: F401
    from .preload import preload
    from .rank import child_main, prepare_stdio, report_failed_start, reset_signals
    from .start import enter_request

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
                "import sys; from workshop.ranks.forkserver import _serve; "
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
