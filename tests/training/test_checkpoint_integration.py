"""The slow tests of test_checkpoint.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: writers killed mid-write,
and a resumed DDP run."""

from __future__ import annotations

import os
import random
import signal
import time

import torch
from torch import nn

from workshop import launch
from workshop.training.checkpoint import load_checkpoint, save_checkpoint

_BIG = 3_000_000  # 12 MB of float32: a write takes long enough to be interrupted


def _model(version: float) -> nn.Module:
    model = nn.Linear(1, _BIG, bias=False)
    with torch.no_grad():
        model.weight.fill_(version)
    return model


def _writer(path: str, atomic: bool) -> None:
    """In a forked child: write checkpoints of versions 1, 2, 3, ... forever."""
    version = 0
    model = _model(0)
    while True:
        version += 1
        with torch.no_grad():
            model.weight.fill_(version)
        if atomic:
            save_checkpoint(path, model, version=version)
        else:  # the naive way, for contrast: straight into the final file
            torch.save(
                {
                    "format": 1,
                    "model": model.state_dict(),
                    "optimizer": None,
                    "extra": {"version": version},
                },
                path,
            )


def _kill_writers(path, atomic: bool, kills: int) -> tuple[int, int, set[int]]:
    """Start a writer, kill it at a random moment, read what is left; ``kills`` times.

    Returns (whole checkpoints found, unreadable ones, versions seen)."""
    rng = random.Random(0)
    whole = broken = 0
    versions: set[int] = set()
    for _ in range(kills):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                torch.set_num_threads(1)
                _writer(str(path), atomic)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if not path.exists():
            continue  # killed before its first write finished: nothing to read
        model = _model(-1)
        try:
            extra = load_checkpoint(path, model)
        except ValueError:
            broken += 1
            continue
        whole += 1
        # The weights and the extra values come from the same save.
        assert torch.all(model.weight == extra["version"]), extra
        versions.add(extra["version"])
    return whole, broken, versions


def test_a_writer_killed_mid_write_never_leaves_a_corrupt_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    whole, broken, versions = _kill_writers(path, atomic=True, kills=30)
    assert broken == 0
    assert whole >= 25  # the kills came after at least one complete save
    assert len(versions) > 1  # and at different points of the writing
    # The dead writers' temporary files are cleaned up by the next save.
    save_checkpoint(path, _model(7), version=7)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert load_checkpoint(path, _model(0)) == {"version": 7}


def test_the_same_kills_do_corrupt_a_naive_torch_save(tmp_path):
    # Shows that the test above can fail: the kills do land mid-write.
    path = tmp_path / "ckpt.pt"
    _, broken, _ = _kill_writers(path, atomic=False, kills=15)
    assert broken >= 1


def _train(epochs: int, path: str, resume: bool) -> dict[str, torch.Tensor]:
    """The notebook's resumable DDP loop, on every rank."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    from workshop.training.data import digits
    from workshop.training.loaders import make_loader
    from workshop.training.models import SmallCNN
    from workshop.training.steps import train_step

    torch.manual_seed(0)
    model = DistributedDataParallel(SmallCNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.utils.data.Subset(digits(), range(512))
    sampler = DistributedSampler(data, seed=0)
    loader = make_loader(data, 32, shuffle=False, sampler=sampler)
    start = 0
    if resume and os.path.exists(path):
        start = load_checkpoint(path, model, opt)["epoch"] + 1
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            train_step(model, [batch], opt)
        save_checkpoint(path, model, opt, epoch=epoch)
    return {k: v.clone() for k, v in model.module.state_dict().items()}


def test_a_resumed_ddp_run_ends_with_the_weights_of_an_unbroken_one(tmp_path):
    unbroken = launch(
        _train, 3, str(tmp_path / "a.pt"), False, world_size=2, show="none"
    ).returns
    stopped = str(tmp_path / "b.pt")
    launch(_train, 1, stopped, True, world_size=2, show="none")  # "crashes" after 1
    resumed = launch(_train, 3, stopped, True, world_size=2, show="none").returns
    assert unbroken[0].keys() == resumed[0].keys()
    for key in unbroken[0]:
        assert torch.equal(unbroken[0][key], resumed[0][key]), key
        if "running" not in key:
            # Parameters agree across ranks. BatchNorm's running statistics do not:
            # DDP copies rank 0's into the others at the start of the next forward,
            # which is one reason only rank 0's copy is saved.
            assert torch.equal(resumed[0][key], resumed[1][key]), key
    # And the weights did move during the resumed epochs: not a trivial equality.
    first = launch(
        _train, 1, str(tmp_path / "c.pt"), False, world_size=2, show="none"
    ).returns[0]
    assert not torch.equal(first["classifier.weight"], resumed[0]["classifier.weight"])
