"""workshop.training.models: the small CNN, torchvision ResNets without downloads,
parameter counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workshop.training.models import (
    RESNETS,
    SmallCNN,
    count_parameters,
    resnet,
    smallest_image,
)


@pytest.mark.parametrize(
    ("in_channels", "size", "num_classes"), [(1, 8, 10), (1, 16, 10), (3, 32, 100)]
)
def test_small_cnn_maps_images_of_any_size_to_class_scores(
    in_channels, size, num_classes
):
    model = SmallCNN(in_channels=in_channels, num_classes=num_classes)
    out = model(torch.randn(2, in_channels, size, size))
    assert out.shape == (2, num_classes)


def test_small_cnn_is_small_and_its_width_scales_it():
    # 3x3 convolutions 1->32->64->128 with BatchNorm, then a 128->10 linear layer.
    assert count_parameters(SmallCNN()) == 94_186
    assert count_parameters(SmallCNN(width=16)) < count_parameters(SmallCNN()) / 3


def test_small_cnn_rejects_bad_sizes():
    with pytest.raises(
        ValueError, match=r"width must be a whole number, 1 or more, not 0"
    ):
        SmallCNN(width=0)


def test_resnet_never_downloads_and_adapts_its_input_and_output(monkeypatch, tmp_path):
    # Downloaded weights would land in $TORCH_HOME/hub/checkpoints.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    model = resnet("resnet18", num_classes=10, in_channels=1)
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 10)
    assert count_parameters(resnet("resnet18")) == 11_689_512  # the published size
    assert list(tmp_path.iterdir()) == []


def test_resnet_unknown_name_lists_the_valid_ones():
    with pytest.raises(
        ValueError,
        match=(
            r"name must be one of 'resnet18', 'resnet34', 'resnet50', 'resnet101' "
            r"or 'resnet152', not 'resnet19'"
        ),
    ):
        resnet("resnet19")
    assert RESNETS[0] == "resnet18"


@pytest.mark.parametrize("model", [None, SmallCNN])  # the class, not a model
def test_count_parameters_wants_a_model(model):
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got "):
        count_parameters(model)


@pytest.mark.parametrize(
    ("name", "batch", "least"), [("smallcnn", 2, 4), ("smallcnn", 1, 8),
                                 ("resnet18", 2, 1), ("resnet18", 1, 33)]
)  # fmt: skip
def test_smallest_image_is_the_smallest_that_trains(name, batch, least):
    model = SmallCNN(in_channels=3) if name == "smallcnn" else resnet(name)
    model.train()

    def step(size: int) -> None:  # forward in train mode: BatchNorm's batch figures
        with torch.no_grad():
            model(torch.zeros(batch, 3, size, size))

    assert smallest_image(name, batch) == least
    step(least)
    if least > 1:
        with pytest.raises((RuntimeError, ValueError)):
            step(least - 1)


def test_count_parameters_counts_shared_ones_once_and_can_skip_frozen_ones():
    layer = nn.Linear(10, 2)  # 20 weights + 2 biases
    assert count_parameters(layer) == 22
    assert count_parameters(nn.Sequential(layer, layer)) == 22
    layer.bias.requires_grad_(False)
    assert count_parameters(layer, trainable_only=True) == 20
