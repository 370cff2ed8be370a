"""The argument checks the API and the command lines share (workshop/checks.py):
one wording, "<name> must be <allowed>, not <value!r>; <what to do>"."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from workshop.checks import (
    LONGEST_WAIT_S,
    list_of,
    one_of,
    positive_number,
    whole,
    whole_list,
    writable_path,
)


@pytest.mark.parametrize("value", [True, 2.0, "2", None, [2], 0, 9])
def test_a_whole_number_refuses_bools_floats_strings_and_values_out_of_range(value):
    shown = re.escape(repr(value))
    with pytest.raises(
        ValueError,
        match=rf"^n must be a whole number from 1 to 8, not {shown}; e\.g\. n=2$",
    ):
        whole("n", value, 1, 8, fix="e.g. n=2")


def test_a_whole_number_takes_other_integers_and_gives_an_int():
    assert whole("n", np.int64(3)) == 3 and type(whole("n", np.int64(3))) is int
    assert whole("n", 0, 0) == 0
    assert whole_list("seeds", range(3), 0) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"^seeds must be one or more whole numbers, "
                       r"each 0 or more, not \(0, -1\)$"):  # fmt: skip
        whole_list("seeds", (0, -1), 0)


def test_one_of_keeps_flags_and_numbers_apart():
    assert one_of("stage", 1, (0, 1, 2)) == 1
    with pytest.raises(ValueError, match=r"^stage must be one of 0, 1 or 2, not True$"):
        one_of("stage", True, (0, 1, 2))


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "5", True, 1e15])
def test_a_positive_number_is_finite_and_at_most_its_largest(value):
    with pytest.raises(ValueError, match=r"^timeout must be a number of seconds "
                       rf"above 0 and at most {LONGEST_WAIT_S}, not "):  # fmt: skip
        positive_number("timeout", value, LONGEST_WAIT_S, "a number of seconds")
    assert positive_number("timeout", 2) == 2.0


def test_the_longest_wait_fits_the_milliseconds_of_a_c_int():
    assert LONGEST_WAIT_S * 1000 <= 2**31 - 1


def test_a_path_that_cannot_be_written_says_why(tmp_path):
    assert writable_path("path", tmp_path / "a.pt") == tmp_path / "a.pt"
    with pytest.raises(TypeError, match=r"^path must be a file name, not 5$"):
        writable_path("path", 5)
    with pytest.raises(ValueError, match=r"its folder .*/missing does not exist"):
        writable_path("path", tmp_path / "missing" / "a.pt")
    with pytest.raises(ValueError, match=r"it is a folder; name a file in it"):
        writable_path("path", tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"^out must be a folder that can be written"):
        writable_path("out", os.fspath(tmp_path / "f" / "sub"), folder=True)
    assert writable_path("out", tmp_path / "new" / "sub", folder=True).name == "sub"


def test_a_list_of_names_the_item_of_another_kind():
    assert list_of("rows", (1, 2), int, "counts") == [1, 2]
    with pytest.raises(TypeError, match=r"^rows must be a list of counts, not 5$"):
        list_of("rows", 5, int, "counts")
    with pytest.raises(TypeError, match=r"not a list holding 'x' \(a str\); e\.g\."):
        list_of("rows", [1, "x"], int, "counts", "e.g. [1, 2]")
    with pytest.raises(ValueError, match=r"not a list holding one without 'rank'"):
        list_of("figures", [{}], dict, "figures", keys=("rank",))
