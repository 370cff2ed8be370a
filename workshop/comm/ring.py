"""The ring all-reduce, step by step, computed from each rank's values (no torch).

With N ranks, each holding a vector cut into N chunks, the ring takes 2(N-1) steps:
N-1 of reduce-scatter (each rank passes one chunk to the next, which adds it to its
own) and N-1 of all-gather (the finished chunks travel round). Every rank sends
2(N-1)/N of the data in all, whatever N is: why the ring suits bandwidth.
:mod:`workshop.draw.ring_diagram` draws these steps; :func:`ring_all_reduce` is the
same ring in point-to-point sends and receives (notebook 02's exercise solution).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RingStep", "ring_all_reduce", "ring_all_reduce_steps"]


@dataclass(frozen=True)
class RingStep:
    """One step of a ring all-reduce, as :func:`ring_all_reduce_steps` computes it.

    Attributes:
        phase: ``"reduce-scatter"`` (add what arrives) or ``"all-gather"`` (copy it).
        sends, sent: the chunk index and values each rank sends to rank+1.
        before, after: every rank's chunks around the step, ``before[rank][chunk]``.
        counts: how many ranks' values each chunk holds summed after the step
            (N: fully reduced).
    """

    step: int
    phase: str
    sends: list[int]
    sent: list[list[float]]
    before: list[list[list[float]]]
    after: list[list[list[float]]]
    counts: list[list[int]]


def ring_all_reduce_steps(values_by_rank: Sequence[Sequence[float]]) -> list[RingStep]:
    """Compute a ring all-reduce (sum) step by step, without torch.

    In reduce-scatter step s, rank r sends chunk (r - s) mod N to rank r+1, which adds
    it to its own; rank r then holds the sum of chunk (r + 1) mod N, which it passes on
    in the all-gather steps as chunk (r + 1 - s) mod N, and rank r+1 copies it.

    Args:
        values_by_rank: each rank's vector, index = rank; all of one length, at
            least N values (chunks differ in length by at most one).

    Returns:
        The 2(N-1) :class:`RingStep` s; the last one's ``after`` holds the elementwise
        sum on every rank.

    Raises:
        ValueError: fewer than 2 ranks, vectors of different lengths, or fewer
            values than ranks.

    Example:
        >>> steps = ring_all_reduce_steps([[1, 2], [10, 20]])
        >>> len(steps), steps[-1].after
        (2, [[[11], [22]], [[11], [22]]])
    """
    n = len(values_by_rank)
    lengths = {len(v) for v in values_by_rank}
    if n < 2 or len(lengths) != 1 or min(lengths) < n:
        raise ValueError(
            f"a ring needs 2 or more ranks with vectors of one length, at least one "
            f"value per rank; got {n} ranks with lengths "
            f"{[len(v) for v in values_by_rank]}: e.g. pass [[r] * 4 for r in range(4)]"
        )
    size = lengths.pop()
    bounds = [round(i * size / n) for i in range(n + 1)]
    state = [
        [list(v[bounds[c] : bounds[c + 1]]) for c in range(n)] for v in values_by_rank
    ]
    counts = [[1] * n for _ in range(n)]
    steps = []
    for k in range(2 * (n - 1)):
        reducing = k < n - 1
        s = k if reducing else k - (n - 1)
        sends = [(r - s) % n if reducing else (r + 1 - s) % n for r in range(n)]
        sent = [list(state[r][sends[r]]) for r in range(n)]
        sent_counts = [counts[r][sends[r]] for r in range(n)]
        before = [[list(c) for c in chunks] for chunks in state]
        for r in range(n):  # every rank sends at once, then adds (or copies)
            dst, c = (r + 1) % n, sends[r]
            if reducing:
                state[dst][c] = [
                    a + b for a, b in zip(state[dst][c], sent[r], strict=True)
                ]
                counts[dst][c] += sent_counts[r]
            else:
                state[dst][c] = list(sent[r])
                counts[dst][c] = sent_counts[r]
        steps.append(
            RingStep(
                step=k,
                phase="reduce-scatter" if reducing else "all-gather",
                sends=sends,
                sent=sent,
                before=before,
                after=[[list(c) for c in chunks] for chunks in state],
                counts=[list(c) for c in counts],
            )
        )
    return steps


def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks in place, around a ring (rank r sends to r+1
    and receives from r-1), and return it; the phases are those of
    :func:`ring_all_reduce_steps`.

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
