"""workshop.checkpoint: atomic saves on rank 0, loads onto each rank's device, and a
resumed DDP run that ends with exactly the weights of a run that never stopped."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch
from torch import nn

from workshop import launch
from workshop.checkpoint import _temp_name, load_checkpoint, save_checkpoint

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


def test_save_keeps_the_inner_model_and_optimizer_and_extra(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path / "sub" / "c.pt", model, opt, epoch=3, acc=[0.5])
    assert path == tmp_path / "sub" / "c.pt"
    other = nn.Linear(3, 2)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    extra = load_checkpoint(path, other, other_opt)
    assert extra == {"epoch": 3, "acc": [0.5]}
    assert torch.equal(other.weight, model.weight)
    momentum = other_opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, opt.state_dict()["state"][0]["momentum_buffer"])


def test_load_goes_to_the_models_device_unless_told(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2))
    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen["map_location"] = kwargs["map_location"]
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    load_checkpoint(path, nn.Linear(2, 2))
    assert seen["map_location"] == torch.device("cpu")
    load_checkpoint(path, nn.Linear(2, 2), map_location="cpu")
    assert seen["map_location"] == "cpu"


def test_errors_say_what_was_wrong(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*nope\.pt"):
        load_checkpoint(tmp_path / "nope.pt", model)
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=r"cut\.pt is not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt", model)
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not written by save_checkpoint"):
        load_checkpoint(tmp_path / "other.pt", model)
    save_checkpoint(tmp_path / "c.pt", model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(tmp_path / "c.pt", model, opt)
    with pytest.raises(TypeError, match=r"extra\['when'\] is a object; .*plain values"):
        save_checkpoint(tmp_path / "c.pt", model, when=object())


def _train(epochs: int, path: str, resume: bool) -> dict[str, torch.Tensor]:
    """The notebook's resumable DDP loop, on every rank."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    from workshop.data import digits, make_loader
    from workshop.models import SmallCNN
    from workshop.training import train_step

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


def test_temp_files_of_live_writers_are_left_alone(tmp_path):
    path = tmp_path / "c.pt"
    live = _temp_name(path, os.getppid())  # a process that exists
    live.write_bytes(b"in progress")
    save_checkpoint(path, nn.Linear(2, 2))
    assert live.exists()
