"""How a launcher tells a script its local rank: notebook 03's lesson on torchrun and
the launcher it grew out of, torch.distributed.launch. Each process prints the
arguments it was given and LOCAL_RANK, then exits; no process group, nothing sent.

    python -m torch.distributed.launch --nproc-per-node=2 slurm/local_rank.py --epochs 1
    torchrun --standalone --nproc-per-node=2 slurm/local_rank.py --epochs 1

The first adds --local-rank=N to the arguments (unless given --use-env); torchrun
only sets LOCAL_RANK.
"""

import os
import sys


def main() -> None:
    print(
        f"arguments {sys.argv[1:]}, LOCAL_RANK={os.environ.get('LOCAL_RANK')}\n",
        end="",  # one write, "\n" included: the ranks share one pipe, and unbuffered
        flush=True,  # (python -u) print writes a line and its end apart
    )


if __name__ == "__main__":
    main()
