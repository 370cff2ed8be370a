"""The slow tests of test_gallery.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: the whole gallery
drawn."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workshop.gallery import example_collectives

PNG = b"\x89PNG\r\n\x1a\n"


EXPECTED = {
    "rank_layout_2x4.png",
    "point_to_point.png",
    "collective_broadcast.png",
    "collective_all_reduce.png",
    *(f"collective_{op}.png" for op in example_collectives()),
    *(f"ring_step_{k}.png" for k in range(1, 7)),
    "ring_grid.png",
    "rank_timeline.png",
    "ddp_bucket_timeline.png",
}


ROOT = Path(__file__).resolve().parents[1]


# Import the gallery as `python -m workshop.gallery` would, but with torch made
# unimportable and the package's __init__ (which starts lessons, so imports torch)
# left out: the diagrams and the gallery need neither.
_WITHOUT_TORCH = textwrap.dedent(
    """
    import sys, types
    sys.modules["torch"] = None
    package = types.ModuleType("workshop")
    package.__path__ = [{package!r}]
    sys.modules["workshop"] = package
    from workshop.gallery import main
    code = main(sys.argv[1:])
    assert not any(name.startswith("torch") for name, m in sys.modules.items() if m)
    sys.exit(code)
    """
)


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    """The gallery, written once by a process that cannot import torch."""
    out = tmp_path_factory.mktemp("gallery") / "new" / "folder"
    script = _WITHOUT_TORCH.format(package=str(ROOT / "workshop"))
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    return done, out


def test_the_gallery_writes_every_diagram_as_a_png_without_torch(gallery):
    done, out = gallery
    assert done.returncode == 0, done.stderr
    assert {p.name for p in out.iterdir()} == EXPECTED
    for path in out.iterdir():
        data = path.read_bytes()
        assert data.startswith(PNG), path.name
        assert len(data) > 10_000, path.name  # a picture, not an empty canvas
    # It prints each file it wrote, one a line.
    assert sorted(Path(line).name for line in done.stdout.split()) == sorted(EXPECTED)
