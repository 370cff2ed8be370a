"""The slow tests of test_cifar.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: loader workers started by
spawn and forkserver."""

from __future__ import annotations

import subprocess
import sys

from conftest import clean_env
from test_cifar import _PER_BATCH, _write_cifar

_WORKERS = """
import sys
from torch.utils.data import DataLoader
from workshop.training.cifar import cifar10

train = cifar10(sys.argv[1], verify_md5=False)
for method in ("spawn", "forkserver"):
    loader = DataLoader(train, 5, num_workers=1, multiprocessing_context=method)
    print(method, [label for _, labels in loader for label in labels.tolist()])
"""


def test_cifar10_reaches_loader_workers_started_by_spawn_and_forkserver(tmp_path):
    # In a child process, so that the fork server it starts ends with it.
    _write_cifar(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _WORKERS, str(tmp_path)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    labels = [(i + j) % 10 for i in range(5) for j in range(_PER_BATCH)]
    assert done.stdout.splitlines() == [f"spawn {labels}", f"forkserver {labels}"]
