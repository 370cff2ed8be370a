"""workshop.training.data: the shipped digits, CIFAR-10 from a local folder, synthetic
images, seeded loaders and the loader timer."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from workshop.training.data import (
    _digits_arrays,
    _digits_cache_file,
    digits,
    synthetic,
)
from workshop.training.loaders import make_loader, time_loader

# --- digits ---------------------------------------------------------------------------


def test_digits_splits_80_20_with_images_and_labels_of_the_right_kind():
    train, test = digits("train"), digits("test")
    images, labels = train.tensors
    assert (len(train), len(test)) == (1437, 360)
    assert images.shape == (1437, 1, 16, 16)
    assert images.dtype == torch.float32
    assert labels.dtype == torch.int64
    assert set(labels.tolist()) == set(range(10))


def test_digits_are_normalised_with_the_training_statistics():
    train_images = digits("train").tensors[0]
    assert abs(train_images.mean().item()) < 1e-5
    assert abs(train_images.std().item() - 1) < 1e-5
    # The test split uses the training statistics, so its own are near but not equal.
    test_images = digits("test").tensors[0]
    assert abs(test_images.mean().item()) < 0.1
    assert test_images.mean().item() != pytest.approx(0, abs=1e-5)


def test_digits_at_size_8_are_the_original_pixels_normalised():
    from sklearn.datasets import load_digits

    images = digits("train", size=8).tensors[0]
    assert images.shape == (1437, 1, 8, 8)
    # Undo the normalisation: back to 17 ink levels, 0/16 .. 16/16.
    pixels = (images - images.min()) / (images.max() - images.min())
    levels = torch.unique(torch.round(pixels * 16))
    assert levels.tolist() == [float(v) for v in range(17)]
    assert load_digits().images.max() == 16


def test_digits_are_deterministic_and_the_seed_changes_the_split():
    first, again = digits("train", seed=0), digits("train", seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(first.tensors, again.tensors, strict=True)
    )
    other = digits("train", seed=1)
    assert not torch.equal(first.tensors[1], other.tensors[1])


def test_digits_upsamples_to_any_size():
    assert digits("test", size=28).tensors[0].shape == (360, 1, 28, 28)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and no split kept in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _digits_arrays.cache_clear()
    yield tmp_path / "scaling-pytorch-hpc"
    _digits_arrays.cache_clear()


def test_a_damaged_copy_is_split_again_and_replaced(own_cache):
    computed = _digits_arrays(0)
    (kept,) = own_cache.glob("digits-*.npz")
    whole = kept.read_bytes()
    kept.write_bytes(whole[: len(whole) // 2])  # a disk that filled up mid-write
    _digits_arrays.cache_clear()
    again = _digits_arrays(0)
    assert all(np.array_equal(a, b) for a, b in zip(computed, again, strict=True))
    assert kept.read_bytes() == whole
    assert [p.name for p in own_cache.iterdir()] == [kept.name]  # no partial left


def test_an_interrupted_write_leaves_no_partial_file(own_cache, monkeypatch):
    def cut_short(file, **arrays):
        Path(file).write_bytes(b"half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", cut_short)
    with pytest.raises(KeyboardInterrupt):
        _digits_arrays(0)
    assert list(own_cache.iterdir()) == []


def test_the_copy_is_named_after_the_seed_and_the_data_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    names = {_digits_cache_file(seed).name for seed in (0, 0, 1)}
    assert len(names) == 2
    assert _digits_cache_file(0).parent == tmp_path / "scaling-pytorch-hpc"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"split": "val"},
            r"split must be one of 'train' or 'test', not 'val'",
        ),
        ({"size": 0}, r"size must be a whole number, 1 or more, not 0"),
        ({"size": 16.0}, r"size must be a whole number, 1 or more, not 16\.0"),
        # scikit-learn's "random_state parameter of train_test_split" before.
        (
            {"seed": "x"},
            r"seed must be a whole number, 0 or more, not 'x'; e\.g\. seed=0",
        ),
        ({"seed": -1}, r"seed must be a whole number, 0 or more, not -1"),
    ],
)
def test_digits_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        digits(**kwargs)


# --- synthetic ------------------------------------------------------------------------


def test_synthetic_samples_have_the_asked_shape_and_labels():
    data = synthetic(100, image_size=32, channels=3, num_classes=7)
    image, label = data[99]
    assert len(data) == 100
    assert image.shape == (3, 32, 32)
    assert image.dtype == torch.float32
    assert label.dtype == torch.int64
    assert {int(data[i][1]) for i in range(100)} <= set(range(7))


def test_synthetic_is_made_per_index_and_deterministic():
    # A billion ImageNet-sized images would be 600 TB if made up front.
    start = time.perf_counter()
    huge = synthetic(10**9)
    assert time.perf_counter() - start < 0.1
    assert not any(isinstance(v, torch.Tensor) for v in vars(huge).values())

    a, b = synthetic(50, image_size=8), synthetic(50, image_size=8)
    assert torch.equal(a[7][0], b[7][0]) and a[7][1] == b[7][1]
    assert torch.equal(a[-1][0], a[49][0])
    assert not torch.equal(a[7][0], a[8][0])
    assert not torch.equal(a[7][0], synthetic(50, image_size=8, seed=1)[7][0])


def test_synthetic_rejects_out_of_range_indices_and_bad_sizes():
    with pytest.raises(IndexError, match=r"index 10 is out of range for 10 samples"):
        synthetic(10, image_size=4)[10]
    with pytest.raises(
        ValueError, match=r"image_size must be a whole number, 1 or more, not 0"
    ):
        synthetic(10, image_size=0)


# --- loaders --------------------------------------------------------------------------


def _order(loader) -> list[int]:
    return [int(v) for _, labels in loader for v in labels]


def test_make_loader_shuffles_reproducibly_by_seed():
    data = torch.utils.data.TensorDataset(torch.zeros(40, 1), torch.arange(40))
    first = _order(make_loader(data, 8, shuffle=True, seed=3))
    assert first == _order(make_loader(data, 8, shuffle=True, seed=3))
    assert first != _order(make_loader(data, 8, shuffle=True, seed=4))
    assert sorted(first) == list(range(40))
    assert _order(make_loader(data, 8, shuffle=False)) == list(range(40))


def test_make_loader_with_persistent_workers_shuffles_reproducibly():
    data = torch.utils.data.TensorDataset(torch.zeros(24, 1), torch.arange(24))

    def persistent():
        return make_loader(
            data, 4, shuffle=True, seed=1, num_workers=2, persistent_workers=True
        )

    first, second = persistent(), persistent()
    passes = [_order(first), _order(first)]
    assert passes == [_order(second), _order(second)]
    # The first pass is that of a loader without workers. Later ones differ from
    # its later ones, still reproducibly: a loader without persistent workers draws
    # a seed for its (absent) workers from the generator at every pass, which
    # shifts the shuffling; persistent workers drew theirs once.
    assert passes[0] == _order(make_loader(data, 4, shuffle=True, seed=1))
    assert sorted(passes[1]) == list(range(24))


def test_make_loader_takes_a_distributed_sampler_and_drop_last():
    data = torch.utils.data.TensorDataset(torch.zeros(10, 1), torch.arange(10))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
    loader = make_loader(data, 2, shuffle=False, sampler=sampler, drop_last=True)
    assert _order(loader) == [1, 3, 5, 7]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, r"batch_size must be a whole number, 1 or more, not 0"),
        ({"num_workers": -1}, r"num_workers must be a whole number, 0 or more, not -1"),
        (
            {"persistent_workers": True},
            r"persistent_workers=True keeps worker processes alive between epochs, "
            r"but num_workers=0 starts none; pass num_workers=2 \(or more\), or "
            r"persistent_workers=False",
        ),
        (
            {"shuffle": True, "sampler": "sampler"},
            r"shuffle=True with sampler=DistributedSampler: the sampler chooses the "
            r"order; pass shuffle=False",
        ),
    ],
)
def test_make_loader_rejects_bad_combinations(kwargs, message):
    data = torch.utils.data.TensorDataset(torch.zeros(4, 1), torch.arange(4))
    if kwargs.get("sampler") == "sampler":
        kwargs["sampler"] = DistributedSampler(data, num_replicas=1, rank=0)
    kwargs = {"batch_size": 2, "shuffle": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        make_loader(data, **kwargs)


@pytest.mark.parametrize(
    ("dataset", "kwargs", "error", "message"),
    [
        # Each was accepted, or failed in torch's words, before (issue 35).
        (None, {}, TypeError, r"dataset must be a map-style dataset \(samples by "
         r"index\), got NoneType; e\.g\. make_loader\(digits\(\), 64"),
        ("data", {"shuffle": "yes"}, TypeError, r"shuffle must be True or False, "
         r"got 'yes'"),
        ("data", {"seed": "x"}, ValueError, r"seed='x' must be a whole number"),
    ],
)  # fmt: skip
def test_make_loader_refuses_a_wrong_kind_of_argument(dataset, kwargs, error, message):
    data = torch.utils.data.TensorDataset(torch.zeros(4, 1), torch.arange(4))
    kwargs = {"shuffle": False, **kwargs}
    with pytest.raises(error, match=message):
        make_loader(data if dataset == "data" else dataset, 2, **kwargs)


def test_time_loader_counts_samples_and_stops_after_the_asked_batches():
    pulled = []

    def batches():
        for i in range(100):
            pulled.append(i)
            yield torch.zeros(5, 2), torch.zeros(5)

    rate = time_loader(batches(), batches=3)
    assert rate > 0
    assert pulled == [0, 1, 2]
    loader = make_loader(synthetic(64, image_size=8), 16, shuffle=False)
    assert time_loader(loader, batches=100) > 0  # fewer batches than asked: fine


def test_time_loader_rejects_no_batches():
    with pytest.raises(
        ValueError, match=r"batches must be a whole number, 1 or more, not 0"
    ):
        time_loader([], batches=0)
    with pytest.raises(ValueError, match=r"the loader yielded no batch"):
        time_loader([], batches=2)


def test_the_docstring_examples_run():
    import doctest

    import workshop.training.cifar
    import workshop.training.data
    import workshop.training.loaders

    training = workshop.training
    for module in (training.data, training.cifar, training.loaders):
        assert doctest.testmod(module).failed == 0, module.__name__
