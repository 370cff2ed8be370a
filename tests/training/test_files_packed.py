"""workshop.training.files, packed: the same images packed in one tar archive and in
one .npy file give the same samples as the PNG files, with one open per process."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from workshop.training.files import (
    ImageFiles,
    PackedImages,
    TarImages,
    count_opens,
    pack_images,
    pack_tar,
    time_epochs,
    write_image_files,
)


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    folder = write_image_files(root / "png", size=12, limit=30)
    return (
        root,
        ImageFiles(folder),
        TarImages(pack_tar(folder, root / "digits.tar")),
        PackedImages(pack_images(folder, root / "digits.npy")),
    )


def test_every_format_gives_the_same_samples(formats):
    _, files, tar, packed = formats
    assert len(files) == len(tar) == len(packed) == 30
    for index in range(30):
        image, label = files[index]
        for other in (tar, packed):
            other_image, other_label = other[index]
            assert torch.equal(image, other_image) and label == other_label


def test_the_archive_holds_the_files_by_their_relative_names(formats):
    root = formats[0]
    with tarfile.open(root / "digits.tar") as tar:
        names = sorted(tar.getnames())
    assert names == sorted(p.relative_to(root / "png").as_posix()
                           for p in (root / "png").glob("*/*.png"))  # fmt: skip


def test_the_npy_file_is_one_array_of_records(formats):
    root = formats[0]
    records = np.load(root / "digits.npy", mmap_mode="r")
    assert records.shape == (30,) and records.dtype.names == ("label", "image")
    assert records["image"].shape == (30, 1, 12, 12)


def test_an_epoch_opens_one_file_not_one_per_image(formats):
    root, files, tar, packed = formats
    counts = []
    for data in (files, TarImages(tar.archive), PackedImages(packed.path)):
        loader = DataLoader(data, batch_size=8, shuffle=True)
        with count_opens(root) as opened:
            time_epochs(loader, epochs=2)  # the second pass reuses the open file
        counts.append(opened.count)
    assert counts == [60, 1, 1]


def test_each_worker_opens_the_archive_once(formats):
    root, _, tar, _ = formats
    loader = DataLoader(TarImages(tar.archive), batch_size=4, num_workers=2,
                        multiprocessing_context="fork")  # fmt: skip
    with count_opens(root) as opened:
        time_epochs(loader)
    assert opened.count == 2


def test_missing_and_wrong_files_are_refused(formats, tmp_path):
    root = formats[0]
    with pytest.raises(FileNotFoundError, match=r"x.tar does not exist; write it"):
        TarImages(tmp_path / "x.tar")
    with pytest.raises(FileNotFoundError, match=r"x.npy does not exist; write it"):
        PackedImages(tmp_path / "x.npy")
    with pytest.raises(ValueError, match=r"digits.npy is not a tar archive"):
        TarImages(root / "digits.npy")
    with pytest.raises(ValueError, match=r"digits.tar is not a .npy file"):
        PackedImages(root / "digits.tar")
    np.save(tmp_path / "plain.npy", np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"holds an array of float64 and shape "
                       r"\(3, 4\), not \(label, image\) records"):  # fmt: skip
        PackedImages(tmp_path / "plain.npy")
    with tarfile.open(tmp_path / "other.tar", "w") as archive:
        archive.add(root / "digits.npy", arcname="digits.npy")
    with pytest.raises(ValueError, match=r"holds no <label>/<name>.png members"):
        TarImages(tmp_path / "other.tar")
    with pytest.raises(FileNotFoundError, match=r"is not a folder: nothing to pack"):
        pack_tar(tmp_path / "none", tmp_path / "none.tar")


def test_images_of_two_sizes_do_not_pack_into_one_array(tmp_path):
    write_image_files(tmp_path / "a", size=8, limit=3)
    small = next((tmp_path / "a").glob("*/*.png"))
    write_image_files(tmp_path / "b", size=9, limit=1)
    big = next((tmp_path / "b").glob("*/*.png"))
    big.rename(small.parent / "zz.png")  # sorted last
    with pytest.raises(ValueError, match=r"zz.png is \(1, 9, 9\), not \(1, 8, 8\)"):
        pack_images(tmp_path / "a", tmp_path / "a.npy")
