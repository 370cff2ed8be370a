"""workshop.training.cifar: CIFAR-10 from a local folder, its files checked against
their published MD5 sums and read by an unpickler that runs no code. The folders here
are small stand-ins written in the real format (Python 2 pickles)."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import workshop.training.cifar as cifar_module
from workshop.training.cifar import CIFAR10_MEAN, CIFAR10_STD, cifar10
from workshop.training.loaders import make_loader

# --- CIFAR-10 from a folder -----------------------------------------------------------

_PER_BATCH = 3
_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
_CLASSES = ["airplane", "automobile", "bird", "cat", "deer"]
_CLASSES += ["dog", "frog", "horse", "ship", "truck"]
_REBUILD_ARRAY = np.ndarray((0,), np.uint8).__reduce__()[0]


class _Python2Pickler(pickle._Pickler):
    """Pickles as CIFAR-10's files were written (Python 2, protocol 2): every string
    as a byte string, numpy's array rebuilder under the module name given. The pure
    Python pickler, because the C one's table of writers cannot be changed."""

    dispatch = pickle._Pickler.dispatch.copy()

    def __init__(self, file, numpy_module: str) -> None:
        super().__init__(file, protocol=2)
        self.numpy_module = numpy_module

    def save_byte_string(self, obj: bytes | str) -> None:
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_byte_string
    dispatch[str] = save_byte_string

    def save_global(self, obj, name=None) -> None:
        if obj is _REBUILD_ARRAY:
            self.write(pickle.GLOBAL + f"{self.numpy_module}\n_reconstruct\n".encode())
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def _python2_pickle(obj, numpy_module: str = "numpy.core.multiarray") -> bytes:
    out = io.BytesIO()
    _Python2Pickler(out, numpy_module).dump(obj)
    return out.getvalue()


def _batch(i: int, name: str) -> dict:
    """Batch file i: image j filled with 10 * i + j, its label (i + j) % 10."""
    values = [10 * i + j for j in range(_PER_BATCH)]
    return {
        "batch_label": f"fake {name}",
        "labels": [(i + j) % 10 for j in range(_PER_BATCH)],
        "data": np.repeat(np.array(values, dtype=np.uint8)[:, None], 3072, axis=1),
        "filenames": [f"{name}_{j}.png" for j in range(_PER_BATCH)],
    }


def _write_cifar(
    root: Path, skip: tuple[str, ...] = (), numpy_module: str = "numpy.core.multiarray"
) -> Path:
    """A stand-in CIFAR-10 in the real format (python-2 pickles of dicts of uint8
    rows), with _PER_BATCH images per batch file (see _batch)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate(_NAMES):
        if name not in skip:
            (folder / name).write_bytes(_python2_pickle(_batch(i, name), numpy_module))
    if "batches.meta" not in skip:
        meta = {"label_names": _CLASSES, "num_cases_per_batch": 3, "num_vis": 3072}
        (folder / "batches.meta").write_bytes(_python2_pickle(meta))
    return folder


def _re(path: Path) -> str:
    """``path`` as it appears in a message, as a regular expression."""
    return re.escape(str(path))


def _sums_of(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.parametrize(
    "numpy_module", ["numpy.core.multiarray", "numpy._core.multiarray"]
)
def test_cifar10_reads_the_python_version_from_a_local_folder(tmp_path, numpy_module):
    # The real files name numpy.core.multiarray; numpy 2 writes numpy._core.
    _write_cifar(tmp_path, numpy_module=numpy_module)
    train = cifar10(tmp_path, verify_md5=False)
    test = cifar10(str(tmp_path), split="test", verify_md5=False)
    assert (len(train), len(test)) == (5 * _PER_BATCH, _PER_BATCH)
    assert train.classes[3] == "cat"
    assert train.class_to_idx["truck"] == 9
    assert train.targets[:4] == [0, 1, 2, 1]
    assert train.data.shape == (15, 32, 32, 3)
    assert train.data.dtype == np.uint8

    image, label = train[_PER_BATCH + 1]  # file 1 (data_batch_2), image 1
    assert image.shape == (3, 32, 32)
    assert image.dtype == torch.float32
    assert label == 2
    expected = [
        (11 / 255 - m) / s for m, s in zip(CIFAR10_MEAN, CIFAR10_STD, strict=True)
    ]
    assert image[:, 0, 0].tolist() == pytest.approx(expected, abs=1e-6)
    assert image.std(dim=(1, 2)).max().item() < 1e-6  # one value per channel

    test_image, test_label = test[2]  # test_batch is file 5
    assert test_label == (5 + 2) % 10
    assert test_image[0, 0, 0].item() == pytest.approx((52 / 255 - 0.4914) / 0.2470)
    assert repr(test) == (
        f"cifar10({str(tmp_path)!r}, split='test'): 3 images of 10 classes"
    )


def test_cifar10_keeps_the_red_green_blue_planes_apart(tmp_path):
    folder = _write_cifar(tmp_path)
    batch = _batch(5, "test_batch")
    # Each row holds 1024 red values, then 1024 green, then 1024 blue.
    batch["data"] = np.repeat(np.array([10, 20, 30], np.uint8), 1024)[None].repeat(
        _PER_BATCH, axis=0
    )
    (folder / "test_batch").write_bytes(_python2_pickle(batch))
    test = cifar10(tmp_path, split="test", verify_md5=False)
    assert test.data[0, 5, 7].tolist() == [10, 20, 30]
    image = test[0][0] * torch.tensor(CIFAR10_STD)[:, None, None]
    image += torch.tensor(CIFAR10_MEAN)[:, None, None]
    assert (image[:, 5, 7] * 255).tolist() == pytest.approx([10, 20, 30], abs=1e-3)


def test_cifar10_accepts_the_batches_folder_itself(tmp_path):
    folder = _write_cifar(tmp_path)
    assert len(cifar10(folder, split="test", verify_md5=False)) == _PER_BATCH


def test_cifar10_goes_through_a_loader_and_survives_pickling(tmp_path):
    _write_cifar(tmp_path)
    train = cifar10(tmp_path, verify_md5=False)
    images, labels = next(iter(make_loader(train, 4, shuffle=False)))
    assert images.shape == (4, 3, 32, 32)
    assert labels.tolist() == [0, 1, 2, 1]
    # What a spawned loader worker, or a rank, does with the dataset.
    copy = pickle.loads(pickle.dumps(train))
    assert torch.equal(copy[7][0], train[7][0])


def test_cifar10_in_a_folder_without_it_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=(
            rf"no CIFAR-10 found in '{tmp_path}': expected the folder "
            r"'cifar-10-batches-py' \(the python version from the CIFAR-10 site\) "
            r"inside it, but it is not there; pass the directory that contains it"
        ),
    ):
        cifar10(tmp_path)


def test_cifar10_at_a_missing_path_says_it_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"but that path does not exist"):
        cifar10(tmp_path / "nowhere")


def test_cifar10_next_to_its_archive_says_to_unpack_it(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"not yet unpacked; run `tar -xzf "):
        cifar10(tmp_path)


def test_cifar10_with_files_missing_lists_them(tmp_path):
    _write_cifar(tmp_path, skip=("data_batch_3", "batches.meta"))
    with pytest.raises(
        FileNotFoundError,
        match=r"is incomplete: data_batch_3, batches.meta missing",
    ):
        cifar10(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"split": "validation"},
            r"split must be one of 'train' or 'test', not 'validation'",
        ),
        (
            {"verify_md5": "no"},
            r"verify_md5='no' must be True \(check the files against their published "
            r"MD5 sums\) or False",
        ),
    ],
)
def test_cifar10_rejects_bad_arguments(tmp_path, kwargs, message):
    _write_cifar(tmp_path)
    with pytest.raises(ValueError, match=message):
        cifar10(tmp_path, **kwargs)


# --- CIFAR-10: MD5 sums -------------------------------------------------------------


def test_the_published_md5_sums_are_torchvisions_for_every_file():
    from torchvision.datasets import CIFAR10

    sums = cifar_module._published_md5()
    assert sorted(sums) == sorted([*_NAMES, "batches.meta"])
    assert sums["data_batch_1"] == CIFAR10.train_list[0][1]
    assert sums["test_batch"] == CIFAR10.test_list[0][1]
    assert sums["batches.meta"] == CIFAR10.meta["md5"]
    assert all(len(s) == 32 and int(s, 16) >= 0 for s in sums.values())


def test_cifar10_checks_the_md5_sums_by_default_and_says_how_to_get_out(tmp_path):
    folder = _write_cifar(tmp_path)
    mine = hashlib.md5((folder / "batches.meta").read_bytes()).hexdigest()
    published = cifar_module._published_md5()["batches.meta"]
    with pytest.raises(
        ValueError,
        match=(
            rf"batches.meta in '{_re(folder)}': its MD5 sum is {mine}, the "
            rf"published one is {published}: the file is damaged or was replaced; "
            r"download cifar-10-python.tar.gz again \(https://\S+\) and unpack it "
            rf"in '{_re(tmp_path)}' \(or, for a stand-in you made yourself, pass "
            r"verify_md5=False\)$"
        ),
    ):
        cifar10(tmp_path, split="test")


def test_cifar10_names_the_one_file_whose_sum_differs(tmp_path, monkeypatch):
    folder = _write_cifar(tmp_path)
    published = _sums_of(folder)
    monkeypatch.setattr(cifar_module, "_published_md5", lambda: published)
    assert len(cifar10(tmp_path)) == 5 * _PER_BATCH  # all sums match: it loads

    damaged = bytearray((folder / "data_batch_3").read_bytes())
    damaged[-100] ^= 1  # one bit of one pixel
    (folder / "data_batch_3").write_bytes(bytes(damaged))
    with pytest.raises(
        ValueError,
        match=(
            rf"data_batch_3 in '{_re(folder)}': its MD5 sum is "
            rf"{hashlib.md5(damaged).hexdigest()}, the published one is "
            rf"{published['data_batch_3']}: the file is damaged or was replaced"
        ),
    ):
        cifar10(tmp_path)


def test_cifar10_hashes_a_file_once_until_it_is_replaced(tmp_path, monkeypatch):
    folder = _write_cifar(tmp_path)
    published = _sums_of(folder)
    monkeypatch.setattr(cifar_module, "_published_md5", lambda: published)
    monkeypatch.setattr(cifar_module, "_MD5_SEEN", {})
    hashed = []
    md5 = cifar_module._md5
    monkeypatch.setattr(
        cifar_module, "_md5", lambda raw: hashed.append(raw) or md5(raw)
    )

    cifar10(tmp_path, split="test")
    assert len(hashed) == 2  # batches.meta and test_batch
    cifar10(tmp_path, split="test")
    assert len(hashed) == 2  # nothing hashed again

    # Replaced by a file of the same size and the same modification time: the new
    # file has another inode and ctime, so it is hashed again, and refused.
    path = folder / "test_batch"
    stat = path.stat()
    original = path.read_bytes()
    swapped = original.replace(bytes([52]) * 3072, bytes([99]) * 3072)
    assert swapped != original
    (folder / "swap").write_bytes(swapped)
    os.utime(folder / "swap", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(folder / "swap", path)
    assert path.stat().st_size == stat.st_size
    with pytest.raises(ValueError, match=r"test_batch in .*: its MD5 sum is"):
        cifar10(tmp_path, split="test")
    assert len(hashed) == 3


# --- CIFAR-10: files that are not what they should be ---------------------------------


class _Planted:
    """Unpickled, this calls ``function(*args)``: what a planted file does."""

    def __init__(self, function, *args) -> None:
        self.reduced = (function, args)

    def __reduce__(self):
        return self.reduced


def _payloads(marker: Path) -> dict[str, _Planted]:
    return {
        "os.system": _Planted(os.system, f"touch '{marker}'"),
        "open": _Planted(open, str(marker), "w"),
    }


@pytest.mark.parametrize("payload", ["os.system", "open"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_a_planted_batch_is_refused_and_its_code_never_runs(
    tmp_path, monkeypatch, payload, protocol
):
    # The payload works: plain pickle runs it.
    proof = tmp_path / "plain pickle ran it"
    pickle.loads(pickle.dumps(_payloads(proof)[payload], protocol=protocol))
    assert proof.exists()

    folder = _write_cifar(tmp_path / "shared")
    marker = tmp_path / "planted code ran"
    planted = {"labels": [0, 1, 2], "data": _payloads(marker)[payload]}
    (folder / "data_batch_2").write_bytes(pickle.dumps(planted, protocol=protocol))
    # How pickle names the callable depends on the Python: io.open up to 3.11,
    # _io.open from 3.12 (where io.open is the C function itself).
    forbidden = {
        "os.system": r"(posix|nt|os)\.system",
        "open": r"(_?io|builtins)\.open",
    }
    with pytest.raises(
        pickle.UnpicklingError,
        match=(
            rf"data_batch_2 in '{_re(folder)}' was not loaded: it asks for "
            rf"{forbidden[payload]}, which no CIFAR-10 file holds \(only dicts, "
            r"lists, strings, numbers and uint8 arrays\), and nothing in it was run; "
            r"someone may have planted it: tell whoever looks after that folder, and "
            r"download cifar-10-python.tar.gz again"
        ),
    ):
        cifar10(folder, verify_md5=False)
    assert not marker.exists()

    # With the sums checked (the default), its sum is wrong before it is read.
    published = {**_sums_of(folder), "data_batch_2": "0" * 32}
    monkeypatch.setattr(cifar_module, "_published_md5", lambda: published)
    with pytest.raises(ValueError, match=r"data_batch_2 in .*: its MD5 sum is"):
        cifar10(folder)
    assert not marker.exists()


def test_a_planted_meta_file_is_refused_too(tmp_path):
    folder = _write_cifar(tmp_path)
    marker = tmp_path / "planted code ran"
    planted = {"label_names": _payloads(marker)["os.system"]}
    (folder / "batches.meta").write_bytes(_python2_pickle(planted))
    with pytest.raises(
        pickle.UnpicklingError,
        match=r"batches.meta in .* was not loaded: it asks for (posix|nt|os)\.system",
    ):
        cifar10(tmp_path, split="test", verify_md5=False)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("written", "refused"),
    [
        # An array of anything but bytes: an array of objects unpickles its items.
        (
            lambda b: _python2_pickle({**b, "data": b["data"].astype(np.float32)}),
            r"numpy\.dtype\(b'f4'\)",
        ),
        (
            lambda b: _python2_pickle({**b, "data": b["data"].astype(object)}),
            r"numpy\.dtype\(b'O8?'\)",
        ),
        # numpy.ndarray is only an argument of numpy's _reconstruct, never called.
        (
            lambda b: pickle.dumps(_Planted(np.ndarray, (3,), "O"), protocol=2),
            r"numpy\.ndarray\(\.\.\.\) called directly",
        ),
        # Pickled again with protocol 5: not what CIFAR-10 ships.
        (lambda b: pickle.dumps(b, protocol=5), r"numpy\._core\.numeric\._frombuffer"),
    ],
    ids=["float32", "objects", "ndarray-called", "python-3-pickle"],
)
def test_a_batch_not_as_cifar10_wrote_it_is_refused(tmp_path, written, refused):
    folder = _write_cifar(tmp_path)
    (folder / "test_batch").write_bytes(written(_batch(5, "test_batch")))
    with pytest.raises(
        pickle.UnpicklingError,
        match=rf"test_batch in '{_re(folder)}' was not loaded: it asks for {refused}",
    ):
        cifar10(tmp_path, split="test", verify_md5=False)


def _truncated(batch: dict) -> bytes:
    whole = _python2_pickle(batch)
    return whole[: len(whole) // 2]


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (
            _truncated,
            r" is not a readable CIFAR-10 file \(UnpicklingError: pickle data was "
            r"truncated\); download cifar-10-python.tar.gz again",
        ),
        (
            lambda b: _python2_pickle([b]),
            r" holds a list, not the dict of a CIFAR-10 file; download",
        ),
        (
            lambda b: _python2_pickle({**b, "data": b["data"][:, :1024]}),
            r": 'data' is uint8 \(3, 1024\), not the \(N, 3072\) uint8 images of a "
            r"CIFAR-10 batch; download",
        ),
        (
            lambda b: _python2_pickle({"labels": b["labels"]}),
            r": 'data' is NoneType, not the \(N, 3072\) uint8 images",
        ),
        (
            lambda b: _python2_pickle({**b, "labels": [0, 1, 10]}),
            r": 'labels' should be 3 whole numbers 0..9, one per image; download",
        ),
        (
            lambda b: _python2_pickle({**b, "labels": [0, 1]}),
            r": 'labels' should be 3 whole numbers 0..9",
        ),
    ],
    ids=["truncated", "not-a-dict", "short-rows", "no-data", "label-10", "2-labels"],
)
def test_a_damaged_batch_is_named_with_what_is_wrong(tmp_path, written, message):
    folder = _write_cifar(tmp_path)
    (folder / "test_batch").write_bytes(written(_batch(5, "test_batch")))
    with pytest.raises(ValueError, match=rf"^test_batch in '{_re(folder)}'{message}"):
        cifar10(tmp_path, split="test", verify_md5=False)


def test_a_meta_file_without_ten_class_names_is_named(tmp_path):
    folder = _write_cifar(tmp_path)
    (folder / "batches.meta").write_bytes(_python2_pickle({"label_names": ["cat"]}))
    with pytest.raises(
        ValueError,
        match=(
            rf"batches.meta in '{_re(folder)}': 'label_names' should be a list of "
            r"the 10 class names; download cifar-10-python.tar.gz again"
        ),
    ):
        cifar10(tmp_path, split="test", verify_md5=False)
