"""Datasets in one packed file, read with one open per process (notebook 05).

* :func:`pack_tar`: the PNG files of :func:`~workshop.training.files.write_image_files`
  in one uncompressed tar archive, read by :class:`TarImages` (one file opened per
  process, every image still decoded); the archive a batch job copies to a node's
  local disk and unpacks there (``slurm/stage_data.sbatch``);
* :func:`pack_images`: the decoded pixels in one ``.npy`` file of records, read by
  :class:`PackedImages` through memory mapping (one file, nothing to decode).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .files import Transform, _decode, _default_transform, _labelled_files

__all__ = ["PackedImages", "TarImages", "pack_images", "pack_tar"]


def pack_tar(folder: str | os.PathLike[str], archive: str | os.PathLike[str]) -> Path:
    """Pack a folder into one uncompressed tar archive, names relative to ``folder``.

    Uncompressed, so that copying and unpacking it costs disk speed, not CPU (PNG
    files are compressed already); ``tar -xf ARCHIVE`` unpacks it, as a batch job
    does on a node's local disk.

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
    """Images read from the PNG files inside one tar archive (:func:`pack_tar`).

    The archive is indexed once; then each process opens it once and reads every
    image at its offset: one file opened per process instead of one per image, but
    every image is still decoded.

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
    """Decode every image of a folder once and store them in one ``.npy`` file.

    One record per image, ``(label, pixels)``, in the order :class:`ImageFiles`
    lists them, so both give the same sample at the same index.

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
    memory mapping: one file opened per process, pages read as they are touched,
    nothing decoded.

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
