"""Datasets on disk: many small image files, or one packed file (notebooks 01 and 05).

A parallel file system (Lustre, GPFS) serves big files fast and small files slowly:
every ``open`` is a round trip to its metadata server. The lessons measure this on
scikit-learn's digits stored three ways: a PNG file per image
(:func:`write_image_files`, :class:`ImageFiles`), one tar of them (:func:`pack_tar`,
:class:`TarImages`) and one ``.npy`` of decoded pixels (:func:`pack_images`,
:class:`PackedImages`); :func:`count_opens` counts the files opened and
:func:`time_epochs` times passes over a loader.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch.utils.data import Dataset

from ..checks import one_of, whole

__all__ = [
    "ImageFiles",
    "OpenCount",
    "PackedImages",
    "TarImages",
    "count_opens",
    "pack_images",
    "pack_tar",
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
    """Write the digits of :func:`workshop.digits` (the same split, before
    normalisation) as one 8-bit PNG file per image, ``folder/<label>/<index>.png``
    (torchvision's ``ImageFolder`` layout).

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

    from .data import _digits_arrays

    one_of("split", split, ("train", "test"))
    whole("size", size)
    if limit is not None:
        whole("limit", limit)
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
    """``(path, label)`` of every ``<label>/<name>.png``, in the order every format
    lists the images."""
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
    """Count the files opened under a folder while the block runs, here and in the
    ``DataLoader`` workers forked meanwhile (not those spawned another way).

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
    """Seconds for each full pass over ``loader``, doing nothing with the batches
    (each pass starts the workers, unless ``persistent_workers=True``).

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
    whole("epochs", epochs)
    seconds = []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = sum(1 for _ in loader)
        seconds.append(time.perf_counter() - start)
        if batches == 0:
            raise ValueError("the loader yielded no batch: is its dataset empty?")
    return seconds


def pack_tar(folder: str | os.PathLike[str], archive: str | os.PathLike[str]) -> Path:
    """Pack a folder into one uncompressed tar archive (PNGs are compressed already,
    so unpacking costs disk speed, not CPU), names relative to ``folder``.

    Args:
        folder: the folder to pack (its files, not the folder itself).
        archive: the ``.tar`` file to write.

    Returns:
        The archive, as a ``Path``.

    Raises:
        FileNotFoundError: ``folder`` is not a folder.

    Example:
        >>> pack_tar("/tmp/digits-png", "/tmp/digits.tar")          # doctest: +SKIP
        PosixPath('/tmp/digits.tar')
    """
    folder, archive = Path(folder), Path(archive)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: nothing to pack")
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(folder).as_posix())
    return archive


class TarImages(Dataset):
    """Images read from the PNG files inside one tar archive (:func:`pack_tar`):
    one file opened per process instead of one per image, each image still decoded.

    Args:
        archive: a tar of ``<label>/<name>.png`` members.
        transform: as for :class:`ImageFiles`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a tar archive, or one without ``<label>/<name>.png`` members.

    Example:
        >>> data = TarImages("/tmp/digits.tar")                      # doctest: +SKIP
    """

    def __init__(
        self, archive: str | os.PathLike[str], transform: Transform | None = None
    ) -> None:
        self.archive = Path(archive)
        if not self.archive.is_file():
            raise FileNotFoundError(f"{self.archive} does not exist; write it with "
                                    "pack_tar(folder, archive)")  # fmt: skip
        if not tarfile.is_tarfile(self.archive):
            raise ValueError(f"{self.archive} is not a tar archive; write one with "
                             "pack_tar(folder, archive)")  # fmt: skip
        members = []
        with tarfile.open(self.archive) as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if (member.isfile() and len(parts) == 2 and parts[0].isdigit()
                        and parts[1].endswith(".png")):  # fmt: skip
                    members.append((parts[1], int(parts[0]), member))
        if not members:
            raise ValueError(f"{self.archive} holds no <label>/<name>.png members; "
                             "pack a folder of write_image_files")  # fmt: skip
        members.sort(key=lambda item: (item[0], item[1]))
        self.samples = [(m.offset_data, m.size, label) for _, label, m in members]
        self.transform = transform or _default_transform
        self._file = None
        self._pid = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        offset, size, label = self.samples[index]
        if self._pid != os.getpid():  # a worker process opens its own handle
            self._file = open(self.archive, "rb")  # noqa: SIM115 (kept open)
            self._pid = os.getpid()
        self._file.seek(offset)
        pixels = _decode(io.BytesIO(self._file.read(size)))
        return self.transform(pixels), torch.tensor(label)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None, "_pid": None}

    def __repr__(self) -> str:
        return f"TarImages({len(self)} images in {self.archive.name})"


def _record_dtype(shape: tuple[int, ...]) -> np.dtype:
    return np.dtype([("label", np.int64), ("image", np.uint8, shape)])


def pack_images(folder: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Decode every image of a folder once into one ``.npy`` file of ``(label,
    pixels)`` records, in :class:`ImageFiles`'s order.

    Args:
        folder: a folder of ``<label>/<name>.png`` files, all of one size.
        path: the ``.npy`` file to write.

    Returns:
        The file, as a ``Path``.

    Raises:
        FileNotFoundError, ValueError: as :class:`ImageFiles`; images of
            different sizes.

    Example:
        >>> pack_images("/tmp/digits-png", "/tmp/digits.npy")       # doctest: +SKIP
        PosixPath('/tmp/digits.npy')
    """
    samples = _labelled_files(Path(folder))
    first = _decode(samples[0][0])
    records = np.zeros(len(samples), dtype=_record_dtype(tuple(first.shape)))
    for index, (file, label) in enumerate(samples):
        pixels = _decode(file)
        if pixels.shape != first.shape:
            raise ValueError(
                f"{file} is {tuple(pixels.shape)}, not {tuple(first.shape)} like "
                f"{samples[0][0].name}: one .npy file holds images of one size"
            )
        records[index] = (label, pixels.numpy())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, records)
    return path


class PackedImages(Dataset):
    """Images read from one ``.npy`` file of records (:func:`pack_images`) through
    memory mapping: one file opened per process, nothing decoded.

    Args:
        path: the ``.npy`` file.
        transform: as for :class:`ImageFiles`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a ``.npy`` file, or not one of ``(label, image)`` records.

    Example:
        >>> data = PackedImages("/tmp/digits.npy")                   # doctest: +SKIP
    """

    def __init__(
        self, path: str | os.PathLike[str], transform: Transform | None = None
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} does not exist; write it with "
                                    "pack_images(folder, path)")  # fmt: skip
        with open(self.path, "rb") as file:
            try:
                version = np.lib.format.read_magic(file)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)  # fmt: skip
                shape, _, dtype = read(file)
            except ValueError as exc:
                raise ValueError(
                    f"{self.path} is not a .npy file ({exc}); write one with "
                    "pack_images(folder, path)"
                ) from None
            self._offset = file.tell()
        if dtype.names != ("label", "image") or len(shape) != 1:
            raise ValueError(
                f"{self.path} holds an array of {dtype} and shape {shape}, not "
                "(label, image) records; write it with pack_images(folder, path)"
            )
        self._dtype, self._len = dtype, shape[0]
        self.transform = transform or _default_transform
        self._records = None
        self._pid = None

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pid != os.getpid():  # one map per process
            self._records = np.memmap(
                self.path, self._dtype, "r", self._offset, (self._len,)
            )
            self._pid = os.getpid()
        record = self._records[index]
        pixels = torch.from_numpy(np.array(record["image"]))  # a copy, writable
        return self.transform(pixels), torch.tensor(int(record["label"]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_records": None, "_pid": None}

    def __repr__(self) -> str:
        return f"PackedImages({len(self)} records in {self.path.name})"
