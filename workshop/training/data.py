"""Datasets and data loaders for the training lessons.

Three sources, from smallest to largest:

* :func:`digits`: scikit-learn's 1,797 handwritten digits, shipped inside the
  scikit-learn package, so every notebook runs offline and trains in seconds on a CPU
  (notebook 01, notebook 02's DDP section, the tests).
* :func:`cifar10`: CIFAR-10 read from a directory that is already on disk, the usual
  case on a cluster, where compute nodes often cannot reach the internet and datasets
  live in a shared folder. Its files are checked against their published MD5 sums
  and unpickled by a reader that runs no code, since others may write that folder
  (:mod:`workshop.training.cifar`, re-exported here).
* :func:`synthetic`: random images made on demand, for throughput measurements where
  the data does not matter but its shape does.

:func:`make_loader` (in :mod:`workshop.training.loaders`, re-exported here) wraps any of
them in a seeded ``DataLoader`` and :func:`~workshop.training.loaders.time_loader`
measures how fast a loader delivers samples.
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
    """Where this user's copy of a split lives, named after the scikit-learn data
    file it came from (its path, size and time) and the seed; None where there is no
    scikit-learn or no home to keep it in.

    Every rank that torchrun, srun, mpirun or a spawn starts is a fresh Python:
    without the copy each one imports scikit-learn to split the same 1,797 images,
    about a second of CPU, more than the epoch it then trains on a laptop.
    """
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
    """The digits as float32 images in [0, 1], split 80/20, stratified by label.

    Cached: a notebook asks for the train and the test split one after the other, and
    both must come from the same split of the same data; and on disk, for the next
    process (:func:`_digits_cache_file`).
    """
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

    1,797 grey-scale 8x8 images of the digits 0-9, split 80/20 (1,437 train, 360
    test) with a fixed, seeded split stratified by label. Images are scaled to [0, 1],
    upsampled to ``size`` x ``size`` with bilinear interpolation (a convolutional net
    has more room to work on 16x16 than on 8x8), then normalised with the mean and
    standard deviation of the training split at that size; the test split uses the
    training split's statistics, as it must. No download: the data ships inside
    scikit-learn. The split is kept in ``~/.cache/scaling-pytorch-hpc`` (or
    ``$XDG_CACHE_HOME``), so that a fresh rank need not import scikit-learn again.

    Args:
        split: "train" or "test".
        size: side of the returned images in pixels; 8 keeps the originals.
        seed: seed of the train/test split; the same seed always gives the same split.

    Returns:
        A ``TensorDataset`` of (image, label): images float32 of shape
        (N, 1, size, size), labels int64 in 0..9.

    Raises:
        ValueError: an unknown split, a size that is not a whole number >= 1, or a
            seed that is not one >= 0.

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
        self.n = n
        self.shape = (channels, image_size, image_size)
        self.num_classes = num_classes
        self.seed = seed

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
    default).

    Each sample is made when it is asked for, from a generator seeded with
    ``(seed, index)``: the same index always gives the same sample, and a dataset of a
    million images costs no memory. The images are noise, so a model learns nothing
    from them; use them to time steps, not to check accuracy.

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
    for name, value in (
        ("n", n),
        ("image_size", image_size),
        ("channels", channels),
        ("num_classes", num_classes),
    ):
        whole(name, value, fix="e.g. synthetic(1024, image_size=224)")
    return _Synthetic(n, image_size, channels, num_classes, seed)
