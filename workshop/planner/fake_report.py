"""What one rank of a fake world held and sent: the record :func:`~workshop.parallel.
fake_world.fake_run` returns (split from :mod:`workshop.planner.fake_world`, which
re-exports it)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

__all__ = ["FakeReport"]


@dataclass
class FakeReport:
    """What rank ``rank`` of a layout held and sent on the fake backend.

    ``held``: bytes of its parameter shards, gradients and optimizer state (Adam's two
    moments and step counters) after one step, each storage counted once, padding
    included. ``collectives``: ``{"all_gather dp": (count, bytes)}`` per training
    step (all ``micro_batches``, every block of the stage, the layout's tokens);
    ``measured``: the same for the one micro-batch that ran (``tokens`` tokens,
    ``layers_in_step`` blocks). Pipeline sends (``"send_recv pp"``) are counted from
    the split, not run. ``times``: seconds of each phase in the child.
    """

    model: str
    layout: str
    rank: int
    world_size: int
    coordinates: dict[str, int]
    stage_layers: tuple[int, int]
    wrapper: str
    held: dict[str, int]
    local_parameters: int
    shards: dict[str, tuple[list[int], list[int]]]
    collectives: dict[str, tuple[int, int]]
    measured: dict[str, tuple[int, int]]
    group_sizes: dict[str, int]
    comm_debug: dict[str, int]
    tokens: int
    layout_tokens: int
    layers_in_step: int
    times: dict[str, float]
    notes: list[str] = field(default_factory=list)
    torch_version: str = ""

    def table(self) -> str:
        """Held bytes and collectives per step, at most 88 columns."""
        first, stop = self.stage_layers
        where = ", ".join(f"{k} {v}" for k, v in self.coordinates.items())
        lines = [
            *textwrap.wrap(
                f"rank {self.rank} of {self.world_size} ({self.layout}; {where}); "
                f"{self.model} layers {first}..{stop - 1}; {self.wrapper}",
                88,
            ),
            f"{'held':<28}{'MB':>12}",
        ]
        for k, v in self.held.items():
            lines.append(f"  {k:<26}{v / 1e6:>12.3f}")
        lines.append(f"{'sent per step':<28}{'calls':>8}{'MB':>14}{'group':>7}")
        for k, (n, b) in self.collectives.items():
            size = self.group_sizes.get(k.split()[-1], "")
            lines.append(f"  {k:<26}{n:>8}{b / 1e6:>14.3f}{size:>7}")
        times = ", ".join(f"{k} {v:.2f}" for k, v in self.times.items())
        lines += textwrap.wrap(f"times (s): {times}", 88)
        for note in self.notes:
            lines += textwrap.wrap(f"note: {note}", 88, subsequent_indent="  ")
        return "\n".join(lines)
