"""Datasets and data loaders for the training lessons.

:func:`digits` (scikit-learn's 1,797 handwritten digits: offline, seconds on a CPU)
and :func:`synthetic` (random images made on demand, for throughput measurements);
CIFAR-10 from a shared folder is in :mod:`workshop.training.cifar`, and
:func:`~workshop.training.loaders.make_loader` wraps any of them in a seeded loader.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from ..checks import one_of, whole

__all__ = ["digits", "synthetic"]

_SPLITS = ("train", "test")


# The four arrays of a split, in the order train_test_split returns them.
_ARRAYS = ("x_train", "x_test", "y_train", "y_test")
_CACHE_FORMAT = 1  # raise it when what a cache file holds changes


def _digits_cache_file(seed: int) -> Path | None:
    """Where this user's copy of a split lives, keyed by scikit-learn's data file and
    the seed (None without either): a fresh rank would otherwise import scikit-learn
    to split the same images, about a second, more than an epoch on a laptop."""
    spec = importlib.util.find_spec("sklearn")  # finds it, does not import it
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    try:
        stat = source.stat()
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except (OSError, RuntimeError):  # RuntimeError: no home for this user
        return None
    key = f"{_CACHE_FORMAT}|{source}|{stat.st_size}|{stat.st_mtime_ns}|{seed}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return home / "scaling-pytorch-hpc" / f"digits-{digest}.npz"


def _read_cached(path: Path) -> tuple[np.ndarray, ...] | None:
    try:
        with np.load(path, allow_pickle=False) as saved:
            return tuple(saved[name] for name in _ARRAYS)
    # None yet, or a file cut short (zip's checksums catch a damaged one).
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def _write_cached(path: Path, arrays: tuple[np.ndarray, ...]) -> None:
    """Write the copy whole or not at all: ranks starting together may each write
    it, and each renames a finished file of its own into place."""
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(partial, **dict(zip(_ARRAYS, arrays, strict=True)))
        os.replace(partial, path)
    except BaseException as error:  # an interrupt too: leave no partial file behind
        with contextlib.suppress(OSError):
            partial.unlink()
        if not isinstance(error, OSError):
            raise
        # A home that is full or read-only: the next rank splits again.


@functools.lru_cache(maxsize=4)
def _digits_arrays(seed: int) -> tuple[np.ndarray, ...]:
    """The digits as float32 images in [0, 1], split 80/20, stratified by label;
    cached here (both splits from one split) and on disk for the next process."""
    cache = _digits_cache_file(seed)
    if cache is not None:
        cached = _read_cached(cache)
        if cached is not None:
            return cached
    arrays = _split_digits(seed)
    if cache is not None:
        _write_cached(cache, arrays)
    return arrays


def _split_digits(seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    # Pixel values are counts 0..16 (ink in a 4x4 block of the original 32x32 scan).
    images = (bunch.images / 16.0).astype(np.float32)
    labels = bunch.target.astype(np.int64)
    # Stratified, so both splits hold each digit in the same proportion (about 36
    # test images per digit) and test accuracy is not skewed by an unlucky draw.
    return tuple(
        train_test_split(
            images, labels, test_size=0.2, stratify=labels, random_state=seed
        )
    )


def digits(split: str = "train", size: int = 16, seed: int = 0) -> TensorDataset:
    """scikit-learn's handwritten digits as a ready-to-train ``TensorDataset``.

    1,797 grey-scale 8x8 images, a seeded 80/20 split (1,437 train, 360 test),
    upsampled bilinearly to ``size`` and normalised with the training split's
    statistics. No download; the split is kept in ``~/.cache/scaling-pytorch-hpc``.

    Args:
        split: "train" or "test".
        size: side of the returned images in pixels; 8 keeps the originals.
        seed: seed of the train/test split.

    Returns:
        A ``TensorDataset`` of (image, label): images float32 of shape
        (N, 1, size, size), labels int64 in 0..9.

    Raises:
        ValueError: an unknown split, a size below 1 or a negative seed.

    Example:
        >>> train = digits("train")
        >>> image, label = train[0]
        >>> tuple(image.shape), label.dtype
        ((1, 16, 16), torch.int64)
    """
    one_of("split", split, _SPLITS)
    whole("size", size, fix="e.g. size=16 (or size=8 for the original images)")
    whole("seed", seed, least=0, fix="e.g. seed=0")
    x_train, x_test, y_train, y_test = _digits_arrays(seed)

    def to_tensor(images: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(images).unsqueeze(1)  # (N, 1, 8, 8)
        if size != 8:
            x = torch.nn.functional.interpolate(
                x, size=(size, size), mode="bilinear", align_corners=False
            )
        return x

    train_images = to_tensor(x_train)
    mean, std = train_images.mean(), train_images.std()
    images = train_images if split == "train" else to_tensor(x_test)
    labels = y_train if split == "train" else y_test
    return TensorDataset((images - mean) / std, torch.from_numpy(labels.copy()))


class _Synthetic(Dataset):
    """Random images made when asked for, the same ones for the same index."""

    def __init__(
        self, n: int, image_size: int, channels: int, num_classes: int, seed: int
    ) -> None:
        self.n, self.num_classes, self.seed = n, num_classes, seed
        self.shape = (channels, image_size, image_size)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -self.n <= index < self.n:
            raise IndexError(f"index {index} is out of range for {self.n} samples")
        index %= self.n
        # One generator per (seed, index): any worker, in any order, makes the same
        # sample, and nothing of size n is ever held in memory.
        state = np.random.SeedSequence([self.seed, index]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(state))
        image = torch.randn(self.shape, generator=generator)
        label = torch.randint(self.num_classes, (), generator=generator)
        return image, label

    def __repr__(self) -> str:
        channels, size, _ = self.shape
        return (
            f"synthetic(n={self.n}, image_size={size}, channels={channels}, "
            f"num_classes={self.num_classes}, seed={self.seed})"
        )


def synthetic(
    n: int,
    image_size: int = 224,
    channels: int = 3,
    num_classes: int = 1000,
    seed: int = 0,
) -> Dataset:
    """Random images and labels for throughput measurements (ImageNet-shaped by
    default), each made when asked for from ``(seed, index)``: no memory held, the
    same sample for the same index, and nothing to learn.

    Args:
        n: number of samples.
        image_size: height and width of each image.
        channels: channels of each image.
        num_classes: labels are drawn from 0..num_classes-1.
        seed: changes every sample.

    Returns:
        A map-style dataset of (image float32 (channels, image_size, image_size),
        label int64 scalar).

    Raises:
        ValueError: a size or count below 1.

    Example:
        >>> data = synthetic(1000, image_size=64)
        >>> data[3][0].shape
        torch.Size([3, 64, 64])
    """
    sizes = {"n": n, "image_size": image_size, "channels": channels}
    for name, value in (sizes | {"num_classes": num_classes}).items():
        whole(name, value, fix="e.g. synthetic(1024, image_size=224)")
    return _Synthetic(n, image_size, channels, num_classes, seed)
