"""The same DDP training on one node, started by torch.multiprocessing.spawn instead
of a launcher: this process picks the rendezvous and starts the ranks itself.

    python slurm/ddp_spawn.py 2          # 2 ranks
"""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ddp_minimal import train  # the training loop of ddp_minimal.py, unchanged


def rank_main(rank, world_size):  # spawn passes the index of the process first
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    backend = "nccl" if torch.cuda.device_count() >= world_size else "gloo"
    dist.init_process_group(backend, init_method="env://")
    try:
        train(checkpoint=os.environ.get("CHECKPOINT", "ddp_minimal.pt"))
    finally:
        dist.destroy_process_group()
        time.sleep(0.1)  # let gloo's threads finish first (see ddp_minimal.py)


if __name__ == "__main__":
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with socket.socket() as s:  # a free port for the rendezvous, on this node only
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(rank_main, args=(world_size,), nprocs=world_size, join=True)
