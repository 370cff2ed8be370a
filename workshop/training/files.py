"""Datasets on disk: many small image files, or one packed file (notebooks 01 and 05).

A parallel file system (Lustre, GPFS) serves big files fast and small files slowly:
every ``open`` is a round trip to its metadata server. The lessons measure this on the
same images stored three ways, all written here from scikit-learn's digits (no
download):

* :func:`write_image_files`: one PNG file per image, in ``<label>/<index>.png``
  folders (the layout of torchvision's ``ImageFolder``), read by :class:`ImageFiles`;
* :func:`~workshop.training.files_packed.pack_tar` and
  :func:`~workshop.training.files_packed.pack_images`: the same images in one file
  (:mod:`workshop.training.files_packed`).

:func:`count_opens` counts the files a block of code opens, in worker processes too,
and :func:`time_epochs` times passes over a loader.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = [
    "ImageFiles",
    "OpenCount",
    "count_opens",
    "time_epochs",
    "write_image_files",
]

Transform = Callable[[torch.Tensor], torch.Tensor]


def _default_transform(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels (C, H, W) to float32 in [0, 1]."""
    return pixels.to(torch.float32) / 255.0


def write_image_files(
    folder: str | os.PathLike[str],
    split: str = "train",
    size: int = 32,
    limit: int | None = None,
) -> Path:
    """Write scikit-learn's digits as one grey-scale PNG file per image.

    The layout is ``folder/<label>/<index>.png``, the one torchvision's
    ``ImageFolder`` reads: the label is the name of the folder. Images are the
    digits of :func:`workshop.digits` (same seeded split) upsampled to ``size``,
    before normalisation, stored as 8-bit pixels.

    Args:
        folder: where to write; created if missing, and must hold no files yet.
        split: "train" (1,437 images) or "test" (360).
        size: side of each image in pixels (8 keeps the original scans).
        limit: write only the first ``limit`` images (quick tests).

    Returns:
        The folder, as a ``Path``.

    Raises:
        ValueError: an unknown split, a size or limit below 1, or a folder that
            already holds files.

    Example:
        >>> folder = write_image_files("/tmp/digits-png", size=32)   # doctest: +SKIP
        >>> len(ImageFiles(folder))                                  # doctest: +SKIP
        1437
    """
    from PIL import Image

    from .data import _check_split, _digits_arrays

    _check_split(split)
    for name, value in (("size", size), ("limit", 1 if limit is None else limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a whole number, 1 or more")
    folder = Path(folder)
    if folder.is_dir() and any(folder.iterdir()):
        raise ValueError(
            f"{folder} already holds files; pass a new or empty folder (write_image_"
            "files never mixes its images with others)"
        )
    x_train, x_test, y_train, y_test = _digits_arrays(0)
    images, labels = (x_train, y_train) if split == "train" else (x_test, y_test)
    images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images).unsqueeze(1)
    if size != 8:
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear")
    pixels = (x.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    for label in sorted(set(labels.tolist())):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
    for index, (image, label) in enumerate(zip(pixels, labels.tolist(), strict=True)):
        Image.fromarray(image[0]).save(folder / str(label) / f"{index:05d}.png")
    return folder


def _labelled_files(folder: Path) -> list[tuple[Path, int]]:
    """``(path, label)`` of every ``<label>/<name>.png`` under ``folder``, sorted by
    the file's name, so that every format lists the images in the same order."""
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} is not a folder; write one with write_image_files(folder) or "
            "pass the folder that holds the <label>/<name>.png files"
        )
    found = []
    for path in folder.glob("*/*.png"):
        if not path.parent.name.isdigit():
            raise ValueError(
                f"{path} is not in a label folder: folder names must be whole "
                f"numbers (0, 1, ...), not {path.parent.name!r}"
            )
        found.append((path, int(path.parent.name)))
    if not found:
        shown = sorted(p.name for p in folder.iterdir())[:5]
        raise ValueError(
            f"{folder} holds no <label>/<name>.png files (it holds {shown or 'nothing'}"
            "); write them with write_image_files(folder)"
        )
    return sorted(found, key=lambda item: (item[0].name, item[1]))


def _decode(data: str | os.PathLike[str] | BinaryIO) -> torch.Tensor:
    """A PNG file or its bytes as uint8 pixels (1, H, W)."""
    from PIL import Image

    with Image.open(data) as image:
        pixels = np.array(image.convert("L"), dtype=np.uint8)
    return torch.from_numpy(pixels).unsqueeze(0)


class ImageFiles(Dataset):
    """Images read from one PNG file per sample: every item opens and decodes a file.

    Args:
        folder: a folder of ``<label>/<name>.png`` files (:func:`write_image_files`).
        transform: applied to the uint8 pixels (1, H, W) of each image, e.g. a
            random crop; default: float32 in [0, 1].

    Raises:
        FileNotFoundError: ``folder`` does not exist.
        ValueError: it holds no ``<label>/<name>.png`` files.

    Example:
        >>> data = ImageFiles("/tmp/digits-png")                    # doctest: +SKIP
        >>> image, label = data[0]                                  # doctest: +SKIP
    """

    def __init__(
        self, folder: str | os.PathLike[str], transform: Transform | None = None
    ) -> None:
        self.folder = Path(folder)
        self.samples = _labelled_files(self.folder)
        self.transform = transform or _default_transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.samples[index]
        return self.transform(_decode(path)), torch.tensor(label)

    def __repr__(self) -> str:
        return f"ImageFiles({len(self)} files in {self.folder.name}/)"


class OpenCount:
    """How many files :func:`count_opens` saw being opened (``count``), or None
    where it could not tell (worker processes not started by fork)."""

    def __init__(self, under: Path) -> None:
        self.under = under
        self.prefix = str(under) + os.sep
        self._shared = multiprocessing.get_context("fork").Value("q", 0)
        self.count: int | None = None

    def __repr__(self) -> str:
        return f"OpenCount(count={self.count}, under={self.under.name}/)"


_ACTIVE: list[OpenCount] = []
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    # Python raises an "open" audit event for every open() of a file, in C code
    # (PIL, numpy) too. Kept cheap: a hook cannot be removed, so it stays for good.
    if event != "open" or not _ACTIVE:
        return
    if isinstance(args[0], int):  # os.fdopen of a descriptor: no new file
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    for counter in _ACTIVE:
        if path.startswith(counter.prefix):
            with counter._shared.get_lock():
                counter._shared.value += 1


@contextmanager
def count_opens(under: str | os.PathLike[str]) -> Iterator[OpenCount]:
    """Count the files opened under a folder while the block runs.

    Counts this process and the ``DataLoader`` workers it forks during the block
    (the default on Linux): each worker inherits the counter, a number in shared
    memory. Workers started another way (spawn, forkserver) are not seen.

    Args:
        under: count only files whose path starts with this folder.

    Yields:
        An :class:`OpenCount`; its ``count`` is set when the block ends.

    Example:
        >>> with count_opens("/tmp/digits-png") as opened:         # doctest: +SKIP
        ...     ImageFiles("/tmp/digits-png")[0]
        >>> opened.count                                            # doctest: +SKIP
        1
    """
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    counter = OpenCount(Path(os.path.abspath(under)))
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)
        counter.count = counter._shared.value


def time_epochs(loader: Iterable, epochs: int = 1) -> list[float]:
    """Seconds for each full pass over ``loader``, doing nothing with the batches.

    Each pass includes starting the loader's worker processes, unless it keeps them
    (``persistent_workers=True``): compare the first pass with the next.

    Args:
        loader: a ``DataLoader`` (or any iterable of batches).
        epochs: how many passes to time.

    Returns:
        The seconds of each pass, in order.

    Raises:
        ValueError: ``epochs`` below 1, or a loader that yields no batch.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader(torch.arange(100.0), batch_size=10)
        >>> len(time_epochs(loader, epochs=2))
        2
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be a whole number, 1 or more")
    seconds = []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = sum(1 for _ in loader)
        seconds.append(time.perf_counter() - start)
        if batches == 0:
            raise ValueError("the loader yielded no batch: is its dataset empty?")
    return seconds
