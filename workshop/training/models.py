"""Models for the training lessons: a small CNN that trains in seconds on a CPU, and
torchvision's ResNets (randomly initialised) for GPU throughput measurements."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ..checks import one_of, whole

__all__ = [
    "RESNETS",
    "SmallCNN",
    "count_parameters",
    "held_bytes",
    "module_figures",
    "module_tensor_sizes",
    "resnet",
    "saved_tensor_bytes",
    "smallest_image",
]

#: The ResNets :func:`resnet` builds.
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


def _conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    # No bias in the convolution: BatchNorm's shift would cancel it anyway.
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """A small convolutional classifier: three conv-BatchNorm-ReLU blocks with
    max-pooling between them, global average pooling (any image of 4x4 or more), one
    linear layer. On :func:`workshop.training.data.digits` it reaches about 98 % test
    accuracy in three epochs of under a second each on one CPU core.

    Args:
        in_channels: channels of the input images (1 for digits, 3 for CIFAR-10).
        num_classes: number of output classes.
        width: channels of the first block; the second and third have 2x and 4x.

    Raises:
        ValueError: an argument below 1.

    Example:
        >>> model = SmallCNN()
        >>> model(torch.zeros(2, 1, 16, 16)).shape
        torch.Size([2, 10])
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32):
        super().__init__()
        sizes = {"in_channels": in_channels, "num_classes": num_classes}
        for name, value in (sizes | {"width": width}).items():
            whole(name, value, fix="e.g. SmallCNN(in_channels=3, width=32)")
        self.features = nn.Sequential(
            _conv_bn_relu(in_channels, width),
            nn.MaxPool2d(2),
            _conv_bn_relu(width, 2 * width),
            nn.MaxPool2d(2),
            _conv_bn_relu(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits) of shape (batch, num_classes)."""
        return self.classifier(self.features(x))


def resnet(name: str = "resnet18", num_classes: int = 1000, in_channels: int = 3):
    """A torchvision ResNet with random weights; never downloads anything (compute
    nodes often have no internet, and the lessons measure speed, not accuracy).

    Args:
        name: one of :data:`RESNETS`.
        num_classes: outputs of the final layer.
        in_channels: channels of the input; other than 3, the first convolution is
            replaced by one with that many input channels.

    Returns:
        A ``torchvision.models.ResNet``.

    Raises:
        ValueError: an unknown name, or a count below 1.

    Example:
        >>> count_parameters(resnet("resnet18"))
        11689512
    """
    one_of("name", name, RESNETS)
    whole("num_classes", num_classes)
    whole("in_channels", in_channels)
    import torchvision.models

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if in_channels != 3:
        old = model.conv1
        model.conv1 = nn.Conv2d(
            in_channels,
            old.out_channels,
            kernel_size=old.kernel_size,
            stride=old.stride,
            padding=old.padding,
            bias=False,
        )
    return model


def smallest_image(name: str, batch: int) -> int:
    """The smallest image side, in pixels, that a model trains on in batches of
    ``batch`` (BatchNorm needs two values per channel: from a batch of 1, only where
    the last stage keeps more than 1 pixel).

    Args:
        name: "smallcnn" (or "cnn") or one of :data:`RESNETS`.
        batch: samples per step.

    Returns:
        The side in pixels: 4 (SmallCNN) or 1 (a ResNet) in batches of 2 or more;
        8 or 33 in batches of 1.

    Example:
        >>> smallest_image("resnet50", 1), smallest_image("smallcnn", 32)
        (33, 4)
    """
    if name in RESNETS:
        return 1 if batch > 1 else 33
    return 4 if batch > 1 else 8


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (numbers to learn) in ``model``, a shared one once.

    Args:
        model: any module.
        trainable_only: count only parameters with ``requires_grad``.

    Returns:
        The total number of elements of the parameters.

    Raises:
        TypeError: ``model`` is not a module (a class, None, a state dict).

    Example:
        >>> count_parameters(torch.nn.Linear(10, 2))
        22
    """
    if not isinstance(model, nn.Module):  # SmallCNN, not SmallCNN()'s class
        raise TypeError(
            f"model must be a torch.nn.Module, got {model!r:.60}; e.g. "
            "count_parameters(SmallCNN())"
        )
    return sum(
        p.numel() for p in model.parameters() if p.requires_grad or not trainable_only
    )


# --- what a model holds ---------------------------------------------------------
def held_bytes(parts: Mapping[str, Iterable[Any]]) -> dict[str, int]:
    """Bytes of memory the tensors of each part hold, each storage counted once,
    whole, in the first part that names it (a view keeps its whole buffer alive). A
    ``DTensor`` counts its local shard; ``None`` and "meta" tensors count nothing.

    Args:
        parts: for each part ("params", "grads", "optimizer", ...), its tensors.

    Returns:
        Bytes per part, and "total".

    Example:
        >>> import torch
        >>> flat = torch.zeros(10)
        >>> held_bytes({"params": [flat, flat[:5]], "grads": [flat[5:]]})
        {'params': 40, 'grads': 0, 'total': 40}
    """
    seen: set[tuple[str, int]] = set()
    counted: dict[str, int] = {}
    for name, tensors in parts.items():
        counted[name] = 0
        for tensor in tensors:
            if tensor is None:
                continue
            if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard
                tensor = tensor.to_local()
            if tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if storage.nbytes() == 0 or key in seen:
                continue
            seen.add(key)
            counted[name] += storage.nbytes()
    counted["total"] = sum(counted.values())
    return counted


def saved_tensor_bytes(
    run: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()
) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``run()`` runs,
    each storage once (a view counts its whole base), ``exclude`` left out.

    Example:
        >>> lin = torch.nn.Linear(4, 4)
        >>> saved_tensor_bytes(lambda: lin(torch.ones(2, 4)), lin.parameters())
        32
    """
    skip = {_storage_key(t) for t in exclude}
    seen: dict[Any, int] = {}
    alive: list[torch.Tensor] = []  # keeps ids unique while counting on meta

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key not in skip and key not in seen:
            base = tensor if tensor._base is None else tensor._base
            alive.append(base)
            if base.device.type == "meta":
                seen[key] = base.numel() * base.element_size()
            else:
                seen[key] = base.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(seen.values())


def _storage_key(tensor: torch.Tensor) -> Any:
    base = tensor if tensor._base is None else tensor._base
    if base.device.type == "meta":
        return ("meta", id(base))
    return (str(base.device), base.untyped_storage().data_ptr())


@functools.cache
def module_figures(
    builder: Callable[[], nn.Module], sample: tuple[int, ...], precision: str
) -> tuple[int, float]:
    """(saved bytes, forward FLOPs) of one sample of ``builder()``'s module, counted
    on the meta device (nothing allocated) and cached; ``precision``: "bf16", "fp32"."""
    from torch.utils.flop_counter import FlopCounterMode

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.device("meta"):
        module = builder().to(dtype)
    module.train()
    batch = torch.empty((1, *sample), device="meta", dtype=dtype)
    saved = saved_tensor_bytes(lambda: module(batch), module.parameters())
    with FlopCounterMode(display=False) as counter:
        module(batch)
    return saved, float(counter.get_total_flops())


@functools.cache
def module_tensor_sizes(builder: Callable[[], nn.Module]) -> tuple[int, ...]:
    """Values of each parameter tensor of ``builder()``'s module, in order (built on
    the meta device once)."""
    with torch.device("meta"):
        return tuple(p.numel() for p in builder().parameters())
