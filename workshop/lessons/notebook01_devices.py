"""All the devices of one node from one process: data parallelism by hand.

Used by notebook 01. Each function does by hand, and times phase by phase, what
``torch.nn.DataParallel`` does, and returns plain data
(:class:`Event` lists) that :mod:`workshop.draw.diagrams` draws. On a machine with fewer
than two GPUs the same code runs on CPU stand-ins for devices, and every result carries
a ``note`` that says so::

    lesson = lesson_devices(2)
    print(lesson.note)
    record = data_parallel_step(model.to(lesson.devices[0]), x, y, lesson.devices, loss)

Nothing here initialises CUDA unless the devices chosen are GPUs, so a notebook kernel
that only looked can still fork ranks later.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..checks import whole
from ..env import visible_gpu_count

__all__ = [
    "Event",
    "LessonDevices",
    "StepRecord",
    "WrappedModel",
    "data_parallel_step",
    "lesson_devices",
    "torch_data_parallel",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
DeviceLike = torch.device | str


@dataclass(frozen=True)
class Event:
    """One piece of measured work, as plain data for :mod:`workshop.draw.diagrams`.

    Attributes:
        phase: "scatter", "replicate", "forward", "gather", "loss", "backward",
            "reduce" (data parallel) or "forward"/"backward" (pipeline).
        device: lane: the index into the lesson's devices (or the pipeline stage).
        start: seconds since the step began.
        end: seconds since the step began, after the device finished the work.
        micro_batch: the pipeline's micro-batch, None for data parallel phases.
    """

    phase: str
    device: int
    start: float
    end: float
    micro_batch: int | None = None


@dataclass(frozen=True)
class LessonDevices:
    """The devices a lesson runs on, and a line saying why: :func:`lesson_devices`."""

    devices: list[torch.device]
    note: str
    gpus: int


def lesson_devices(n: int = 2, gpus: int | None = None) -> LessonDevices:
    """Choose ``n`` devices: GPUs where there are enough, CPU stand-ins otherwise.

    With fewer than ``n`` GPUs the list is what exists padded with ``cpu``: the steps
    of the lesson stay the same, only nothing runs at the same time. Counting GPUs goes
    through NVML, so this does not initialise CUDA.

    Args:
        n: devices the lesson wants (2 for notebook 01).
        gpus: visible GPUs; counted when omitted (tests pass a number).

    Returns:
        A :class:`LessonDevices` with ``devices`` and a one-line ``note``.

    Raises:
        ValueError: ``n`` is less than 1.

    Example:
        >>> lesson_devices(2, gpus=0).devices
        [device(type='cpu'), device(type='cpu')]
    """
    whole("n", n, fix="e.g. lesson_devices(2)")
    gpus = visible_gpu_count() if gpus is None else gpus
    cuda = [torch.device("cuda", i) for i in range(min(gpus, n))]
    devices = cuda + [torch.device("cpu")] * (n - len(cuda))
    if gpus >= n:
        note = f"{n} of the {gpus} visible GPUs: {_names(devices)}; each is a real GPU."
    elif gpus == 0:
        note = (
            f"No GPU visible: using {_count(n, 'CPU stand-in')} for devices "
            f"({_names(devices)}). The steps are those of {_count(n, 'GPU')}, but the "
            "stand-ins share the CPU cores, so nothing runs at the same time and there "
            "is no speed-up to see."
        )
    else:
        note = (
            f"{_count(gpus, 'GPU')} visible, {n} wanted: using {_names(devices)}, the "
            f"CPU standing in for the rest. The steps are those of {_count(n, 'GPU')}; "
            "the timings are not."
        )
    return LessonDevices(devices=devices, note=note, gpus=gpus)


@dataclass
class StepRecord:
    """What :func:`data_parallel_step` did, as plain data.

    Attributes:
        events: one :class:`Event` per phase and device, in order of start.
        chunk_sizes: samples each device received (fewer devices than asked when the
            batch is smaller than the device count, as in DataParallel).
        devices: the devices' names, e.g. ``["cuda:0", "cuda:1"]``.
        parallel: True when the replicas ran at the same time (distinct GPUs).
        loss: the loss of the whole batch.
        note: one line on how it ran on these devices.
    """

    events: list[Event]
    chunk_sizes: list[int]
    devices: list[str]
    parallel: bool
    loss: float
    note: str


def data_parallel_step(
    model: nn.Module,
    batch: torch.Tensor,
    targets: torch.Tensor,
    devices: Sequence[DeviceLike],
    loss_fn: LossFn,
) -> StepRecord:
    """One training step of ``torch.nn.DataParallel``, done by hand and timed.

    Phases: *scatter* the batch in ``len(devices)`` chunks, one per device;
    *replicate* the model onto each device; *forward* each replica on its chunk (in
    threads on distinct GPUs, as DataParallel does; one after another otherwise);
    *gather* the outputs on ``devices[0]``; *loss* there and its gradient with respect
    to the outputs; *backward* through each replica with its slice of that gradient;
    *reduce*: sum the replicas' gradients into ``model``'s ``.grad`` (accumulating, as
    ``loss.backward()`` would). The gradients equal those of the whole batch on one
    device for a ``loss_fn`` over the whole batch and a model without BatchNorm
    (BatchNorm normalises each chunk by its own statistics, in DataParallel too).
    As in DataParallel, buffers updated by the replica on ``devices[0]`` are kept.
    The first step includes one-off start-up costs: draw the second.

    Args:
        model: the module, with its parameters on ``devices[0]``.
        batch: inputs, samples along dimension 0.
        targets: what ``loss_fn`` compares the outputs with.
        devices: where the replicas run, e.g. ``lesson_devices(2).devices``.
        loss_fn: ``loss_fn(outputs, targets)`` returning a scalar.

    Returns:
        A :class:`StepRecord`; ``model``'s parameters hold the gradients.

    Raises:
        ValueError: no devices, an empty batch, or the model not on ``devices[0]``.
        TypeError: the model returns something other than one tensor.

    Example:
        >>> model = nn.Linear(4, 2)
        >>> x, y = torch.randn(6, 4), torch.randn(6, 2)
        >>> r = data_parallel_step(model, x, y, ["cpu", "cpu"], nn.MSELoss())
        >>> r.chunk_sizes
        [3, 3]
    """
    devices = as_devices(devices)
    if not devices:
        raise ValueError("devices is empty; pass at least one, e.g. ['cpu']")
    if len(batch) == 0:
        raise ValueError("the batch is empty; pass at least one sample")
    _check_on(model, devices[0], "devices[0]")
    parallel = distinct_gpus(devices)
    clock = Clock()

    # torch.chunk, as DataParallel's scatter: 10 samples on 3 devices are 4, 4, 2.
    chunks = batch.chunk(len(devices))
    used = devices[: len(chunks)]
    inputs, replicas, outputs = [], [], [None] * len(used)
    for i, device in enumerate(used):
        with clock.phase("scatter", i, device):
            inputs.append(chunks[i].to(device))
    for i, device in enumerate(used):
        with clock.phase("replicate", i, device):
            replica = copy.deepcopy(model).to(device)
            for p in replica.parameters():
                p.grad = None  # the copy must not carry the model's earlier gradients
            replicas.append(replica)

    def forward(i: int) -> None:
        with clock.phase("forward", i, used[i]):
            outputs[i] = replicas[i](inputs[i])

    run_each(forward, used, parallel)
    if not isinstance(outputs[0], torch.Tensor):
        raise TypeError(
            f"the model returned a {type(outputs[0]).__name__}; this step gathers "
            "one tensor per replica: return the logits alone"
        )

    with clock.phase("gather", 0, devices[0]):
        gathered = torch.cat([out.detach().to(devices[0]) for out in outputs])
    gathered.requires_grad_(True)
    with clock.phase("loss", 0, devices[0]):
        loss = loss_fn(gathered, targets.to(devices[0]))
        loss.backward()  # d loss / d outputs, for the whole batch, on devices[0]
    grads = gathered.grad.split([len(c) for c in chunks])

    def backward(i: int) -> None:
        with clock.phase("backward", i, used[i]):
            outputs[i].backward(grads[i].to(used[i]))

    run_each(backward, used, parallel)

    with clock.phase("reduce", 0, devices[0]), torch.no_grad():
        for p, *copies in zip(
            model.parameters(), *(r.parameters() for r in replicas), strict=True
        ):
            for q in copies:
                if q.grad is None:  # a parameter this step did not use
                    continue
                part = q.grad.to(p.device)
                p.grad = part.clone() if p.grad is None else p.grad.add_(part)
        for b, b0 in zip(model.buffers(), replicas[0].buffers(), strict=True):
            b.copy_(b0)

    how = (
        f"the {len(used)} replicas ran at the same time, one thread per GPU, as "
        "nn.DataParallel runs them"
        if parallel
        else f"the replicas ran one after another, because {why_serial(used)}; on "
        "distinct GPUs they run at the same time"
    )
    return StepRecord(
        events=clock.sorted_events(),
        chunk_sizes=[len(c) for c in chunks],
        devices=names_list(devices),
        parallel=parallel,
        loss=float(loss.detach()),
        note=f"Data parallel step on {_names(devices)}: {how}.",
    )


class WrappedModel(NamedTuple):
    """A model, maybe wrapped in ``nn.DataParallel``, and a line saying which."""

    module: nn.Module
    note: str


def torch_data_parallel(
    model: nn.Module, devices: Sequence[DeviceLike]
) -> WrappedModel:
    """Wrap ``model`` in ``torch.nn.DataParallel`` where it helps: on two GPUs or more.

    On fewer GPUs DataParallel would only call the module, so the model comes back
    unchanged and the note says so.

    Args:
        model: the module to wrap.
        devices: the lesson's devices; the distinct GPUs among them are used.

    Returns:
        ``(module, note)``: ``nn.DataParallel(model, device_ids=[...])`` with the
        model moved to the first GPU, or ``model`` itself.

    Example:
        >>> module, note = torch_data_parallel(nn.Linear(4, 2), ["cpu", "cpu"])
        >>> isinstance(module, nn.Linear)
        True
    """
    devices = as_devices(devices)
    gpus = list(dict.fromkeys(d for d in devices if d.type == "cuda"))
    if len(gpus) >= 2:
        ids = [d.index for d in gpus]
        wrapped = nn.DataParallel(model.to(gpus[0]), device_ids=ids)
        return WrappedModel(
            wrapped,
            f"nn.DataParallel over {_names(gpus)}: every forward scatters the batch, "
            f"replicates the model, runs the replicas in threads and gathers on "
            f"{gpus[0]}.",
        )
    return WrappedModel(
        model,
        f"Not wrapped: nn.DataParallel needs two GPUs or more and the devices are "
        f"{_names(devices)} ({_count(len(gpus), 'GPU')}); with "
        "fewer it would only call the module, so the model is returned unchanged.",
    )


# --- private helpers -------------------------------------------------------------


def as_devices(devices: Sequence[DeviceLike]) -> list[torch.device]:
    out = []
    for d in devices:
        d = torch.device(d)
        # "cuda" alone means the first GPU here; asking the current one would
        # initialise CUDA.
        out.append(
            torch.device("cuda", 0) if d.type == "cuda" and d.index is None else d
        )
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _names(devices: Sequence[torch.device]) -> str:
    return ", ".join(names_list(devices))


def names_list(devices: Sequence[torch.device]) -> list[str]:
    return [str(d) for d in devices]


def distinct_gpus(devices: Sequence[torch.device]) -> bool:
    """True when every device is its own GPU: only then can the work overlap."""
    return all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)


def why_serial(devices: Sequence[torch.device]) -> str:
    """Why work on ``devices`` cannot overlap, for the notes."""
    if all(d.type == "cpu" for d in devices):
        return "CPU stand-ins share the same cores"
    return f"{_names(devices)} are not {len(devices)} distinct GPUs"


def _check_on(model: nn.Module, device: torch.device, where: str) -> None:
    params = list(model.parameters())
    if not params:
        raise ValueError("the model has no parameters, so there is nothing to train")
    found = params[0].device
    if as_devices([found]) != [device]:
        raise ValueError(
            f"the model's parameters are on {found} but {where} is {device}; "
            f"DataParallel keeps the model on {where}: call model.to('{device}') first"
        )


def _sync(device: torch.device) -> None:
    # GPU work is queued, not done, when Python returns: wait so the end is true.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Times phases against one start, from any thread."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: list[Event] = []
        self._lock = threading.Lock()

    @contextmanager
    def phase(
        self,
        phase: str,
        lane: int,
        device: torch.device,
        micro_batch: int | None = None,
    ) -> Iterator[None]:
        guard = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
        with guard:
            start = time.perf_counter() - self.t0
            yield
            _sync(device)
            end = time.perf_counter() - self.t0
        with self._lock:
            self.events.append(Event(phase, lane, start, end, micro_batch))

    def sorted_events(self) -> list[Event]:
        return sorted(self.events, key=lambda e: (e.start, e.device))


def run_each(
    fn: Callable[[int], None], devices: Sequence[torch.device], parallel: bool
) -> None:
    """``fn(i)`` for each device: in threads when ``parallel``, else in order."""
    if not parallel:
        with torch.enable_grad():
            for i in range(len(devices)):
                fn(i)
        return
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            # Grad mode is per thread; DataParallel's threads set it the same way.
            with torch.enable_grad():
                fn(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
