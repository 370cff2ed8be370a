"""CIFAR-10 read from a folder already on disk, safely.

On a cluster the dataset usually sits in a shared folder that others can write. So
each file is checked against its published MD5 sum, and unpickled by a reader that
runs no code from the file: it rebuilds only what a genuine CIFAR-10 batch holds
(dicts, lists, strings, numbers and uint8 arrays), and names the file and what it
asked for otherwise. :func:`workshop.training.cifar.cifar10` is this module's
:func:`cifar10`.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..checks import one_of

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "cifar10"]

#: Per-channel mean and standard deviation of CIFAR-10's training images in [0, 1].
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

_CIFAR_FOLDER = "cifar-10-batches-py"


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


def _published_md5() -> dict[str, str]:
    """File name -> published MD5 sum, as torchvision's CIFAR10 lists them."""
    from torchvision.datasets import CIFAR10

    sums = {name: md5 for name, md5 in CIFAR10.train_list + CIFAR10.test_list}
    sums[CIFAR10.meta["filename"]] = CIFAR10.meta["md5"]
    return sums


def _redownload(root: Path) -> str:
    """The fix for a bad file: where to get the archive and where to unpack it."""
    from torchvision.datasets import CIFAR10

    return (
        f"download {CIFAR10.filename} again ({CIFAR10.url}) and unpack it in "
        f"{str(root)!r}"
    )


def _md5(raw: bytes) -> str:
    # usedforsecurity=False: FIPS-mode clusters refuse md5() without it. MD5 still
    # serves here: a file made to match a published sum would take a second
    # preimage, which no one knows how to find for MD5 (only collisions).
    return hashlib.md5(raw, usedforsecurity=False).hexdigest()


# MD5 sums computed in this process (forked ranks inherit them), so a notebook does
# not hash 170 MB twice. Keyed by the ctime too, which no user can set: a file
# replaced since has another. Not kept on disk: that would be one more file to trust.
_MD5_SEEN: dict[tuple[int, ...], str] = {}


def _read_checked(path: Path, published: str | None) -> bytes:
    """The bytes of ``path``, read once (so nothing can swap the file between the
    check and the read); their MD5 sum checked when ``published``."""
    with open(path, "rb") as f:
        raw = f.read()
        stat = os.fstat(f.fileno())
    if published is None:
        return raw
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    digest = _MD5_SEEN.get(key) if len(raw) == stat.st_size else None
    if digest is None:
        digest = _md5(raw)
    if digest != published:
        raise ValueError(
            f"{path.name} in {str(path.parent)!r}: its MD5 sum is {digest}, the "
            f"published one is {published}: the file is damaged or was replaced; "
            f"{_redownload(path.parent.parent)} (or, for a stand-in you made "
            "yourself, pass verify_md5=False)"
        )
    _MD5_SEEN[key] = digest
    return raw


class _Refused(pickle.UnpicklingError):
    """A batch file asked for something that no CIFAR-10 file holds."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


# numpy's array rebuilder, taken from an array: it lives in numpy.core.multiarray
# or numpy._core.multiarray depending on the numpy version, and importing the old
# name warns under numpy 2.
_RECONSTRUCT = np.ndarray((0,), np.uint8).__reduce__()[0]


class _NDArrayName:
    """``numpy.ndarray`` inside a batch: only _reconstruct's "a plain array" marker,
    never called (one way of making arrays to trust, not two)."""

    def __call__(self, *args: Any) -> None:
        raise _Refused("numpy.ndarray(...) called directly")


_NDARRAY = _NDArrayName()


def _array(subtype: object, shape: Any, typecode: Any) -> np.ndarray:
    if subtype is not _NDARRAY:
        raise _Refused(f"numpy's _reconstruct of {subtype!r}")
    return _RECONSTRUCT(np.ndarray, shape, typecode)


def _uint8_dtype(name: Any, *args: Any) -> np.dtype:
    # CIFAR-10's images are bytes; an array of objects would unpickle its items.
    if name not in ("u1", b"u1"):
        raise _Refused(f"numpy.dtype({name!r})")
    return np.dtype(name, *args)


# Every global a CIFAR-10 python batch names: those that rebuild a uint8 array.
_BATCH_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _array,
    ("numpy._core.multiarray", "_reconstruct"): _array,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _uint8_dtype,
}


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that runs no code from the file: besides dicts, lists, strings
    and numbers, it builds only uint8 numpy arrays (the documented way of
    restricting globals, in the pickle module's documentation)."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _BATCH_GLOBALS[module, name]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None


def _text(value: Any) -> Any:
    # The files are python-2 pickles: read with encoding="bytes", their strings
    # (keys, class names) are bytes.
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _load_cifar_file(path: Path, published: str | None) -> dict[str, Any]:
    """One file of ``cifar-10-batches-py`` as a dict with str keys, checked and read
    without running anything it holds."""
    raw = _read_checked(path, published)
    where = f"{path.name} in {str(path.parent)!r}"
    try:
        loaded = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _Refused as refused:
        raise pickle.UnpicklingError(
            f"{where} was not loaded: it asks for {refused.what}, which no CIFAR-10 "
            "file holds (only dicts, lists, strings, numbers and uint8 arrays), and "
            "nothing in it was run; someone may have planted it: tell whoever looks "
            f"after that folder, and {_redownload(path.parent.parent)}"
        ) from None
    except Exception as error:  # a damaged file can fail in any way: name the file
        raise ValueError(
            f"{where} is not a readable CIFAR-10 file ({type(error).__name__}: "
            f"{error}); {_redownload(path.parent.parent)}"
        ) from error
    if not isinstance(loaded, dict):
        raise ValueError(
            f"{where} holds a {type(loaded).__name__}, not the dict of a CIFAR-10 "
            f"file; {_redownload(path.parent.parent)}"
        )
    return {_text(key): value for key, value in loaded.items()}


def _cifar_batch(path: Path, published: str | None) -> tuple[np.ndarray, list[int]]:
    """The images (N, 3072) uint8 and labels of one batch file."""
    batch = _load_cifar_file(path, published)
    data, labels = batch.get("data"), batch.get("labels")
    where = f"{path.name} in {str(path.parent)!r}"
    is_array = isinstance(data, np.ndarray)
    if not (is_array and data.dtype == np.uint8 and data.shape[1:] == (3072,)):
        found = f"{data.dtype} {data.shape}" if is_array else type(data).__name__
        raise ValueError(
            f"{where}: 'data' is {found}, not the (N, 3072) uint8 images of a "
            f"CIFAR-10 batch; {_redownload(path.parent.parent)}"
        )
    targets = np.asarray(labels) if isinstance(labels, list) else np.zeros(0)
    if not (
        len(targets) == len(data)
        and targets.dtype.kind in "iu"
        and ((targets >= 0) & (targets < 10)).all()
    ):
        raise ValueError(
            f"{where}: 'labels' should be {len(data)} whole numbers 0..9, one per "
            f"image; {_redownload(path.parent.parent)}"
        )
    return data, targets.tolist()


def _cifar_classes(path: Path, published: str | None) -> list[str]:
    """The ten class names of ``batches.meta``."""
    names = _load_cifar_file(path, published).get("label_names")
    if not (isinstance(names, list) and len(names) == 10):
        raise ValueError(
            f"{path.name} in {str(path.parent)!r}: 'label_names' should be a list "
            f"of the 10 class names; {_redownload(path.parent.parent)}"
        )
    return [str(_text(name)) for name in names]


class _CIFAR10(Dataset):
    """CIFAR-10 as uint8 (N, 32, 32, 3), with torchvision's CIFAR10 attributes;
    made only by :func:`cifar10`."""

    def __init__(
        self,
        data: np.ndarray,
        targets: list[int],
        classes: list[str],
        transform: Any,
        root: Path,
        split: str,
    ) -> None:
        self.data, self.targets, self.classes = data, targets, classes
        self.class_to_idx = {name: i for i, name in enumerate(classes)}
        self.transform, self.root, self.split = transform, str(root), split
        self.train = split == "train"

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        # Through a PIL image, as torchvision's CIFAR10 does, so any of its
        # transforms (random crops, flips) can replace the one set by cifar10().
        return self.transform(Image.fromarray(self.data[index])), self.targets[index]

    def __repr__(self) -> str:
        return (
            f"cifar10({self.root!r}, split={self.split!r}): {len(self)} images of "
            f"{len(self.classes)} classes"
        )


def cifar10(
    path: str | Path, split: str = "train", *, verify_md5: bool = True
) -> Dataset:
    """CIFAR-10 from a directory already on disk, read safely (see the module);
    never downloads. Images are float32 (3, 32, 32), normalised with
    :data:`CIFAR10_MEAN` and :data:`CIFAR10_STD`; labels are ints 0..9.

    Args:
        path: the directory that contains ``cifar-10-batches-py`` (the python
            version, unpacked), or that folder itself.
        split: "train" (50,000 images) or "test" (10,000).
        verify_md5: False accepts files whose sums differ (a small stand-in); they
            are still read by the safe reader.

    Returns:
        A map-style dataset of (image, label), with torchvision's CIFAR10
        attributes ``data``, ``targets``, ``classes`` and ``class_to_idx``.

    Raises:
        FileNotFoundError: no ``cifar-10-batches-py`` at ``path``, or files of it
            missing.
        ValueError: an unknown split or ``verify_md5``; a file with another MD5
            sum, damaged or not in CIFAR-10's format (named, with how to refetch).
        pickle.UnpicklingError: a file that asks to run code; nothing of it ran.

    Example:
        >>> train = cifar10("/shared/datasets")            # doctest: +SKIP
        >>> train[0][0].shape                               # doctest: +SKIP
        torch.Size([3, 32, 32])
    """
    from torchvision import transforms

    one_of("split", split, ("train", "test"))
    if not isinstance(verify_md5, bool):
        raise ValueError(
            f"verify_md5={verify_md5!r} must be True (check the files against their "
            "published MD5 sums) or False (accept other sums, e.g. a stand-in)"
        )
    folder = _cifar_root(path) / _CIFAR_FOLDER
    published = _published_md5() if verify_md5 else {}
    classes = _cifar_classes(folder / "batches.meta", published.get("batches.meta"))
    names = (
        [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    )
    images, targets = [], []
    for name in names:
        data, labels = _cifar_batch(folder / name, published.get(name))
        images.append(data)
        targets += labels
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    )
    # (N, 3072) rows hold the red, green then blue planes: to (N, 32, 32, 3), the
    # layout PIL reads (a view, no copy).
    data = np.concatenate(images).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return _CIFAR10(data, targets, classes, transform, folder.parent, split)
