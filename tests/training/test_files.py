"""workshop.training.files: digits written as PNG files, read back by ImageFiles; the
files opened, counted in this process and in DataLoader workers; epochs timed."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from workshop import digits
from workshop.training.files import (
    ImageFiles,
    count_opens,
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
    with pytest.raises(ValueError, match=r"size=0 must be a whole number, 1 or more"):
        write_image_files(tmp_path / "a", size=0)
    with pytest.raises(ValueError, match=r"limit=-1 must be a whole number"):
        write_image_files(tmp_path / "b", limit=-1)
    with pytest.raises(ValueError, match=r"split='val' is not known"):
        write_image_files(tmp_path / "c", split="val")


def test_time_epochs_refuses_no_epochs_and_empty_loaders():
    with pytest.raises(ValueError, match=r"epochs=0 must be a whole number"):
        time_epochs([[1]], epochs=0)
    with pytest.raises(ValueError, match=r"the loader yielded no batch"):
        time_epochs([])
