"""Datasets and data loaders for the training lessons.

Three sources, from smallest to largest:

* :func:`digits`: scikit-learn's 1,797 handwritten digits, shipped inside the
  scikit-learn package, so every notebook runs offline and trains in seconds on a CPU
  (notebook 01, notebook 02's DDP section, the tests).
* :func:`cifar10`: CIFAR-10 read from a directory that is already on disk, the usual
  case on a cluster, where compute nodes often cannot reach the internet and datasets
  live in a shared folder.
* :func:`synthetic`: random images made on demand, for throughput measurements where
  the data does not matter but its shape does.

:func:`make_loader` (in :mod:`workshop.loaders`, re-exported here) wraps any of them
in a seeded ``DataLoader`` and :func:`time_loader` measures how fast a loader
delivers samples.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from .loaders import make_loader, time_loader

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "cifar10",
    "digits",
    "make_loader",
    "synthetic",
    "time_loader",
]

_SPLITS = ("train", "test")

#: Per-channel mean and standard deviation of CIFAR-10's training images in [0, 1].
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

_CIFAR_FOLDER = "cifar-10-batches-py"


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f'split={split!r} is not known; pass split="train" or "test"')


@functools.lru_cache(maxsize=4)
def _digits_arrays(seed: int) -> tuple[np.ndarray, ...]:
    """The digits as float32 images in [0, 1], split 80/20, stratified by label.

    Cached: a notebook asks for the train and the test split one after the other, and
    both must come from the same split of the same data.
    """
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
    scikit-learn.

    Args:
        split: "train" or "test".
        size: side of the returned images in pixels; 8 keeps the originals.
        seed: seed of the train/test split; the same seed always gives the same split.

    Returns:
        A ``TensorDataset`` of (image, label): images float32 of shape
        (N, 1, size, size), labels int64 in 0..9.

    Raises:
        ValueError: an unknown split, or a size that is not a whole number >= 1.

    Example:
        >>> train = digits("train")
        >>> image, label = train[0]
        >>> tuple(image.shape), label.dtype
        ((1, 16, 16), torch.int64)
    """
    _check_split(split)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(
            f"size={size!r} must be a whole number of pixels, 1 or more; pass "
            "size=16 (or size=8 for the original images)"
        )
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


def _cifar_root(path: str | Path) -> Path:
    """The directory that holds ``cifar-10-batches-py``, or a clear error."""
    given = Path(path).expanduser()
    if given.name == _CIFAR_FOLDER and given.is_dir():
        root = given.parent
    elif (given / _CIFAR_FOLDER).is_dir():
        root = given
    else:
        if not given.exists():
            found = "that path does not exist"
        elif not given.is_dir():
            found = "that path is a file, not a directory"
        elif (given / "cifar-10-python.tar.gz").exists():
            found = (
                "it holds the archive cifar-10-python.tar.gz, not yet unpacked; run "
                f"`tar -xzf {given / 'cifar-10-python.tar.gz'} -C {given}` first"
            )
        else:
            found = "it is not there"
        raise FileNotFoundError(
            f"no CIFAR-10 found in {str(given)!r}: expected the folder "
            f"{_CIFAR_FOLDER!r} (the python version from the CIFAR-10 site) inside "
            f"it, but {found}; pass the directory that contains it"
        )
    folder = root / _CIFAR_FOLDER
    expected = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    missing = [name for name in expected if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 in {str(folder)!r} is incomplete: {', '.join(missing)} "
            f"missing (expected {', '.join(expected)}); unpack "
            f"cifar-10-python.tar.gz again in {str(root)!r}"
        )
    return root


@functools.cache
def _local_cifar10_class() -> type:
    """torchvision's CIFAR10 reading the same files without their MD5 sums.

    torchvision would otherwise hash all 170 MB again in every rank at every start,
    one more full read from a shared file system that every rank is already reading,
    and would refuse a small stand-in with the same layout (the tests write one).
    :func:`_cifar_root` has checked that the files are there, and a damaged file
    still fails when it is unpickled. (torchvision skips the check of a file whose
    checksum is None.) Made on first use because importing torchvision takes seconds
    that the digits lessons need not pay.
    """
    from torchvision.datasets import CIFAR10

    class _LocalCIFAR10(CIFAR10):
        train_list: ClassVar = [[name, None] for name, _ in CIFAR10.train_list]
        test_list: ClassVar = [[name, None] for name, _ in CIFAR10.test_list]
        meta: ClassVar = {**CIFAR10.meta, "md5": None}

    _LocalCIFAR10.__module__ = __name__
    _LocalCIFAR10.__qualname__ = "_LocalCIFAR10"
    return _LocalCIFAR10


def __getattr__(name: str) -> Any:
    # pickle finds a class by its module and name: a DataLoader worker started with
    # spawn (or a rank started by workshop.launch) gets the class from here without
    # having called cifar10() itself.
    if name == "_LocalCIFAR10":
        return _local_cifar10_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cifar10(path: str | Path, split: str = "train") -> Dataset:
    """CIFAR-10 from a directory already on disk; never downloads.

    Uses torchvision's ``CIFAR10`` reader with ``download=False``. Images come back as
    float32 tensors (3, 32, 32), normalised per channel with :data:`CIFAR10_MEAN` and
    :data:`CIFAR10_STD`; labels are ints 0..9.

    Args:
        path: the directory that contains ``cifar-10-batches-py`` (the "CIFAR-10
            python version" archive, unpacked), or that folder itself. On a cluster,
            the shared datasets directory.
        split: "train" (50,000 images) or "test" (10,000).

    Returns:
        A map-style dataset of (image, label).

    Raises:
        FileNotFoundError: no ``cifar-10-batches-py`` at ``path``, or some of its
            files are missing; the message says what was found.
        ValueError: an unknown split.

    Example:
        >>> train = cifar10("/shared/datasets")            # doctest: +SKIP
        >>> train[0][0].shape                               # doctest: +SKIP
        torch.Size([3, 32, 32])
    """
    from torchvision import transforms

    _check_split(split)
    root = _cifar_root(path)
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    )
    return _local_cifar10_class()(
        str(root), train=split == "train", transform=transform, download=False
    )


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
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{name}={value!r} must be a whole number, 1 or more; for example "
                "synthetic(1024, image_size=224)"
            )
    return _Synthetic(n, image_size, channels, num_classes, seed)
