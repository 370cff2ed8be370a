"""GPU paths of workshop.launch: NCCL ranks, CUDA tensors coming home on the CPU, and
a kernel that has initialised CUDA. Skipped, with the reason, where no GPU is seen."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workshop import launch
from workshop.env import backend_name, visible_gpu_count

GPUS = visible_gpu_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU; none is visible here"),
]


def _nccl_sum():
    device = torch.device("cuda", torch.cuda.current_device())
    t = torch.ones(4, device=device) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    group = dist.get_backend()
    return {
        "group": group,
        "backend": backend_name(group),
        "device": str(t.device),
        "tensor": t,
    }


def test_nccl_with_one_rank_and_cuda_tensors_come_back_on_the_cpu():
    from workshop.ranks.launcher import _cuda_initialized

    # GPU tests run last (conftest), and another one may have started CUDA here.
    forkable = not _cuda_initialized()
    result = launch(_nccl_sum, world_size=1, backend="nccl", show="none")
    value = result.returns[0]
    # An NCCL group carries CPU tensors through gloo beside it.
    assert value["group"] == "cpu:gloo,cuda:nccl"
    assert value["backend"] == result.backend == "nccl"
    assert value["device"] == "cuda:0"
    assert value["tensor"].device.type == "cpu"
    assert value["tensor"].tolist() == [1.0] * 4
    # Unpickling the result did not start CUDA here, so the kernel can still fork.
    assert result.start_method == ("fork" if forkable else "server")
    if forkable:
        assert not torch.cuda.is_initialized()
        assert not _cuda_initialized()


def test_auto_backend_gives_each_rank_its_own_gpu():
    result = launch(_nccl_sum, world_size=GPUS, show="none")
    assert result.backend == "nccl"
    assert {r["backend"] for r in result.returns} == {"nccl"}
    assert [r["device"] for r in result.returns] == [f"cuda:{i}" for i in range(GPUS)]
    total = GPUS * (GPUS + 1) / 2
    assert all(r["tensor"].tolist() == [total] * 4 for r in result.returns)


def test_too_many_ranks_for_the_gpus_is_explained():
    with pytest.raises(ValueError, match=rf"world_size={GPUS + 1} but only {GPUS} GPU"):
        launch(_nccl_sum, world_size=GPUS + 1, backend="nccl")


def test_a_kernel_that_initialised_cuda_starts_ranks_from_the_server(script):
    s = script("""
        import torch, workshop
        import torch.distributed as dist
        torch.zeros(1, device="cuda")  # the kernel touches the GPU
        def rank_device():
            t = torch.ones(1, device="cuda") * dist.get_rank()
            dist.all_reduce(t)
            return t.item()
        r = workshop.launch(rank_device, world_size=1, show="lines")
        print("method", r.start_method, "returns", r.returns, flush=True)
    """)
    out = s.finish(300)
    assert s.popen.returncode == 0, out
    assert "CUDA is already initialised in this kernel" in out
    assert "method server returns [0.0]" in out
