"""The worker under real launchers and real groups (make test-fast leaves them out)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, clean_env, free_port, task_env

HELLO = str(ROOT / "slurm" / "hello_ranks.py")


def _run_tasks(task_envs: list[dict[str, str]]) -> list[str]:
    procs = [
        subprocess.Popen(
            [sys.executable, HELLO],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in task_envs
    ]
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out
        outputs.append(out)
    return outputs


@pytest.mark.parametrize("share", [True, False])
def test_rank_0_warns_when_torchrun_restarts_share_its_store(share, tmp_path):
    # The warning names the fix; with the fix exported, torchrun stops sharing its
    # store and the ranks say nothing.
    env = clean_env() if share else clean_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--log-dir={tmp_path}",  # not a torchelastic_* folder in /tmp
         "--nproc_per_node=2", "--max_restarts=1", HELLO],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "sum of ranks = 1" in run.stdout
    warned = run.stderr.count("Export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    assert warned == (1 if share and _torchrun_shares_its_store() else 0), run.stderr


def _torchrun_shares_its_store() -> bool:
    # A torchrun that lends its store to the ranks also reads the variable that
    # stops it (torch 2.15 does both; torch 2.4 neither, so nothing to warn of).
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    source = Path(dynamic_rendezvous.__file__).read_text()
    return "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in source


def test_the_hello_script_under_torchrun(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--log-dir={tmp_path}",  # not a torchelastic_* folder in /tmp
            "--nproc_per_node=2",
            HELLO,
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    for rank in (0, 1):
        assert (
            f"hello from rank {rank} of 2 (local rank {rank}, node 0, started by "
            f"torchrun, gloo): sum of ranks = 1"
        ) in run.stdout


def test_the_hello_script_as_srun_tasks():
    port = free_port()
    envs = [task_env("srun", rank, 2, port) for rank in (0, 1)]
    outputs = _run_tasks(envs)
    for rank, out in enumerate(outputs):
        assert (
            f"hello from rank {rank} of 2 (local rank {rank}, node 0, started by "
            f"srun, gloo): sum of ranks = 1"
        ) in out


def test_the_hello_script_as_mpirun_processes():
    port = free_port()
    envs = [task_env("mpirun", rank, 2, port) for rank in (0, 1)]
    outputs = _run_tasks(envs)
    assert (
        "hello from rank 1 of 2 (local rank 1, node 0, started by mpirun" in outputs[1]
    )


_DDP_THEN_EXIT = """
import atexit
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
import workshop.ranks.worker as worker

with worker.process_group("gloo"):
    DDP(torch.nn.Linear(4, 2))(torch.ones(3, 4)).sum().backward()
    print("inside:", worker._gloo_threads())
print("after:", worker._gloo_threads(), "settle at exit:", worker._SETTLE_REGISTERED)
"""


def test_gloo_threads_kept_alive_by_ddp_get_time_to_finish_at_exit():
    # torch leaves gloo's worker threads running after destroy_process_group once a
    # DDP model has used the group; a rank exiting while they free the last
    # collective's tensors aborted ("terminate called without an active exception").
    # The group's exit arranges a wait at interpreter exit for exactly that case.
    env = task_env("mpirun", 0, 1, free_port())
    done = subprocess.run(
        [sys.executable, "-c", _DDP_THEN_EXIT],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    if lines[0] == "inside: -1":
        # Unnamed threads (torch 2.4): the exit wait sleeps whenever it cannot tell.
        assert lines[1] == "after: -1 settle at exit: True"
        return
    assert lines[0] == "inside: 2"
    # torch 2.15 leaves both threads running here (a later torch may not).
    assert lines[1] in (f"after: {n} settle at exit: True" for n in (2, 0))


def _mismatched():
    import torch.distributed as dist

    t = torch.ones(4 if dist.get_rank() == 0 else 5)
    dist.all_reduce(t)


def test_detail_debugging_set_in_the_kernel_reaches_forked_ranks(monkeypatch):
    # The kernel imported torch.distributed before the variable was set; the ranks,
    # forked from it, must still check their collectives against each other.
    import workshop

    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    with pytest.raises(
        workshop.LaunchError,
        match=r"Detected mismatch between collectives on ranks(.|\n)*"
        r"TensorShape=\[[45]\](.|\n)*TensorShape=\[[45]\]",
    ):
        workshop.launch(
            _mismatched,
            world_size=2,
            backend="gloo",
            start_method="fork",
            timeout=120,
            show="none",
        )


SLOW_JOIN = """
import os, sys, time
import torch.distributed as dist
from workshop.env import rank_info
from workshop.ranks.worker import process_group
rank = rank_info().rank
real_init = dist.init_process_group
def slow_init(*args, **kwargs):
    real_init(*args, **kwargs)
    if rank == 1:
        time.sleep(1.0)
        print("joined at", time.time(), flush=True)
dist.init_process_group = slow_init
with process_group() as info:
    pass
print("left at", time.time(), flush=True)
"""


def _times(out: str, what: str) -> float:
    return float(re.search(rf"{what} at ([0-9.]+)", out).group(1))


def test_no_rank_leaves_before_every_rank_has_joined():
    # No workshop.launch: the ranks meet at the store torch makes (env://), as
    # under srun; the launcher's ranks run the same process_group.
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SLOW_JOIN],
            env=task_env("srun", rank, 2, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert _times(outs[0], "left") >= _times(outs[1], "joined"), outs


def returns_early_on_rank_0():
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    if dist.get_rank() == 0:
        return "done"  # the others' all_reduce below never has it
    dist.all_reduce(t)
    return t.tolist()


def test_a_rank_that_returned_early_is_named_as_the_cause():
    import time

    import workshop
    from workshop.ranks.session import LaunchError

    t0 = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        workshop.launch(returns_early_on_rank_0, world_size=2, show="none", timeout=300)
    # At once, not at the timeout: rank 0 left the group, the others lost it.
    assert time.monotonic() - t0 < 120
    message = str(caught.value)
    assert message.startswith(
        "rank(s) 0 of 2 returned from the function (or called sys.exit) while "
        "rank(s) 1 still called a collective with them"
    ), message
    # gloo's words for it: "Connection closed by peer" or "... reset by peer".
    assert "by peer" in message.splitlines()[0]
    assert "This is typically" not in message.splitlines()[0]
    assert "look for a return (or sys.exit) that only some ranks reach" in message
    assert caught.value.failed_ranks == [1]
    assert "in returns_early_on_rank_0" in message  # rank 1's traceback


def ends_its_own_group() -> int:
    import torch.distributed as dist

    rank = dist.get_rank()
    dist.destroy_process_group()  # as a lesson's plain script does
    return rank


def test_a_block_that_destroyed_its_group_still_leaves_cleanly():
    import workshop

    run = workshop.launch(ends_its_own_group, world_size=2, show="none")
    assert run.returns == [0, 1]


def test_a_rank_that_raised_leaves_at_once_and_is_named():
    import workshop
    from workshop.ranks.session import LaunchError

    with pytest.raises(LaunchError, match="rank 1 of 2 failed") as caught:
        workshop.launch(raise_on_rank_1, world_size=2, show="none", timeout=60)
    assert "ValueError: rank 1 gives up" in str(caught.value)


def raise_on_rank_1() -> None:
    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank 1 gives up")
