"""The slow tests of test_data.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the split computed and
read from the cache in fresh processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import repo_env

from workshop.training.data import (
    _ARRAYS,
    _split_digits,
    digits,
)


def test_digits_split_is_stratified():
    from sklearn.datasets import load_digits

    everything = np.bincount(load_digits().target, minlength=10)
    in_test = np.bincount(digits("test").tensors[1].numpy(), minlength=10)
    # Each digit's share of the test split is its share of the data, to one image.
    assert np.all(np.abs(in_test - everything * 0.2) <= 1), (in_test, everything)


def _fresh_python(cache: Path, code: str) -> str:
    """Run ``code`` after ``import workshop.training.data as data`` in a new Python
    whose cache folder is ``cache``; what it printed."""
    env = repo_env(XDG_CACHE_HOME=str(cache))
    done = subprocess.run(
        [sys.executable, "-c", "import workshop.training.data as data\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


SPLIT_AND_SAY = """
import sys
train = data.digits("train")
print(float(train.tensors[0].sum()), int(train.tensors[1].sum()), len(train))
print("sklearn" in sys.modules)
"""


def test_a_fresh_process_takes_the_split_from_the_cache_without_scikit_learn(
    tmp_path,
):
    first = _fresh_python(tmp_path, SPLIT_AND_SAY).splitlines()
    assert first[1] == "True"  # nothing kept yet: scikit-learn split the images
    (kept,) = (tmp_path / "scaling-pytorch-hpc").glob("digits-*.npz")
    again = _fresh_python(tmp_path, SPLIT_AND_SAY).splitlines()
    assert again == [first[0], "False"]  # the same split, and no scikit-learn
    with np.load(kept) as saved:
        computed = _split_digits(0)
        for name, array in zip(_ARRAYS, computed, strict=True):
            assert saved[name].dtype == array.dtype
            assert np.array_equal(saved[name], array), name


def test_a_cache_folder_that_cannot_be_written_only_costs_time(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    said = _fresh_python(blocked, SPLIT_AND_SAY).splitlines()
    assert said[1] == "True"
    train = digits("train")
    assert said[0] == (
        f"{float(train.tensors[0].sum())} {int(train.tensors[1].sum())} {len(train)}"
    )
