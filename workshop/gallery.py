"""Every communication diagram, drawn from built-in example data and saved as PNG.

Run it to see (or check) the pictures without starting any rank::

    python -m workshop.gallery /tmp/comm_diagrams

The example is made up but consistent: 4 ranks that broadcast from root 1, send
0 -> 1 and 2 -> 3, run a DDP-like step whose all-reduce of ``[rank]`` overlaps the
backward pass, plus one call of each other collective and a ring all-reduce of
4-element vectors. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._cli import writable_folder
from .comm.ring import ring_all_reduce_steps
from .draw import (
    collective_diagram,
    comm_diagrams,
    p2p_diagram,
    ring_diagram,
    timeline_diagram,
)

__all__ = [
    "example_buckets",
    "example_collectives",
    "example_events",
    "example_phases",
    "write_gallery",
]

_T0 = 1_700_000_000.0  # a time.time() value; the diagrams show times relative to it
_MS = 1e-3
WORLD = 4


def _call(rank: int, op: str, start_ms: float, end_ms: float, **fields: Any) -> dict:
    """One recorded call, with every field the tracer writes."""
    event = {
        "rank": rank,
        "op": op,
        "peer": None,
        "root": None,
        "reduce_op": None,
        "world_size": WORLD,
        "shapes": [(1,)],
        "dtype": "float32",
        "nbytes": 4,
        "before": None,
        "after": None,
        "start": _T0 + start_ms * _MS,
        "end": _T0 + end_ms * _MS,
        "blocking": True,
        "seq": 0,
    }
    event.update(fields)
    return event


def example_events() -> list[list[dict]]:
    """Four ranks' calls, in the order each rank made them (index = rank).

    A broadcast of ``[10, 20, 30]`` from root 1, a send of ``[1.0, 2.0]`` from 0 to 1
    and of ``[3.0, 4.0]`` from 2 to 3, then an all-reduce (sum) of ``[rank]`` that
    ends at the same time on every rank, the slowest rank's backward.

    Returns:
        ``events_by_rank``: a list of plain dicts per rank.
    """
    lanes: list[list[dict]] = [[] for _ in range(WORLD)]
    params = [10.0, 20.0, 30.0]
    for r in range(WORLD):
        mine = params if r == 1 else [0.0, 0.0, 0.0]
        lanes[r].append(
            _call(
                r,
                "broadcast",
                0.2 * r,
                1.5,
                root=1,
                shapes=[(3,)],
                nbytes=12,
                before=mine,
                after=list(params),
                seq=0,
            )
        )
    for src, dst, values in ((0, 1, [1.0, 2.0]), (2, 3, [3.0, 4.0])):
        shape = {"shapes": [(2,)], "nbytes": 8, "seq": 1}
        lanes[src].append(
            _call(src, "send", 1.6, 2.4, peer=dst, before=values, after=values, **shape)
        )
        lanes[dst].append(
            _call(
                dst,
                "recv",
                1.6,
                2.5,
                peer=src,
                before=[0.0, 0.0],
                after=values,
                **shape,
            )
        )
    total = float(sum(range(WORLD)))
    for r in range(WORLD):
        lanes[r].append(
            _call(
                r,
                "all_reduce",
                9.0 + 0.8 * r,
                14.0,
                reduce_op="sum",
                before=[float(r)],
                after=[total],
                seq=2,
            )
        )
    return lanes


def example_phases() -> list[tuple[int, str, float, float]]:
    """Forward, backward and optimizer of one DDP step per rank (rank, name, start,
    end), consistent with :func:`example_events`: the all-reduce starts during the
    backward and the optimizer waits for it."""
    phases = []
    for r in range(WORLD):
        forward_end = 6.0 + 0.4 * r
        backward_end = 10.5 + 0.8 * r
        for name, start, end in (
            ("forward", 2.6, forward_end),
            ("backward", forward_end, backward_end),
            ("optimizer", 14.0, 15.5),
        ):
            phases.append((r, name, _T0 + start * _MS, _T0 + end * _MS))
    return phases


def example_buckets() -> list[list[dict]]:
    """DDP's bucket all-reduces in the step of :func:`example_phases`: bucket 0 (the
    last layers' gradients) during backward, bucket 1 at its end, on every rank."""
    lanes = []
    for r in range(WORLD):
        backward_end = 10.5 + 0.8 * r
        lanes.append(
            [
                _call(r, "all_reduce", 7.0 + 0.4 * r, 9.0 + 0.4 * r, label="bucket 0"),
                # It ends only once the slowest rank (3) has handed its bucket 1 over.
                _call(r, "all_reduce", backward_end, 14.6, label="bucket 1"),
            ]
        )
    return lanes


def _bucket_phases() -> list[tuple[int, str, float, float]]:
    # example_phases, with the optimizer after the last bucket of example_buckets.
    later = 0.8 * _MS
    return [
        (r, name, start + later, end + later)
        if name == "optimizer"
        else (r, name, start, end)
        for r, name, start, end in example_phases()
    ]


def example_collectives() -> dict[str, list[dict]]:
    """One call of every collective on 4 ranks: each op's events, index = rank.

    Rank r starts with ``[r]`` (or two values, ``[10 r, 10 r + 1]``, where the op
    splits them), so where each value went can be read off the picture.
    """
    n = WORLD
    pair = [[10.0 * r, 10.0 * r + 1] for r in range(n)]
    sums = [sum(pair[r][i] for r in range(n)) for i in range(2)]
    lists = [[[10.0 * r + i] for i in range(n)] for r in range(n)]  # r's tensor i
    calls: dict[str, Any] = {
        "scatter": lambda r: dict(
            root=0, before=lists[0] if r == 0 else None, after=lists[0][r]
        ),
        "gather": lambda r: dict(
            root=0,
            before=[float(r)],
            after=[[float(i)] for i in range(n)] if r == 0 else None,
        ),
        "reduce": lambda r: dict(
            root=0, reduce_op="sum", before=pair[r], after=sums if r == 0 else pair[r]
        ),
        "all_gather": lambda r: dict(
            before=[float(r)], after=[[float(i)] for i in range(n)]
        ),
        "reduce_scatter": lambda r: dict(
            reduce_op="sum",
            before=lists[r],
            after=[sum(lists[i][r][0] for i in range(n))],
        ),
        "all_to_all": lambda r: dict(
            before=lists[r], after=[lists[i][r] for i in range(n)]
        ),
    }
    return {
        op: [_call(r, op, 0.0, 1.0, **fields(r)) for r in range(n)]
        for op, fields in calls.items()
    }


def write_gallery(outdir: str | Path) -> list[Path]:
    """Draw every communication diagram from the example data into ``outdir``.

    Args:
        outdir: a folder, made if missing.

    Returns:
        The PNG files written, in the order drawn.

    Raises:
        OSError: ``outdir`` cannot be made or written to.

    Example:
        >>> files = write_gallery("/tmp/comm_diagrams")  # doctest: +SKIP
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    events = example_events()
    steps = ring_all_reduce_steps(
        [[float(r * 4 + i) for i in range(4)] for r in range(WORLD)]
    )
    drawings: dict[str, Callable[[], Any]] = {
        "rank_layout_2x4": lambda: comm_diagrams.draw_rank_layout(2, 4),
        "point_to_point": lambda: p2p_diagram.draw_point_to_point(events),
        "collective_broadcast": lambda: collective_diagram.draw_collective(
            _call_of(events, 0)
        ),
        "collective_all_reduce": lambda: collective_diagram.draw_collective(
            _call_of(events, -1)
        ),
    }
    for op, call in example_collectives().items():
        drawings[f"collective_{op}"] = lambda call=call: (
            collective_diagram.draw_collective(call)
        )
    for k in range(len(steps)):
        drawings[f"ring_step_{k + 1}"] = lambda k=k: ring_diagram.draw_ring_step(
            steps, k
        )
    drawings["ring_grid"] = lambda: ring_diagram.draw_ring_grid(steps)
    drawings["rank_timeline"] = lambda: timeline_diagram.draw_rank_timeline(
        events, example_phases()
    )
    drawings["ddp_bucket_timeline"] = lambda: timeline_diagram.draw_rank_timeline(
        example_buckets(), _bucket_phases(), title="One DDP step"
    )
    written = []
    for name, draw in drawings.items():
        path = out / f"{name}.png"
        draw().savefig(path, dpi=100)
        written.append(path)
    return written


def _call_of(events_by_rank: Sequence[Sequence[dict]], index: int) -> list[dict]:
    """The ``index``-th call of every rank (the collectives line up across ranks)."""
    return [lane[index] for lane in events_by_rank]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workshop.gallery",
        description="Draw every communication diagram from example data, as PNG.",
    )
    parser.add_argument(
        "outdir",
        type=writable_folder("python -m workshop.gallery /tmp/comm_diagrams"),
        help="folder for the PNG files (made if missing)",
    )
    args = parser.parse_args(argv)
    try:
        written = write_gallery(args.outdir)
    except OSError as e:  # checked before drawing; a disk that fills up is not
        parser.exit(2, f"{parser.prog}: error: cannot write into {args.outdir}: {e}\n")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
