"""Training samples per second, the workshop's loop against one in plain PyTorch:
``python -m workshop.bench train`` (a GPU node's figure beside published ones:
ResNet-50, bf16, channels_last on an H100, about 2,600 to 2,800 images/s).

``--bare`` times a loop written out in plain PyTorch instead of ``train_step``, so the
two figures show what the workshop's loop costs. ``--compile`` times three loops on
the same model and data: the workshop's eager, the workshop's compiled (as
``train(compile=True)``) and a bare ``torch.compile`` one, each warm-up apart from
its steady state; the point is the workshop/bare ratio (goal on a GPU: 0.98)::

    python -m workshop.bench train --compile --model smallcnn --image-size 32 \\
        --amp none                                            # a CPU, in a minute
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from .bench_output import count_option, json_option, write_json


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench train``."""
    from ..training.models import RESNETS

    parser.add_argument(
        "--model",
        default="resnet50",
        choices=("smallcnn", *RESNETS),
        metavar="NAME",
        help=f"smallcnn or {', '.join(RESNETS)} (default resnet50)",
    )
    count_option(
        parser,
        "--batch-size",
        1,
        None,
        "samples per step (default 256 on a GPU, 8 on the CPU)",
        "--batch-size 32",
    )
    count_option(parser, "--image-size", 1, 224)
    count_option(parser, "--steps", 1, 30, "timed steps")
    count_option(parser, "--warmup", 0, 5, "untimed steps first")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="bf16")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="time a plain PyTorch loop instead of the workshop's train_step",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="time the workshop's loop eager and compiled and a bare compiled loop, "
        "each warm-up apart from its steady state (on a CPU: --model smallcnn)",
    )
    json_option(parser, "--json train.json", "also write the figures as JSON")


def _bare_step(
    model: Any,
    x: Any,
    y: Any,
    optimizer: Any,
    amp: str | None,
    scaler: Any,
    channels_last: bool,
) -> Callable[[], None]:
    """One training step in plain PyTorch, for ``--bare``: what ``train_step`` does
    with one micro-batch, without its loss and accuracy bookkeeping on the device (part
    of what the two figures compare)."""
    import torch
    import torch.nn.functional as F

    device_type = next(model.parameters()).device.type
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        inputs = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        with torch.autocast(device_type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(inputs), y)
        if scaler is not None:  # fp16: scale the loss so small gradients survive
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()

    return step


@dataclass
class _Setup:
    """What every loop of one run shares: the device, the batch, the settings."""

    device: Any
    gpu: bool
    batch: int
    amp: str | None
    channels: int
    classes: int
    x: Any
    y: Any


def _setup(args: argparse.Namespace) -> _Setup:
    """The device and the one synthetic batch, after the options are checked."""
    import torch

    from ..env import visible_gpu_count
    from ..training.models import smallest_image
    from ..training.steps import resolve_device

    if args.compile and args.bare:
        raise ValueError(
            "--compile already times a bare compiled loop beside the workshop's; "
            "drop --bare, e.g. python -m workshop.bench train --compile"
        )
    device = resolve_device()
    gpu = visible_gpu_count() > 0
    batch = args.batch_size or (256 if gpu else 8)
    least = smallest_image(args.model, batch)
    if args.image_size < least:  # before the model is built, not in its first step
        raise ValueError(
            f"--image-size {args.image_size} is too small for {args.model} in batches "
            f"of {batch}: {least} or more; e.g. --image-size {max(least, 32)}"
        )
    if args.amp == "fp16" and not gpu:  # as train(amp="fp16") refuses it on a CPU
        raise ValueError(
            "--amp fp16 needs a GPU (float16 autocast is not generally supported on "
            "a CPU), but this run is on the CPU; pass --amp bf16 (bfloat16 autocast "
            "works on CPUs) or --amp none"
        )
    amp = None if args.amp == "none" else args.amp
    channels, classes = (1, 10) if args.model == "smallcnn" else (3, 1000)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(
        batch, channels, args.image_size, args.image_size, generator=generator
    )
    y = torch.randint(0, classes, (batch,), generator=generator)
    return _Setup(
        device, gpu, batch, amp, channels, classes, x.to(device), y.to(device)
    )


def _model(args: argparse.Namespace, setup: _Setup) -> Any:
    """The benchmark's model on the device, in the memory format asked for."""
    import torch

    from ..training.models import SmallCNN, resnet

    if args.model == "smallcnn":
        model = SmallCNN()
    else:
        model = resnet(args.model, num_classes=1000)
    model = model.to(setup.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def _step(
    args: argparse.Namespace, setup: _Setup, model: Any, bare: bool
) -> Callable[[], None]:
    """One training step of ``model``, with its own optimizer: ``--bare``'s or ours."""
    import torch

    from ..training.steps import train_step

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda") if setup.amp == "fp16" else None
    if bare:
        x, y, cl = setup.x, setup.y, args.channels_last
        return _bare_step(model, x, y, optimizer, setup.amp, scaler, cl)
    return partial(  # the workshop's loop: train_step on the one batch
        train_step,
        model,
        [(setup.x, setup.y)],
        optimizer,
        amp=setup.amp,
        scaler=scaler,
        channels_last=args.channels_last,
    )


def _settings(args: argparse.Namespace, setup: _Setup) -> dict:
    """What a run measured, as its JSON file starts: model, device, batch and so on."""
    device = _device_name(setup)
    first = {"model": args.model, "device": device, "batch_size": setup.batch}
    then = {"image_size": args.image_size, "amp": setup.amp}
    return first | then | {"channels_last": args.channels_last, "steps": args.steps}


def _device_name(setup: _Setup) -> str:
    import torch

    return torch.cuda.get_device_name(setup.device) if setup.gpu else "CPU"


def _heading(args: argparse.Namespace, setup: _Setup) -> str:
    return (
        f"{args.model} on {_device_name(setup)} ({setup.device}), batch "
        f"{setup.batch}, {args.image_size}px, amp={setup.amp or 'fp32'}, "
        f"channels_last={args.channels_last}"
    )


def _timed(step: Callable[[], None], steps: int, gpu: bool) -> float:
    """Seconds of ``steps`` steps, the device's queue drained at both ends."""
    import torch

    if gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def train_main(args: argparse.Namespace) -> int:
    """Time training steps and print samples per second (``--compile``: three loops)."""
    import torch

    setup = _setup(args)
    if args.compile:
        return compiled_main(args, setup)
    step = _step(args, setup, _model(args, setup), args.bare)
    for _ in range(args.warmup):
        step()
    seconds = _timed(step, args.steps, setup.gpu)
    rate = setup.batch * args.steps / seconds
    print(
        f"{_heading(args, setup)}{', plain PyTorch loop' if args.bare else ''}: "
        f"{rate:,.0f} samples/s ({seconds / args.steps * 1e3:.1f} ms per step, "
        f"{args.steps} steps)"
    )
    if args.json:
        loop = "bare" if args.bare else "workshop"
        report = _settings(args, setup) | {"loop": loop, "seconds": seconds}
        report |= {"samples_per_second": rate, "torch": torch.__version__}
        write_json(args.json, report, say=False)
    return 0


# ------------------------------------------------------------------ --compile
@dataclass
class LoopTimes:
    """One loop of ``--compile``: its warm-up apart from its steady state.

    Attributes:
        loop: "eager, workshop", "compiled, workshop" or "compiled, bare".
        warmup_steps: seconds of each untimed first step (the first compiles).
        compiled_steps: the warm-up steps (from 1) that compiled a graph, where the
            loop counts them (the workshop's compiled loop).
        seconds: the timed steps' seconds, after the warm-up.
    """

    loop: str
    warmup_steps: list[float] = field(default_factory=list)
    compiled_steps: list[int] = field(default_factory=list)
    seconds: float = 0.0
    samples_per_second: float = 0.0

    @property
    def warmup_seconds(self) -> float:
        return sum(self.warmup_steps)


def _run_loop(
    name: str, model: Any, args: argparse.Namespace, setup: _Setup, bare: bool = False
) -> LoopTimes:
    """``model``'s loop (:func:`_step`): warm-up steps one by one, then the timed."""
    import torch

    from ..training.compiled import graphs_compiled

    step = _step(args, setup, model, bare)
    times = LoopTimes(name)
    for number in range(1, max(args.warmup, 1) + 1):
        graphs = graphs_compiled()
        times.warmup_steps.append(_timed(step, 1, setup.gpu))
        if graphs_compiled() > graphs:
            times.compiled_steps.append(number)
    times.seconds = _timed(step, args.steps, setup.gpu)
    times.samples_per_second = setup.batch * args.steps / times.seconds
    if setup.gpu:
        torch.cuda.empty_cache()
    return times


def compiled_main(args: argparse.Namespace, setup: _Setup) -> int:
    """``--compile``: the three loops on copies of one model, and their ratio."""

    from ..training.compiled import inductor_unavailable, no_triton_pool

    # On a CPU inductor builds C++: a compiler that cannot is said in one line
    # before any loop runs, not as CppCompileError's pages after the eager one.
    why = None if setup.gpu else inductor_unavailable()
    if why:
        print(
            f"python -m workshop.bench train: error: --compile: {why}", file=sys.stderr
        )
        return 1
    if not setup.gpu:
        # Both compiled loops alike: no pool of Triton compile workers (none of use
        # on a CPU) starting while they are timed (no_triton_pool says why).
        with no_triton_pool():
            return _compiled_loops(args, setup)
    return _compiled_loops(args, setup)


def _compiled_loops(args: argparse.Namespace, setup: _Setup) -> int:
    """The three loops of :func:`compiled_main`, their table and JSON."""
    import torch

    from ..training.compiled import compile_model

    base = _model(args, setup)
    rows = [_run_loop("eager, workshop", copy.deepcopy(base), args, setup)]
    # The workshop's compiled loop: compile_model, as train(compile=True) does.
    ours = compile_model(copy.deepcopy(base), "inductor")
    rows.append(_run_loop("compiled, workshop", ours, args, setup))
    del ours
    # The bare compiled loop: plain PyTorch (torch.compile's caches emptied first,
    # as compile_model does, so that it compiles afresh too).
    torch._dynamo.reset()
    bare = torch.compile(copy.deepcopy(base))
    rows.append(_run_loop("compiled, bare", bare, args, setup, bare=True))
    del bare
    _print_compiled(args, setup, rows)
    if args.json:
        report = {
            **_settings(args, setup),
            "loops": [asdict(r) | {"warmup_seconds": r.warmup_seconds} for r in rows],
            "ratio": rows[1].samples_per_second / rows[2].samples_per_second,
            "torch": torch.__version__,
        }
        write_json(args.json, report, say=False)
    return 0


def _print_compiled(
    args: argparse.Namespace, setup: _Setup, rows: list[LoopTimes]
) -> None:
    """The table of :func:`compiled_main`, the ratio and when compiling pays off."""
    eager, ours, bare = rows
    warm = max(args.warmup, 1)
    print(_heading(args, setup))
    print(f"{warm} warm-up step{'s' if warm > 1 else ''}, then {args.steps} timed")
    print(
        f"\n{'loop':<20}{'first step s':>13}{'warm-up s':>11}{'steady samples/s':>18}"
        f"{'ms/step':>9}"
    )
    for row in rows:
        print(
            f"{row.loop:<20}{row.warmup_steps[0]:>13.2f}{row.warmup_seconds:>11.2f}"
            f"{row.samples_per_second:>18,.0f}"
            f"{row.seconds / args.steps * 1e3:>9.1f}"
        )
    compiled = ", ".join(map(str, ours.compiled_steps)) or "none"
    print(f"\nwarm-up steps of the workshop's compiled loop that compiled: {compiled}")
    ratio = ours.samples_per_second / bare.samples_per_second
    print(
        f"workshop compiled / bare compiled: {ratio:.3f} (steady state; goal on a "
        "GPU node: >= 0.98)"
    )
    gain = ours.samples_per_second / eager.samples_per_second
    saved = eager.seconds / args.steps - ours.seconds / args.steps  # per step
    extra = ours.warmup_seconds - eager.warmup_seconds
    if saved > 0:
        steps = extra / saved
        pays = (
            f"its extra warm-up ({extra:.1f} s) is paid back after {steps:,.0f} steps"
        )
    else:
        pays = "no step is faster here: never paid back"
    print(f"compiled / eager (the workshop's loop): {gain:.2f}x")
    print(f"  {pays}")
    print(
        "(the bare loop compiles second: inductor's cache on disk may shorten its "
        "warm-up)"
    )
