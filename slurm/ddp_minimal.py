"""DDP by hand, without the workshop package: what workshop.launch and
process_group() do for you. Start it with any launcher:

    torchrun --standalone --nproc_per_node=2 slurm/ddp_minimal.py
    srun -n 2 python slurm/ddp_minimal.py          # MASTER_ADDR/MASTER_PORT exported
    mpirun -np 2 -x MASTER_ADDR -x MASTER_PORT python slurm/ddp_minimal.py
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# Each launcher names the same three facts differently; env:// reads torchrun's names.
NAMES = {"RANK": ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK"),
         "WORLD_SIZE": ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"),
         "LOCAL_RANK": ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
         "LOCAL_WORLD_SIZE": ("SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE")}


def say(line):
    # One write per line: ranks share the launcher's output, and a line written in
    # two pieces can have another rank's line land between them.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(epochs=3, checkpoint="ddp_minimal.pt"):
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device(f"cuda:{local_rank}" if on_gpu else "cpu")  # one GPU a rank
    x, y = load_digits(return_X_y=True)  # ships with scikit-learn: nothing to download
    data = TensorDataset(torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y))
    sampler = DistributedSampler(data, seed=0)  # each rank its own part of the data
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if on_gpu else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(inputs.to(device)),
                                                     labels.to(device))
            loss.backward()  # gradients are all-reduced here
            optimizer.step()
        if rank == 0:
            say(f"epoch {epoch}: loss {loss.item():.3f}")
            torch.save(model.state_dict(), checkpoint)  # one writer
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    say(f"rank {rank}: weights sum to {total:.6f}")


def main():
    for name, others in NAMES.items():
        found = [os.environ[o] for o in others if o in os.environ]
        os.environ.setdefault(name, found[0] if found else "")
    if not (os.environ["RANK"] and os.environ.get("MASTER_ADDR")):
        sys.exit("start me with torchrun, srun or mpirun, with MASTER_ADDR and "
                 "MASTER_PORT set (torchrun sets them)")
    local_ranks = int(os.environ["LOCAL_WORLD_SIZE"] or os.environ["WORLD_SIZE"])
    backend = "nccl" if torch.cuda.device_count() >= local_ranks else "gloo"
    dist.init_process_group(backend, init_method="env://")
    try:
        train(checkpoint=os.environ.get("CHECKPOINT", "ddp_minimal.pt"))
    finally:
        dist.destroy_process_group()
        # gloo's worker threads free the last collective's tensors a moment later;
        # exiting during that aborts the rank ("terminate called without an active
        # exception", seen under mpirun), so give them a moment first.
        time.sleep(0.1)


if __name__ == "__main__":
    main()
