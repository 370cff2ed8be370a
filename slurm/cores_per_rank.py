"""Where mpirun let each rank run: notebook 03's lesson on mpirun's binding options.
No process group and nothing exchanged: each rank prints the CPU cores it may use and
one variable that mpirun exported to it (-x), then exits.

    mpirun -np 2 --bind-to core --map-by slot:PE=1 --report-bindings \\
        -x NCCL_DEBUG=INFO python slurm/cores_per_rank.py
"""

import os
import socket
import sys

from workshop.env import rank_info


def main() -> None:
    info = rank_info()  # from OMPI_COMM_WORLD_RANK and friends under mpirun
    cores = sorted(os.sched_getaffinity(0))  # what the binding left this process
    line = (
        f"rank {info.rank} of {info.world_size} (host {socket.gethostname()}): "
        f"{len(cores)} core(s) {cores}, NCCL_DEBUG={os.environ.get('NCCL_DEBUG')}\n"
    )
    # One write, newline included: print() writes the text and its newline apart
    # when Python runs unbuffered, and mpirun, forwarding both ranks' output as it
    # comes, once joined rank 1's text to rank 0's line.
    sys.stdout.write(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
