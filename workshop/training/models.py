"""Models for the training lessons: a small CNN that trains in seconds on a CPU, and
torchvision's ResNets (randomly initialised) for GPU throughput measurements."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RESNETS", "SmallCNN", "count_parameters", "resnet"]

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
    max-pooling between them, global average pooling, one linear layer.

    Trained by :func:`workshop.training.loop.train` with its defaults on
    :func:`workshop.training.data.digits` (16x16, batches of 64), it reaches about 98 %
    test accuracy in three epochs of well under a second each on one CPU core. Global
    average pooling makes it accept any image size of 4x4 or more.

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
        for name, value in (
            ("in_channels", in_channels),
            ("num_classes", num_classes),
            ("width", width),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name}={value!r} must be a whole number, 1 or more; for "
                    "example SmallCNN(in_channels=3, num_classes=10, width=32)"
                )
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
    """A torchvision ResNet with random weights; never downloads anything.

    Compute nodes often have no internet access, and the lessons measure speed, not
    accuracy, so pretrained weights are never asked for.

    Args:
        name: one of :data:`RESNETS`.
        num_classes: outputs of the final layer.
        in_channels: channels of the input; other than 3, the first convolution is
            replaced by one with that many input channels.

    Returns:
        A ``torchvision.models.ResNet``.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or a count
            below 1.

    Example:
        >>> count_parameters(resnet("resnet18"))
        11689512
    """
    if name not in RESNETS:
        raise ValueError(
            f"unknown ResNet name={name!r}; pass one of "
            + ", ".join(repr(n) for n in RESNETS)
        )
    for arg, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg}={value!r} must be a whole number, 1 or more")
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


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (numbers to learn) in ``model``.

    A parameter shared between layers counts once. Works on a model wrapped in
    ``DistributedDataParallel`` too.

    Args:
        model: any module.
        trainable_only: count only parameters with ``requires_grad``.

    Returns:
        The total number of elements of the parameters.

    Example:
        >>> count_parameters(torch.nn.Linear(10, 2))
        22
    """
    return sum(
        p.numel() for p in model.parameters() if p.requires_grad or not trainable_only
    )
