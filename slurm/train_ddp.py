"""Train notebook 02's CNN with DDP, as a script that any launcher can start, and
resume from its last checkpoint when it is started again.

    torchrun --standalone --nproc_per_node=2 slurm/train_ddp.py             # one node
    torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \\
        --rdzv_endpoint=HOST:PORT --rdzv_id=JOB slurm/train_ddp.py          # each node
    torchrun --standalone --nproc_per_node=2 --max_restarts=1 \\
        slurm/train_ddp.py --crash-in-epoch 1                               # restarts
    mpirun -np 2 -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29400 \\
        python slurm/train_ddp.py                                           # Open MPI
    sbatch slurm/train_ddp.sbatch                                           # Slurm

Every rank runs the same code. Where it runs (rank, node, GPU or CPU, which launcher)
comes from the launcher through `workshop.process_group`, the code that runs inside
`workshop.launch` in the notebooks. Only rank 0 prints, after gathering what the
others have to say, so the output reads the same on 2 ranks or 2,000.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

import workshop


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--checkpoint",
        default="train_ddp.pt",
        help="written after every epoch, read at start if it exists; on a cluster, "
        "a path on the shared file system (default: %(default)s)",
    )
    parser.add_argument(
        "--crash-in-epoch",
        type=int,
        default=None,
        metavar="N",
        help="the last rank dies half-way through epoch N, on the first attempt "
        "only: the restart lesson",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch < 1:
        parser.error(
            f"--epochs and --batch must be >= 1, not {args.epochs}, {args.batch}"
        )
    return args


def where_am_i(info: workshop.RankInfo, device: torch.device) -> None:
    """Rank 0 prints a line per rank: who started it, on which node and device."""
    # torchrun counts its restarts; other launchers start a process once.
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    me = (info.rank, info.local_rank, info.node_rank, socket.gethostname(), str(device))
    everyone: list = [None] * info.world_size
    dist.all_gather_object(everyone, me)
    if info.rank == 0:
        nodes = len({node_rank for _, _, node_rank, _, _ in everyone})
        # NCCL ranks get one group with gloo beside NCCL for CPU tensors
        # ("cpu:gloo,cuda:nccl"); backend_name calls it by its GPU backend, "nccl".
        backend = workshop.backend_name(dist.get_backend())
        print(
            f"{info.world_size} ranks on {nodes} node(s), started by "
            f"{info.launcher}, backend {backend}, attempt {attempt}"
        )
        for rank, local_rank, node_rank, host, where in everyone:
            print(
                f"  rank {rank}: local rank {local_rank} on node {node_rank} "
                f"(host {host}), {where}"
            )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with workshop.process_group() as info:
        device = workshop.rank_device(dist.get_backend(), info)
        where_am_i(info, device)
        train_set, test_set = workshop.digits("train"), workshop.digits("test")
        torch.manual_seed(0)
        model = workshop.SmallCNN().to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        sampler = DistributedSampler(train_set, seed=0)
        loader = workshop.make_loader(
            train_set, args.batch, shuffle=False, sampler=sampler
        )
        test_loader = workshop.make_loader(test_set, 256, shuffle=False)
        start = 0
        if Path(args.checkpoint).exists():  # a restart, or the job's second run
            start = (
                workshop.load_checkpoint(args.checkpoint, ddp, optimizer)["epoch"] + 1
            )
            if info.rank == 0:
                print(f"resuming from {args.checkpoint} at epoch {start}")
        for epoch in range(start, args.epochs):
            sampler.set_epoch(epoch)  # the same order as an unbroken run
            for step, batch in enumerate(loader):
                if (
                    epoch == args.crash_in_epoch
                    and attempt == 0
                    and step == len(loader) // 2
                    and info.rank == info.world_size - 1
                ):
                    # One write, "\n" included: unbuffered (-u, as a cell runs it),
                    # print writes the line and its end apart, and rank 0's next
                    # line could land between them.
                    died = f"rank {info.rank} dies in epoch {epoch}\n"
                    print(died, end="", flush=True)
                    os._exit(1)  # a node lost: no goodbye, no clean-up
                workshop.train_step(ddp, [batch], optimizer)
            accuracy = workshop.evaluate(ddp, test_loader)
            workshop.save_checkpoint(args.checkpoint, ddp, optimizer, epoch=epoch)
            if info.rank == 0:
                print(f"epoch {epoch}: eval accuracy {accuracy:.3f}, checkpoint saved")
        # Every rank holds the same weights; a checksum lets two runs be compared.
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        if info.rank == 0:
            print(f"done: weight checksum {checksum:.6f}", flush=True)


if __name__ == "__main__":
    main()
