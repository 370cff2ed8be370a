"""GPU paths of workshop.launch: NCCL ranks, CUDA tensors coming home on the CPU, and
a kernel that has initialised CUDA. Skipped, with the reason, where no GPU is seen."""

from __future__ import annotations

import shutil

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
    from workshop.ranks.forkable import _cuda_initialized, fork_hazard

    # GPU tests run last (conftest): another test may have started CUDA here, or a
    # backward pass autograd's GPU threads, and then ranks come from the server.
    forkable = fork_hazard() is None
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


# ------------------------------------------- a kernel that trained before it launches
# On a GPU node the kernel's first backward pass, even on CPU tensors, starts
# autograd's GPU threads and its fork handler: a rank forked after it fails at its
# first backward or CUDA call (shared/GPU-NODE.md). Notebook 02 trains in the kernel
# before its checkpoint lesson, and so do learners.


def test_the_thread_signal_agrees_with_a_forked_childs_backward(script):
    s = script("""
        import torch
        from workshop._procs import answer_in_child
        from workshop.ranks import forkable

        def child_backward():
            try:
                w = torch.ones(1, requires_grad=True)
                (w * 2).sum().backward()
                return 0
            except RuntimeError as exc:
                return 3 if "autograd's threading" in str(exc) else 4

        before = answer_in_child(child_backward, 30)
        print("before", forkable.autograd_threads(), before)
        w = torch.ones(2, requires_grad=True)
        (w * w).sum().backward()  # the kernel's first backward pass, on the CPU
        print("after", forkable.autograd_threads(), answer_in_child(child_backward, 30),
              forkable.fork_hazard(), flush=True)
    """)
    out = s.finish(120)
    assert s.popen.returncode == 0, out
    assert "before [] 0\n" in out
    after = next(line for line in out.splitlines() if line.startswith("after"))
    # The signal (a pt_autograd_ thread) and the child's fate agree either way.
    threads_seen = "pt_autograd_" in after
    assert after.endswith(" 3 autograd") if threads_seen else after.endswith(" 0 None")
    assert threads_seen, f"no autograd GPU thread after a backward pass here: {out}"


def _resumable(
    epochs: int,
    path: str,
    crash_in_epoch: int | None = None,
    restore_optimizer: bool = True,
):
    """Notebook 02's resumable DDP loop, on each rank's GPU: 4 steps an epoch on
    every rank, however many GPUs there are."""
    import os

    from torch.backends import cudnn  # here: cloudpickle cannot send torch's cudnn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DistributedSampler, Subset

    import workshop

    # cuDNN may pick convolution kernels that add in a different order each run
    # (atomics), or pick other kernels by timing them: these make it pick the same
    # deterministic ones every run. (torch.use_deterministic_algorithms(True) would
    # raise for some CUDA backward ops and needs CUBLAS_WORKSPACE_CONFIG.)
    cudnn.deterministic = True
    cudnn.benchmark = False
    device = workshop.rank_device()
    torch.manual_seed(0)
    ddp = DDP(workshop.SmallCNN().to(device), device_ids=[device.index])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = Subset(workshop.digits("train"), range(4 * 32 * dist.get_world_size()))
    sampler = DistributedSampler(data, seed=0)
    loader = workshop.make_loader(data, 32, shuffle=False, sampler=sampler)
    start = 0
    if os.path.exists(path):
        restored = optimizer if restore_optimizer else None  # None: no momentum
        start = workshop.load_checkpoint(path, ddp, restored)["epoch"] + 1
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            if epoch == crash_in_epoch and step == 2 and dist.get_rank() == 0:
                os._exit(1)  # the node dies mid-epoch
            workshop.train_step(ddp, [batch], optimizer)
        workshop.save_checkpoint(path, ddp, optimizer, epoch=epoch)
    weights = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    return str(device), weights.cpu()


def test_notebook_02s_checkpoint_lesson_after_the_kernel_trained(tmp_path):
    from workshop import LaunchError
    from workshop.ranks import forkable

    # The kernel trains a step first, on the CPU, as notebook 02 does before.
    from workshop.training.models import SmallCNN

    model = SmallCNN()
    model(torch.randn(4, 1, 16, 16)).sum().backward()
    assert forkable.fork_hazard() is not None  # autograd's threads (or CUDA) here

    def run(path, *args, **options):
        options = {"backend": "nccl", "world_size": GPUS, "show": "none", **options}
        return launch(_resumable, 3, str(tmp_path / path), *args, **options)

    with pytest.raises(LaunchError, match="rank 0"):
        run("checkpoint.pt", 1)  # dies in epoch 1, after the checkpoint of epoch 0
    shutil.copy(tmp_path / "checkpoint.pt", tmp_path / "model_only.pt")
    resumed = run("checkpoint.pt")
    unbroken = [run(f"unbroken{i}.pt", backend="auto") for i in (1, 2)]
    model_only = run("model_only.pt", None, False)  # the weights, not the momentum
    assert resumed.start_method == unbroken[0].start_method == "server"
    assert [u.backend for u in unbroken] == ["nccl", "nccl"]
    assert [r[0] for r in resumed.returns] == [f"cuda:{i}" for i in range(GPUS)]

    # A GPU need not give the same weights twice: cuDNN's kernels may add in any
    # order, and SGD with momentum grows a last-bit difference step by step (first
    # weights 0.0316 and 0.0168 after 48 steps on an H200, before the settings in
    # _resumable and the shorter epochs). So the resumed run is held to what this
    # GPU gives: where the two unbroken runs are equal to the bit, it must be too;
    # where they are not, its largest difference from the nearer of them must be of
    # the order of theirs: at most 4x, plus 2e-3 for a pair that happened to stay
    # close (on the CPU, each weight moved by 1e-6 of itself at each of these 12
    # steps left pairs of runs 3e-5 to 1.4e-3 apart). Were the runs chaos, that
    # alone would pass a checkpoint that restored too little, so the resumed run
    # must also be far closer than a run that restored the weights but not the
    # momentum (2.7e-2 away on the CPU): what the checkpoint restores is used.
    def weights(result):
        return result.returns[0][1]

    def apart(a, b) -> float:
        return (a - b).abs().max().item()

    first, second = weights(unbroken[0]), weights(unbroken[1])
    runs = apart(first, second)
    resume = min(apart(weights(resumed), first), apart(weights(resumed), second))
    without_momentum = apart(weights(model_only), first)
    seen = (
        f"largest differences: resumed {resume:.2e}, between unbroken runs "
        f"{runs:.2e}, without the momentum {without_momentum:.2e}"
    )
    if torch.equal(first, second):
        assert torch.equal(weights(resumed), first), seen
    else:
        assert resume <= 4 * runs + 2e-3, seen
    assert 4 * resume < without_momentum, seen
