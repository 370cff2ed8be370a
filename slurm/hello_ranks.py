"""Hello, ranks: notebook 02's first lesson as a script that any launcher can start.

    torchrun --standalone --nproc_per_node=4 slurm/hello_ranks.py   # one node
    sbatch slurm/hello_ranks.sbatch                                 # Slurm, many nodes
    mpirun -np 4 -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29400 \\
        python slurm/hello_ranks.py                                 # Open MPI

The rank, the backend (NCCL with one GPU per rank, else gloo) and the rendezvous come
from the launcher through `workshop.process_group`, the same code that runs inside
`workshop.launch` in the notebook.
"""

import torch
import torch.distributed as dist

from workshop import backend_name, process_group, rank_device


def main() -> None:
    with process_group() as info:
        backend = backend_name(dist.get_backend())  # "nccl" for cpu:gloo,cuda:nccl
        value = torch.tensor([float(info.rank)], device=rank_device(backend, info))
        dist.all_reduce(value)  # every rank ends with 0 + 1 + ... + (world_size - 1)
        print(
            f"hello from rank {info.rank} of {info.world_size} (local rank "
            f"{info.local_rank}, node {info.node_rank}, started by {info.launcher}, "
            f"{backend}): sum of ranks = {value.item():g}\n",
            end="",  # one write, "\n" included: ranks print at once, and unbuffered
            flush=True,  # (python -u) print writes a line and its end apart
        )


if __name__ == "__main__":
    main()
