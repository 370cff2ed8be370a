"""Training throughput of one device: ``python -m workshop.bench train``.

Trains a model on synthetic images for a fixed number of steps and prints samples
per second, so a GPU node's figure can be set beside published ones (ResNet-50 with
bf16 and channels_last on an H100: about 2,600 to 2,800 images per second).

``--bare`` times the same model, batch, precision and memory format with a training
loop written out in plain PyTorch instead of the workshop's ``train_step``, so the
two figures show what the workshop's loop costs (``python -m workshop check-node`` runs
both on a GPU node).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m workshop.bench train``."""
    parser.add_argument(
        "--model",
        default="resnet50",
        help="smallcnn or a torchvision ResNet name (default resnet50)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="samples per step (default 256 on a GPU, 8 on the CPU)",
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="bf16")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="time a plain PyTorch loop instead of the workshop's train_step",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")


def _workshop_step(
    model: Any,
    x: Any,
    y: Any,
    optimizer: Any,
    amp: str | None,
    scaler: Any,
    channels_last: bool,
) -> Callable[[], None]:
    """One training step of the workshop's loop (``train_step``), as a function."""
    from ..training.steps import train_step

    def step() -> None:
        train_step(
            model,
            [(x, y)],
            optimizer,
            amp=amp,
            scaler=scaler,
            channels_last=channels_last,
        )

    return step


def _bare_step(
    model: Any,
    x: Any,
    y: Any,
    optimizer: Any,
    amp: str | None,
    scaler: Any,
    channels_last: bool,
) -> Callable[[], None]:
    """One training step in plain PyTorch, for ``--bare``: no workshop code in it.

    It does what ``train_step`` does with one micro-batch: the batch (already on the
    device here) into the memory format, the forward pass and the loss under
    autocast, backward, step. ``train_step`` also sums the loss and counts correct
    predictions on the device; that bookkeeping is part of what the two figures
    compare.
    """
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


def main(args: argparse.Namespace) -> int:
    """Time training steps and print samples per second."""
    import torch

    from ..env import visible_gpu_count
    from ..training.models import SmallCNN, resnet
    from ..training.steps import resolve_device

    device = resolve_device()
    gpu = visible_gpu_count() > 0
    batch = args.batch_size or (256 if gpu else 8)
    amp = None if args.amp == "none" or (args.amp == "fp16" and not gpu) else args.amp
    if args.model == "smallcnn":
        model, channels, classes = SmallCNN(), 1, 10
    else:
        model, channels, classes = resnet(args.model, num_classes=1000), 3, 1000
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(
        batch, channels, args.image_size, args.image_size, generator=generator
    )
    y = torch.randint(0, classes, (batch,), generator=generator)
    x, y = x.to(device), y.to(device)

    make_step = _bare_step if args.bare else _workshop_step
    step = make_step(model, x, y, optimizer, amp, scaler, args.channels_last)

    for _ in range(args.warmup):
        step()
    if gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    rate = batch * args.steps / seconds
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    print(
        f"{args.model} on {name} ({device}), batch {batch}, {args.image_size}px, "
        f"amp={amp or 'fp32'}, channels_last={args.channels_last}"
        f"{', plain PyTorch loop' if args.bare else ''}: "
        f"{rate:,.0f} samples/s ({seconds / args.steps * 1e3:.1f} ms per step, "
        f"{args.steps} steps)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model": args.model,
                    "device": name,
                    "batch_size": batch,
                    "image_size": args.image_size,
                    "amp": amp,
                    "channels_last": args.channels_last,
                    "steps": args.steps,
                    "loop": "bare" if args.bare else "workshop",
                    "seconds": seconds,
                    "samples_per_second": rate,
                    "torch": torch.__version__,
                },
                f,
                indent=2,
            )
    return 0
