"""workshop/ranks/streams.py: paths printed for a learner. They are shown from the
folder a learner stands in, so that they can be pasted into the next cell and mean
the same on every machine (and in the outputs stored with the notebooks)."""

from __future__ import annotations

import os

import pytest
from conftest import ROOT

from workshop.ranks import streams
from workshop.ranks.streams import display_path


@pytest.fixture
def home(tmp_path, monkeypatch):
    folder = tmp_path / "home" / "ada"
    folder.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(folder))
    return folder


def test_a_path_inside_the_current_folder_is_relative_to_it(tmp_path, home):
    here = tmp_path / "project"
    assert display_path(here / "runs" / "job-12.out", start=here) == "runs/job-12.out"
    assert display_path(here, start=here) == "."


def test_a_path_of_the_checkout_is_shown_from_a_folder_inside_it(tmp_path, home):
    checkout = tmp_path / "ws"
    notebooks = checkout / "notebooks"
    shown = display_path(
        checkout / ".venv" / "bin" / "python", start=notebooks, checkout=str(checkout)
    )
    assert shown == "../.venv/bin/python"
    assert display_path(checkout, start=notebooks, checkout=str(checkout)) == ".."
    # From outside the checkout, "../../ws/..." would say nothing: the path stays.
    outside = tmp_path / "elsewhere"
    assert display_path(
        checkout / "runs", start=outside, checkout=str(checkout)
    ) == str(checkout / "runs")


def test_the_home_folder_is_a_tilde(tmp_path, home):
    here = tmp_path / "project"  # beside the home folder, not above it
    assert display_path(home / ".local" / "bin" / "torchrun", start=here) == (
        "~/.local/bin/torchrun"
    )
    assert display_path(home, start=here) == "~"
    # A folder whose name only begins like the home folder's is not inside it.
    assert display_path(f"{home}son/x", start=here) == f"{home}son/x"


def test_system_and_relative_paths_are_left_as_they_are(tmp_path, home):
    assert display_path("/usr/bin/mpirun", start=tmp_path) == "/usr/bin/mpirun"
    assert display_path("runs/job-12.out", start=tmp_path) == "runs/job-12.out"


def test_the_current_folder_is_the_default_start(tmp_path, home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert display_path(tmp_path / "a" / "b.txt") == os.path.join("a", "b.txt")


def test_this_checkout_is_found_beside_the_package():
    # Run from a clone (as the tests are): its root holds pyproject.toml.
    checkout = streams._CHECKOUT
    assert checkout == str(ROOT)
    shown = display_path(ROOT / "runs" / "x.out", start=ROOT / "notebooks")
    assert shown == "../runs/x.out"
