"""The jobs of ``python -m workshop.bench concurrent``, and a launch of them with
plain ``torch.distributed``: no workshop code in the ranks, so that what fails there
is torch's and gloo's own behaviour.

A plain launch forks its ranks from the kernel, as ``workshop.launch`` does by
default, and serves a ``TCPStore`` from the kernel; each rank joins a gloo group,
runs the job and leaves, in one of the ways of ``BARRIERS``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from datetime import timedelta
from typing import Any

__all__ = ["BARRIERS", "JOBS", "plain_launch"]

# How a plain rank leaves its group, and the name of each way in the table:
# - none: at once, as most scripts do;
# - joined: once every rank has said through the store that its init_process_group
#   returned, that is, once every connection is made (what workshop.process_group
#   does);
# - leave: once every rank has said through the store that its job is done (what
#   workshop.process_group did at commit 1bc8393);
# - init: with torch's store-based barrier at the end of init_process_group
#   (TORCH_DIST_INIT_BARRIER=1; off by default since torch 2.1,
#   pytorch/pytorch#103033).
BARRIERS = {
    "none": "plain, no barrier",
    "joined": "plain, all joined",
    "leave": "plain, leave together",
    "init": "plain, init barrier",
}


# -- the jobs every launch runs, in turn
def return_rank() -> int:
    """Returns at once, with no collective: a hello-world cell."""
    import torch.distributed as dist

    return dist.get_rank()


def all_reduce_and_broadcast() -> float:
    """An all-reduce and a broadcast of one number: the first cells of notebook 02."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.broadcast(value, src=0)
    return value.item()


JOBS = {"no collective": return_rank, "collectives": all_reduce_and_broadcast}


def expected(job: str, world_size: int) -> list[Any]:
    """What each rank of ``job`` returns when all went well."""
    if job == "no collective":
        return list(range(world_size))
    return [world_size * (world_size + 1) / 2] * world_size


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, cut where gloo starts its advice."""
    text = str(exc).strip().split("\n")[0].split(" This is typically")[0]
    return f"{type(exc).__name__}: {text}"[:200]


def _plain_rank(
    job: str, rank: int, world_size: int, port: int, barrier: str, timeout: float, fd
) -> None:
    """A forked rank of a plain launch: join, run, leave, report on ``fd``, exit."""
    code = 1
    try:
        import torch.distributed as dist

        if barrier == "init":  # read by init_process_group when it is called
            os.environ["TORCH_DIST_INIT_BARRIER"] = "1"
        wait = timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=wait)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=wait
        )
        if barrier == "joined":  # this rank's connections are all made
            store.set(f"joined/{rank}", "1")
        value = JOBS[job]()
        if barrier == "leave":  # this rank's job is done
            store.set(f"left/{rank}", "1")
        if barrier in ("joined", "leave"):
            key = "joined" if barrier == "joined" else "left"
            store.wait([f"{key}/{r}" for r in range(world_size)], wait)
        dist.destroy_process_group()
        os.write(fd, json.dumps(["ok", value]).encode())
        code = 0
    except BaseException as exc:
        os.write(fd, json.dumps(["error", first_line(exc)]).encode())
    finally:
        os._exit(code)


def _serve_store(listener: socket.socket, world_size: int, timeout: float):
    """A TCPStore served on ``listener``, bound before the ranks were forked."""
    import torch.distributed as dist

    port = listener.getsockname()[1]
    options: dict[str, Any] = dict(
        is_master=True, timeout=timedelta(seconds=timeout), wait_for_workers=False
    )
    try:
        fd = os.dup(listener.fileno())  # the store closes the one it is given
        return dist.TCPStore(
            "127.0.0.1", port, world_size, master_listen_fd=fd, **options
        )
    except (RuntimeError, TypeError, ValueError):  # some releases: libuv refuses
        fd = os.dup(listener.fileno())
        options["use_libuv"] = False
        return dist.TCPStore(
            "127.0.0.1", port, world_size, master_listen_fd=fd, **options
        )


# Seconds the other ranks of a plain launch get to end after one failed.
STOP_GRACE = 2.0


def _report(read: int, code: int) -> list:
    """What a plain rank wrote on its pipe: ["ok", value] or ["error", line]."""
    text = b""
    while select.select([read], [], [], 0)[0]:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        text += chunk
    os.close(read)
    return json.loads(text) if text else ["error", f"ended with code {code}"]


def plain_launch(job: str, world_size: int, barrier: str, timeout: float) -> dict:
    """One launch of ``job`` with plain torch.distributed (see the docstring)."""
    import warnings

    record: dict[str, Any] = {"job": job, "error": None}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    ranks: list[tuple[int, int]] = []
    for rank in range(world_size):
        read, write = os.pipe()
        with warnings.catch_warnings():  # a threaded process forks; the rank runs
            warnings.simplefilter("ignore", DeprecationWarning)  # fresh code only
            pid = os.fork()
        if pid == 0:
            os.close(read)
            listener.close()
            _plain_rank(job, rank, world_size, port, barrier, timeout, write)
        os.close(write)
        ranks.append((pid, read))
    store = _serve_store(listener, world_size, timeout)
    listener.close()
    deadline = time.monotonic() + timeout
    codes: dict[int, int] = {}  # in the order the ranks ended
    while len(codes) < len(ranks) and time.monotonic() < deadline:
        for pid, _ in ranks:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
                    if codes[pid] != 0:  # as a launcher would: stop the others
                        deadline = min(deadline, time.monotonic() + STOP_GRACE)
        time.sleep(0.005)
    hung = [pid for pid, _ in ranks if pid not in codes]
    for pid in hung:
        os.kill(pid, signal.SIGKILL)
        codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    reports = {pid: _report(read, codes[pid]) for pid, read in ranks}
    del store
    failed = [pid for pid in codes if codes[pid] != 0 and pid not in hung]
    if failed:  # the first rank to fail is the cause; the rest follow from it
        record["error"] = reports[failed[0]][1]
    elif hung:
        record["error"] = (
            f"timeout: {len(hung)} rank(s) still running after {timeout:g} s"
        )
    elif [reports[pid][1] for pid, _ in ranks] != expected(job, world_size):
        record["error"] = f"wrong returns: {[reports[p][1] for p, _ in ranks]!r}"
    return record
