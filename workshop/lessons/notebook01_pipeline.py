"""A model split across two devices, and a GPipe-style pipeline of micro-batches.

Used by notebook 01, section 4. :class:`TwoStageModel` puts each half of a model on
its own device; :func:`pipeline_forward_backward` feeds it micro-batches so that, on
two GPUs, stage 2 works on one micro-batch while stage 1 works on the next, and
records every piece of work as plain
:class:`~workshop.lessons.notebook01_devices.Event` data for
:func:`workshop.draw.diagrams.draw_timeline`. :func:`pipeline_schedule` and
:func:`bubble_fraction` give the idealised schedule and its idle share.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..checks import whole
from .notebook01_devices import (
    Clock,
    DeviceLike,
    Event,
    LossFn,
    _names,
    as_devices,
    distinct_gpus,
    names_list,
    run_each,
    why_serial,
)

__all__ = [
    "Slot",
    "Timeline",
    "TwoStageModel",
    "bubble_fraction",
    "pipeline_forward_backward",
    "pipeline_schedule",
]


#: Seconds a pipeline stage waits for its neighbour before it gives up.
_WAIT_S = 120.0


class TwoStageModel(nn.Module):
    """A classifier cut in two: the first stage on ``devices[0]``, the second on
    ``devices[1]``; the activations travel between them in :meth:`forward`.

    The default stages are balanced (about as many multiply-adds each), so a pipeline
    keeps both devices equally busy. Do not move it with ``.to()``: build a new one.

    Args:
        devices: at least two devices; the first two are used.
        in_features: inputs per sample once flattened (3x32x32 images: 3072).
        hidden: width of the hidden layers.
        classes: outputs per sample.
        stage1: replaces the default first stage.
        stage2: replaces the default second stage.

    Raises:
        ValueError: fewer than two devices.

    Example:
        >>> model = TwoStageModel(["cpu", "cpu"], in_features=8, hidden=16)
        >>> model(torch.randn(5, 8)).shape
        torch.Size([5, 10])
    """

    def __init__(
        self,
        devices: Sequence[DeviceLike],
        in_features: int = 3 * 32 * 32,
        hidden: int = 1536,
        classes: int = 10,
        stage1: nn.Module | None = None,
        stage2: nn.Module | None = None,
    ) -> None:
        super().__init__()
        devices = as_devices(devices)
        if len(devices) < 2:
            raise ValueError(
                f"TwoStageModel needs two devices, got {_names(devices) or 'none'}; "
                "pass lesson_devices(2).devices"
            )
        self.devices = devices[:2]
        # in_features x hidden multiply-adds in the first stage, 2 x hidden^2 in the
        # second: equal for the defaults (3072 = 2 x 1536).
        first = stage1 or nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU()
        )
        second = stage2 or nn.Sequential(
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )
        self.stages = nn.ModuleList([first.to(devices[0]), second.to(devices[1])])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stages[0](x.to(self.devices[0]))
        # The one line that makes this model parallel: activations change device.
        return self.stages[1](h.to(self.devices[1]))


class Slot(NamedTuple):
    """One cell of the idealised pipeline schedule."""

    step: int
    stage: int
    micro_batch: int
    phase: str  # "forward" or "backward"


def pipeline_schedule(stages: int, micro_batches: int) -> list[Slot]:
    """The GPipe schedule: every forward, then every backward, one time step each.

    Stage ``s`` runs the forward of micro-batch ``m`` at step ``s + m``; backwards
    start once the last forward is done, from the last stage back to the first, in
    micro-batch order. It lasts ``2 * (micro_batches + stages - 1)`` steps.

    Args:
        stages: pipeline stages (devices), >= 1.
        micro_batches: pieces the batch is cut into, >= 1.

    Returns:
        The :class:`Slot` of every piece of work, sorted by step then stage.

    Raises:
        ValueError: a count below 1.

    Example:
        >>> [(s.step, s.stage, s.phase) for s in pipeline_schedule(2, 1)]
        [(0, 0, 'forward'), (1, 1, 'forward'), (2, 1, 'backward'), (3, 0, 'backward')]
    """
    whole("stages", stages)
    whole("micro_batches", micro_batches)
    first_backward = micro_batches + stages - 1
    slots = [
        Slot(s + m, s, m, "forward")
        for s in range(stages)
        for m in range(micro_batches)
    ]
    slots += [
        Slot(first_backward + (stages - 1 - s) + m, s, m, "backward")
        for s in range(stages)
        for m in range(micro_batches)
    ]
    return sorted(slots)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Share of the idealised schedule the devices sit idle: (S-1) / (M+S-1).

    Args:
        stages: pipeline stages S, >= 1.
        micro_batches: micro-batches M, >= 1.

    Returns:
        A number in [0, 1): 0.2 for 2 stages and 4 micro-batches.

    Raises:
        ValueError: a count below 1.

    Example:
        >>> bubble_fraction(2, 4)
        0.2
    """
    whole("stages", stages)
    whole("micro_batches", micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


@dataclass
class Timeline:
    """What :func:`pipeline_forward_backward` did, as plain data.

    Attributes:
        events: one :class:`Event` per stage, micro-batch and phase; ``device`` is
            the stage (stage ``s`` runs on the model's ``devices[s]``).
        devices: the stages' device names.
        micro_batch_sizes: samples in each micro-batch.
        schedule: the order followed (:func:`pipeline_schedule`).
        parallel: True when the stages ran at the same time (distinct GPUs).
        loss: the loss of the whole batch.
        note: one line on how it ran on these devices.
    """

    events: list[Event]
    devices: list[str]
    micro_batch_sizes: list[int]
    schedule: list[Slot]
    parallel: bool
    loss: float
    note: str


def pipeline_forward_backward(
    model: TwoStageModel,
    batch: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: int,
    loss_fn: LossFn,
) -> Timeline:
    """Forward and backward of a model split across devices, micro-batch by micro-batch.

    Follows :func:`pipeline_schedule`. On distinct GPUs each stage has its own thread,
    so the second stage works on micro-batch ``i`` while the first works on ``i + 1``;
    elsewhere the work runs one piece at a time in the same order, and is timed all
    the same. Each micro-batch's loss is weighted by its share of the batch, so for a
    ``loss_fn`` that averages (the default ``reduction="mean"``) the gradients equal
    those of one pass over the whole batch; they accumulate in ``.grad``.

    Args:
        model: a :class:`TwoStageModel` (or any module with ``stages`` and
            ``devices`` lists of the same length).
        batch: inputs, samples along dimension 0.
        targets: what ``loss_fn`` compares the outputs with.
        micro_batches: pieces to cut the batch into, 1 .. len(batch).
        loss_fn: ``loss_fn(outputs, targets)`` returning the mean loss.

    Returns:
        A :class:`Timeline`.

    Raises:
        ValueError: ``micro_batches`` outside 1 .. len(batch).
        TypeError: ``model`` has no ``stages`` and ``devices``.
        RuntimeError: a stage waited too long for its neighbour.

    Example:
        >>> model = TwoStageModel(["cpu", "cpu"], in_features=8, hidden=16)
        >>> x, y = torch.randn(8, 8), torch.randint(10, (8,))
        >>> t = pipeline_forward_backward(model, x, y, 4, nn.CrossEntropyLoss())
        >>> len(t.events)
        16
    """
    stages, devices = _stages_of(model)
    whole("micro_batches", micro_batches, most=len(batch), fix="a sample or more each")
    # tensor_split gives exactly micro_batches pieces (10 in 4: 3, 3, 2, 2).
    xs, ts = batch.tensor_split(micro_batches), targets.tensor_split(micro_batches)
    last, schedule = len(stages) - 1, pipeline_schedule(len(stages), micro_batches)
    parallel = distinct_gpus(devices)
    clock, box = Clock(), _Mailbox()
    kept: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb): output or loss
    inputs: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb): received input
    losses: list[float] = []

    def work(slot: Slot) -> None:
        s, m, device = slot.stage, slot.micro_batch, devices[slot.stage]
        # Waiting for a neighbour happens outside the timed phase: it is idle time,
        # and the picture must show it blank. Results are handed on once timed.
        if slot.phase == "forward":
            received = xs[m] if s == 0 else box.get(("act", s, m))
            with clock.phase("forward", s, device, micro_batch=m):
                x = received.to(device)
                if s > 0:  # a leaf, so this stage's backward stops here
                    inputs[s, m] = x.requires_grad_(True)
                out = stages[s](x)
                if s == last:
                    out = loss_fn(out, ts[m].to(device)) * (len(xs[m]) / len(batch))
            kept[s, m] = out
            if s == last:
                losses.append(float(out.detach()))
            else:
                box.put(("act", s + 1, m), out.detach())
        else:
            grad = None if s == last else box.get(("grad", s, m))
            with clock.phase("backward", s, device, micro_batch=m):
                # pop: this micro-batch's activations are freed once it is done.
                kept.pop((s, m)).backward(None if grad is None else grad.to(device))
            if s > 0:
                box.put(("grad", s - 1, m), inputs.pop((s, m)).grad)

    if parallel:
        lanes = [[w for w in schedule if w.stage == s] for s in range(len(stages))]

        def run_stage(s: int) -> None:
            try:
                for slot in lanes[s]:
                    work(slot)
            except BaseException:
                box.fail()  # wakes the other stage at once instead of after _WAIT_S
                raise

        run_each(run_stage, devices, parallel=True)
        how = (
            "one thread per stage, so the second stage of micro-batch i overlapped "
            "the first stage of micro-batch i+1"
        )
    else:
        with torch.enable_grad():
            for slot in schedule:
                work(slot)
        how = (
            f"ran one piece of work at a time in the GPipe order, because "
            f"{why_serial(devices)}; the stages overlap only on {len(devices)} GPUs"
        )
    bubble = bubble_fraction(len(stages), micro_batches)
    return Timeline(
        events=clock.sorted_events(),
        devices=names_list(devices),
        micro_batch_sizes=[len(x) for x in xs],
        schedule=schedule,
        parallel=parallel,
        loss=sum(losses),
        note=(
            f"Pipeline of {len(stages)} stages on {_names(devices)}, {micro_batches} "
            f"micro-batches (ideal bubble {bubble:.0%}): {how}."
        ),
    )


def _stages_of(model: nn.Module) -> tuple[list[nn.Module], list[torch.device]]:
    stages, devices = getattr(model, "stages", None), getattr(model, "devices", None)
    if stages is None or devices is None or len(stages) != len(devices):
        raise TypeError(
            f"{type(model).__name__} has no matching 'stages' and 'devices'; pass a "
            "TwoStageModel(lesson_devices(2).devices)"
        )
    return list(stages), as_devices(devices)


class _Mailbox:
    """Tensors handed between pipeline stages, waited for with a timeout."""

    def __init__(self) -> None:
        self._items: dict[tuple, torch.Tensor] = {}
        self._cond = threading.Condition()
        self._failed = False

    def put(self, key: tuple, value: torch.Tensor) -> None:
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self._failed = True
            self._cond.notify_all()

    def get(self, key: tuple) -> torch.Tensor:
        with self._cond:
            ready = self._cond.wait_for(
                lambda: key in self._items or self._failed, timeout=_WAIT_S
            )
            if self._failed or not ready:
                what, stage, mb = key
                raise RuntimeError(
                    f"stage {stage} waited {_WAIT_S:g} s for the {what} of micro-batch "
                    f"{mb} and gave up: the neighbouring stage failed or hangs; see "
                    "its error above"
                )
            return self._items.pop(key)
