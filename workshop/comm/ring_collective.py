"""A ring all-reduce written with nothing but point-to-point sends and receives.

The reference solution of notebook 02's ring exercise, and the code whose messages
the notebook counts to check the ring's cost: each rank sends 2(N-1) chunks of 1/N of
the tensor, 2(N-1)/N of it in all, whatever the number of ranks.
"""

from __future__ import annotations

__all__ = ["ring_all_reduce"]


def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks in place, around a ring, and return it.

    Rank r sends to r+1 and receives from r-1. The tensor is cut into world_size
    chunks. In the reduce-scatter phase (world_size-1 steps) each rank passes one
    chunk on and adds the chunk it receives to its own, so that after it every rank
    holds one chunk summed over all ranks. In the all-gather phase (world_size-1
    steps) the finished chunks travel round the ring, replacing the partial ones.

    Args:
        tensor: a 1-D tensor, the same shape on every rank, with at least
            world_size elements.

    Returns:
        ``tensor``, now holding the sum over ranks (as ``dist.all_reduce`` would).

    Raises:
        ValueError: fewer elements than ranks.

    Example:
        >>> workshop.launch(lambda: ring_all_reduce(torch.ones(4)).tolist(),
        ...                 world_size=2).returns                # doctest: +SKIP
        [[2.0, 2.0, 2.0, 2.0], [2.0, 2.0, 2.0, 2.0]]
    """
    import torch
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    if tensor.numel() < size:
        raise ValueError(
            f"a ring all-reduce over {size} ranks cuts the tensor into {size} chunks, "
            f"but it has {tensor.numel()} elements; pass one with {size} or more"
        )
    chunks = list(tensor.view(-1).chunk(size))  # views: updating them updates tensor
    right, left = (rank + 1) % size, (rank - 1) % size
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(size - 1):
            # In reduce-scatter rank r starts by sending chunk r; in all-gather it
            # starts with the chunk it finished, r + 1.
            shift = step if phase == "reduce-scatter" else step - 1
            send_index, recv_index = (rank - shift) % size, (rank - shift - 1) % size
            incoming = torch.empty_like(chunks[recv_index])
            # isend, not send: with every rank sending first, blocking sends of large
            # chunks would wait for a receive that nobody has posted yet.
            request = dist.isend(chunks[send_index].clone(), dst=right)
            dist.recv(incoming, src=left)
            request.wait()
            if phase == "reduce-scatter":
                chunks[recv_index] += incoming
            else:
                chunks[recv_index].copy_(incoming)
    return tensor
