"""workshop.training.files: digits written as PNG files, read back by ImageFiles; the
files opened, counted in this process and in DataLoader workers; epochs timed.
Packed: the same images in one tar archive and in one .npy file give the same
samples as the PNG files, with one open per process."""

from __future__ import annotations

import multiprocessing
import tarfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from workshop import digits
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
def folder(tmp_path_factory):
    return write_image_files(tmp_path_factory.mktemp("files") / "png", size=16,
                             limit=40)  # fmt: skip


def test_one_png_file_per_image_in_label_folders(folder):
    files = sorted(folder.glob("*/*.png"))
    assert len(files) == 40
    labels = digits("train", size=8).tensors[1][:40]
    assert sorted(int(f.parent.name) for f in files) == sorted(labels.tolist())
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def test_the_files_hold_the_digits_and_their_labels(folder):
    data = ImageFiles(folder)
    assert len(data) == 40
    image, label = data[0]
    assert image.shape == (1, 16, 16) and image.dtype == torch.float32
    assert image.min() >= 0.0 and image.max() <= 1.0 and image.max() > 0.5
    # Sample i is the image written as file i: the same label as digits() gives it,
    # and the same picture (correlated with it, up to 8-bit rounding and scaling).
    reference = digits("train", size=16)
    for index in (0, 7, 39):
        image, label = data[index]
        assert label == reference[index][1]
        picture = reference[index][0].flatten()
        assert np.corrcoef(image.flatten(), picture)[0, 1] > 0.99


def test_the_transform_gets_the_uint8_pixels(folder):
    data = ImageFiles(folder, transform=lambda pixels: pixels[:, :8, :8])
    image, _ = data[3]
    assert image.dtype == torch.uint8 and image.shape == (1, 8, 8)


def test_reading_an_epoch_opens_each_file_once(folder):
    loader = DataLoader(ImageFiles(folder), batch_size=8, shuffle=True)
    with count_opens(folder) as opened:
        seconds = time_epochs(loader, epochs=2)
    assert opened.count == 2 * 40
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    with count_opens(folder / "0") as only_zeros:
        time_epochs(loader)
    assert only_zeros.count == len(list((folder / "0").glob("*.png")))


@pytest.mark.skipif(
    multiprocessing.get_start_method(allow_none=True) not in (None, "fork"),
    reason="DataLoader workers are not forked here",
)
def test_opens_in_forked_workers_are_counted(folder):
    loader = DataLoader(ImageFiles(folder), batch_size=8, num_workers=2,
                        multiprocessing_context="fork")  # fmt: skip
    with count_opens(folder) as opened:
        time_epochs(loader)
    assert opened.count == 40


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope is not a folder; write one"):
        ImageFiles(tmp_path / "nope")


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"holds no <label>/<name>.png files "
                       r"\(it holds \['notes.txt'\]\)"):  # fmt: skip
        ImageFiles(tmp_path)
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "a.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"folder names must be whole numbers .*"
                       r"not 'cats'"):  # fmt: skip
        ImageFiles(tmp_path)


def test_writing_refuses_a_folder_with_files_and_bad_sizes(folder, tmp_path):
    with pytest.raises(ValueError, match=r"already holds files; pass a new or empty"):
        write_image_files(folder)
    with pytest.raises(
        ValueError, match=r"size must be a whole number, 1 or more, not 0"
    ):
        write_image_files(tmp_path / "a", size=0)
    with pytest.raises(
        ValueError, match=r"limit must be a whole number, 1 or more, not -1"
    ):
        write_image_files(tmp_path / "b", limit=-1)
    with pytest.raises(
        ValueError, match=r"split must be one of 'train' or 'test', not 'val'"
    ):
        write_image_files(tmp_path / "c", split="val")


def test_time_epochs_refuses_no_epochs_and_empty_loaders():
    with pytest.raises(
        ValueError, match=r"epochs must be a whole number, 1 or more, not 0"
    ):
        time_epochs([[1]], epochs=0)
    with pytest.raises(ValueError, match=r"the loader yielded no batch"):
        time_epochs([])


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
