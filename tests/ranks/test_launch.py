"""workshop.launch on CPU ranks with gloo: results, output, errors, timeouts,
interrupts, and that no process outlives a launch.

Every launch here asks for gloo, so a GPU node runs the same CPU ranks as a laptop;
what "auto" picks is checked against the machine's GPUs, and the GPU paths are in
test_gpu.py."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import torch.distributed as dist

import workshop
from workshop import LaunchError

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def launch(*args, **kwargs):
    """workshop.launch on CPU ranks with gloo unless a test asks otherwise."""
    kwargs.setdefault("backend", "gloo")
    return workshop.launch(*args, **kwargs)


def _rank_facts():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {
        "env": {
            k: os.environ[k]
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        },
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "sum": t.item(),
        "pid": os.getpid(),
    }


def _chatty(lines):
    rank = dist.get_rank()
    for i in range(lines):
        print(f"{rank}:{i}:" + "x" * 300)
    print(f"problem on {rank}", file=__import__("sys").stderr)
    return rank


def test_output_is_live_marked_whole_lines_and_kept(capsys):
    lines = 300
    result = launch(_chatty, lines, world_size=4, show="lines")
    out, err = capsys.readouterr()
    shown = out.splitlines()
    assert shown[0] == "launch: world_size=4, backend=gloo, start_method=fork"
    body = shown[1:]
    assert len(body) == 4 * lines
    for line in body:
        # Every line whole and from one rank: its marker matches its content.
        prefix, text = line.split("] ", 1)
        rank = int(prefix.removeprefix("[rank "))
        r, _i, xs = text.split(":")
        assert int(r) == rank and xs == "x" * 300, line
    assert sorted(err.splitlines()) == [f"[rank {r}] problem on {r}" for r in range(4)]
    for rank in range(4):
        kept = result.stdout[rank].splitlines()
        assert kept == [f"{rank}:{i}:" + "x" * 300 for i in range(lines)]
        assert result.stderr[rank] == f"problem on {rank}\n"


def test_quiet_launch_prints_nothing(capsys):
    launch(_chatty, 2, world_size=2, show="none")
    assert capsys.readouterr() == ("", "")


def _crash():
    if dist.get_rank() == 1:
        print("about to vanish", flush=True)
        os._exit(3)
    dist.barrier()


def _segfault():
    import signal

    if dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()


def test_a_rank_that_dies_without_an_exception_is_reported():
    with pytest.raises(
        LaunchError,
        match=r"rank 1 exited with code 3 without reporting "
        r"an error; its last line: 'about to vanish'",
    ) as info:
        launch(_crash, world_size=3, show="none")
    assert info.value.failed_ranks == [1]
    assert info.value.result.exit_codes[1] == 3
    with pytest.raises(LaunchError, match="rank 0 was killed by SIGSEGV"):
        launch(_segfault, world_size=2, show="none")


# ---------------------------------------------------------------- bad input


def test_bad_world_size_is_explained():
    for bad in (0, -2):
        with pytest.raises(
            ValueError,
            match=rf"world_size must be a whole number, 1 or more, not {bad}; the "
            rf"number of ranks, e\.g\. world_size=2",
        ):
            launch(_rank_facts, world_size=bad)
    for bad in (2.5, True, "4"):
        with pytest.raises(ValueError, match="world_size must be a whole number"):
            launch(_rank_facts, world_size=bad)


def test_a_non_callable_is_explained():
    with pytest.raises(
        TypeError,
        match=r"fn must be a function, got int \(5\); pass the "
        r"function itself, launch\(train, world_size=2\), not its result",
    ):
        launch(5, world_size=2)


def test_unknown_backend_and_start_method_are_explained():
    with pytest.raises(
        ValueError,
        match=r"unknown backend='ncl'; pass one of 'auto', "
        r"'gloo', 'nccl', 'mpi'",
    ):
        launch(_rank_facts, world_size=2, backend="ncl")
    with pytest.raises(
        ValueError,
        match=r"start_method must be one of 'auto', 'fork', 'server' or 'spawn', "
        r"not 'forkserver'",
    ):
        launch(_rank_facts, world_size=2, start_method="forkserver")
    with pytest.raises(
        ValueError,
        match=r"timeout=0 s is too short for ranks even to start .*pass at least "
        r"timeout=1, or None for no limit",
    ):
        launch(_rank_facts, world_size=2, timeout=0)


def test_nccl_without_gpus_says_what_to_pass(monkeypatch):
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL; the no-NCCL message is tested in test_env")
    import workshop.ranks.launcher

    monkeypatch.setattr(workshop.ranks.launcher, "visible_gpu_count", lambda: 0)
    with pytest.raises(
        ValueError,
        match=r'backend="nccl" needs one CUDA GPU per rank, '
        r'but no GPU is visible \(world_size=2\); pass backend="gloo"',
    ):
        launch(_rank_facts, world_size=2, backend="nccl")


def test_unserialisable_function_arguments_and_returns_are_explained():
    lock = threading.Lock()
    with pytest.raises(
        TypeError,
        match=r"argument 0 \(a lock\) cannot be sent to the "
        r"ranks: .*build the object inside fn",
    ):
        launch(lambda held: None, lock, world_size=2)
    with pytest.raises(
        TypeError,
        match=r"keyword argument guard \(a lock\) cannot be "
        r"sent to the ranks",
    ):
        launch(lambda guard=None: None, guard=lock, world_size=2)

    def uses_lock():
        with lock:
            return 1

    with pytest.raises(
        TypeError,
        match=r"fn='uses_lock' cannot be sent to the ranks: "
        r".*create that thing inside fn instead",
    ):
        launch(uses_lock, world_size=2)

    def returns_a_lock():
        return threading.Lock()

    with pytest.raises(
        LaunchError,
        match=r"TypeError: the function returned a lock that "
        r"cannot be serialised back to the notebook",
    ):
        launch(returns_a_lock, world_size=2, show="none")


def _listening_address():
    # Read the kernel's table of listening TCP sockets for the rendezvous port.
    port = int(os.environ["MASTER_PORT"])
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, _remote, state = line.split()[1:4]
            ip_hex, port_hex = local.split(":")
            if int(port_hex, 16) == port and state == "0A":  # 0A: LISTEN
                return ".".join(str(int(ip_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return None


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_rendezvous_listens_on_loopback_only_and_nothing_is_written(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    result = launch(_listening_address, world_size=2, show="none")
    assert result.returns == ["127.0.0.1", "127.0.0.1"]
    assert list(tmp_path.iterdir()) == []


def test_too_few_gpus_for_auto_says_why_the_ranks_are_on_the_cpu(monkeypatch, capsys):
    import workshop.ranks.launcher

    monkeypatch.setattr(workshop.ranks.launcher, "visible_gpu_count", lambda: 1)
    result = workshop.launch(dist.get_rank, world_size=2, show="lines")
    assert result.backend == "gloo"
    shown = capsys.readouterr().out.splitlines()
    assert shown[1] == (
        "launch: 2 ranks but 1 GPU: the ranks run on the CPU with gloo "
        "(world_size=1 would give each rank its own GPU, with NCCL)"
    )
    launch(dist.get_rank, world_size=2, show="lines")  # gloo asked for: no note
    assert "ranks but" not in capsys.readouterr().out


def test_public_api():
    assert set(workshop.__all__) >= {"launch", "LaunchError", "doctor"}
    assert "RunResult" not in workshop.__all__  # what launch returns; not typed
    assert (
        repr(launch(dist.get_rank, world_size=1, show="none"))
        == "RunResult(world_size=1, backend='gloo', start_method='fork', "
        "returns=[0], exit_codes=[0])"
    )


def _traced_then_fail():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        raise RuntimeError("after one all_reduce")
    return t.item()


def test_trace_brings_back_every_ranks_calls_even_from_a_failed_launch():
    result = launch(_rank_facts, world_size=2, trace=True, show="none")
    for rank, events in enumerate(result.traces):
        assert [e.op for e in events] == ["all_reduce"]
        assert events[0].rank == rank and events[0].after == [3.0]
    assert launch(_rank_facts, world_size=2, show="none").traces == [[], []]
    with pytest.raises(LaunchError) as info:
        launch(_traced_then_fail, world_size=2, trace=True, show="none")
    assert [e.op for e in info.value.result.traces[1]] == ["all_reduce"]
    with pytest.raises(TypeError, match=r"trace must be True or False, got 'yes'"):
        launch(_rank_facts, world_size=2, trace="yes")
