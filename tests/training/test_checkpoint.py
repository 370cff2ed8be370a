"""workshop.training.checkpoint: atomic saves on rank 0, loads onto each rank's device,
and a resumed DDP run that ends with exactly the weights of a run that never stopped."""

from __future__ import annotations

import collections
import enum
import errno
import importlib
import io
import os
import pickle
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from workshop.training.checkpoint import _temp_name, load_checkpoint, save_checkpoint


@pytest.mark.backward_in_process  # trains in this process: see conftest.py
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
    with pytest.raises(ValueError, match=r"cut\.pt is cut short or damaged"):
        load_checkpoint(tmp_path / "cut.pt", model)
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not written by save_checkpoint"):
        load_checkpoint(tmp_path / "other.pt", model)
    save_checkpoint(tmp_path / "c.pt", model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(tmp_path / "c.pt", model, opt)
    with pytest.raises(
        TypeError, match=r"extra\['when'\] is of type object, .*plain data only"
    ):
        save_checkpoint(tmp_path / "c.pt", model, when=object())
    # AttributeError ('NoneType' has no 'state_dict') and os.fspath's words before.
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got None"):
        save_checkpoint(tmp_path / "c.pt", None)
    with pytest.raises(TypeError, match=r"path must be a file name, got 5; e\.g\. "):
        save_checkpoint(5, model)


def test_a_module_passed_as_the_optimizer_is_refused(tmp_path):
    # It was saved as the optimizer's state before (a module has a state_dict too).
    model = nn.Linear(3, 2)
    refused = (
        r"optimizer must be a torch.optim optimizer or None, not a "
        r"torch\.nn\.modules\.linear\.Linear; e\.g\. {}\('ckpt\.pt', model, "
        r"optimizer\) with optimizer = torch\.optim\.SGD"
    )
    with pytest.raises(TypeError, match=refused.format("save_checkpoint")):
        save_checkpoint(tmp_path / "c.pt", model, optimizer=model)
    assert not (tmp_path / "c.pt").exists()
    save_checkpoint(tmp_path / "c.pt", model)
    with pytest.raises(TypeError, match=refused.format("load_checkpoint")):
        load_checkpoint(tmp_path / "c.pt", model, optimizer=model)


def test_an_optimizer_of_another_class_is_refused_naming_both(tmp_path):
    # An SGD state loaded into Adam without a word before; Adam's first step then
    # failed with KeyError: 'betas'.
    model = nn.Linear(3, 2)
    save_checkpoint(tmp_path / "c.pt", model, torch.optim.SGD(model.parameters(), 0.1))
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(
        ValueError,
        match=r"c\.pt holds the state of an optimizer of class SGD, but one of class "
        r"Adam was given; build one of class SGD to continue .*, or leave optimizer "
        r"out to start the Adam afresh; nothing was loaded",
    ):
        load_checkpoint(tmp_path / "c.pt", model, adam)
    for p in model.parameters():  # (no backward pass in the pytest process)
        p.grad = torch.ones_like(p)
    adam.step()  # untouched: it steps as a fresh Adam
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    load_checkpoint(tmp_path / "c.pt", model, sgd)  # the same class loads


def test_temp_files_of_live_writers_are_left_alone(tmp_path):
    path = tmp_path / "c.pt"
    live = _temp_name(path, os.getppid())  # a process that exists
    live.write_bytes(b"in progress")
    save_checkpoint(path, nn.Linear(2, 2))
    assert live.exists()


# --- what can be saved must load --------------------------------------------------


class Phase(enum.IntEnum):
    WARMUP = 1
    MAIN = 2


class Mode(enum.Enum):
    FAST = "fast"


Point = collections.namedtuple("Point", "x y")


def test_numpy_scalars_and_enums_are_saved_as_the_plain_values_they_hold(tmp_path):
    model = nn.Linear(2, 2)
    # A learning rate computed with numpy lands in the optimizer's own state.
    opt = torch.optim.SGD(model.parameters(), lr=np.float64(0.1))
    extra = {
        "acc": np.float64(0.5),
        "step": np.int64(3),
        "done": np.bool_(True),
        "half": np.float32(0.25),
        "phase": Phase.WARMUP,
        "mode": Mode.FAST,
        "history": [np.float64(0.1), (np.int32(2), Mode.FAST)],
        "by_phase": {Phase.MAIN: np.float64(1.5)},
    }
    path = save_checkpoint(tmp_path / "c.pt", model, opt, **extra)
    other_opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loaded = load_checkpoint(path, nn.Linear(2, 2), other_opt)
    assert loaded == {
        "acc": 0.5,
        "step": 3,
        "done": True,
        "half": 0.25,
        "phase": 1,
        "mode": "fast",
        "history": [0.1, (2, "fast")],
        "by_phase": {2: 1.5},
    }
    kinds = {k: type(v) for k, v in loaded.items()}
    assert kinds == {
        "acc": float,
        "step": int,
        "done": bool,
        "half": float,
        "phase": int,
        "mode": str,
        "history": list,
        "by_phase": dict,
    }
    assert type(loaded["history"][1]) is tuple
    assert [type(k) for k in loaded["by_phase"]] == [int]
    assert type(other_opt.param_groups[0]["lr"]) is float
    assert other_opt.param_groups[0]["lr"] == 0.1
    # The caller's values are left as they were: the plain copies went to the file.
    assert type(extra["history"][0]) is np.float64
    assert type(opt.param_groups[0]["lr"]) is np.float64


class _Holder(nn.Module):
    """A module whose extra state is whatever the test gives it."""

    def __init__(self, extra_state):
        super().__init__()
        self.extra = extra_state

    def get_extra_state(self):
        return self.extra

    def set_extra_state(self, state) -> None:
        self.extra = state


def test_a_models_converted_state_keeps_its_version_metadata(tmp_path):
    model = nn.Sequential(nn.Linear(1, 1), _Holder({"seen": np.int64(3)}))
    path = save_checkpoint(tmp_path / "c.pt", model)
    # load_state_dict reads module versions from the state dict's _metadata; the
    # copy made to replace the numpy value must carry it.
    raw = torch.load(path, weights_only=True)["model"]
    assert raw._metadata == model.state_dict()._metadata
    other = nn.Sequential(nn.Linear(1, 1), _Holder(None))
    load_checkpoint(path, other)
    assert other[1].extra == {"seen": 3}
    assert type(other[1].extra["seen"]) is int


_loop = [1]
_loop.append(_loop)


@pytest.mark.parametrize(
    ("value", "match", "loader_refuses"),
    [
        (
            [0.1, 0.2, 0.3, np.ones(2)],
            r"extra\['history'\]\[3\] is of type numpy\.ndarray, .*weights_only=True"
            r".*Pass torch\.from_numpy\(x\) for a tensor, or x\.tolist\(\)",
            True,
        ),
        (
            {"best": Point(1, 2)},
            r"extra\['history'\]\['best'\] is of type .*Point, .*x\._asdict\(\)",
            True,
        ),
        (
            collections.defaultdict(int),
            r"extra\['history'\] is of type collections\.defaultdict, .*dict\(x\)",
            True,
        ),
        (
            [np.datetime64("2024-01-01")],
            r"extra\['history'\]\[0\] is of type numpy\.datetime64 \(its \.item\(\) "
            r"is a datetime\.date\)",
            True,
        ),
        (
            [nn.Linear(1, 1)],
            r"extra\['history'\]\[0\] is of type .*Linear, .*x\.state_dict\(\)",
            True,
        ),
        # A set loads with today's torch, but not with the oldest it supports.
        ({1, 2}, r"extra\['history'\] is of type set, .*sorted\(x\)", False),
        (_loop, r"extra\['history'\]\[1\] contains itself", False),
    ],
    ids=["ndarray", "namedtuple", "defaultdict", "datetime64", "module", "set", "loop"],
)
def test_a_value_that_could_not_be_loaded_back_is_refused_at_save(
    tmp_path, value, match, loader_refuses
):
    path = tmp_path / "c.pt"
    with pytest.raises(TypeError, match=match):
        save_checkpoint(path, nn.Linear(2, 2), history=value)
    assert not path.exists()  # refused before anything was written
    if loader_refuses:
        # The refusal is not overcautious: this loader would indeed fail on it.
        buffer = io.BytesIO()
        torch.save({"history": value}, buffer)
        buffer.seek(0)
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            torch.load(buffer, weights_only=True)


def test_a_value_in_the_models_own_state_is_refused_with_its_place(tmp_path):
    model = nn.Sequential(nn.Linear(1, 1), _Holder({"seen": np.arange(3)}))
    with pytest.raises(
        TypeError,
        match=r"model\.state_dict\(\)\['1\._extra_state'\]\['seen'\] is of type "
        r"numpy\.ndarray",
    ):
        save_checkpoint(tmp_path / "c.pt", model)
    assert not (tmp_path / "c.pt").exists()


# --- load: each failure said apart ----------------------------------------------


def test_a_checkpoint_cut_short_is_reported_as_cut_short(tmp_path):
    whole = save_checkpoint(tmp_path / "c.pt", nn.Linear(20, 20)).read_bytes()
    for name, data in [("half.pt", whole[: len(whole) // 2]), ("empty.pt", b"")]:
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError, match=r"half\.pt is cut short or damaged: .*older"):
        load_checkpoint(tmp_path / "half.pt", nn.Linear(20, 20))
    with pytest.raises(ValueError, match=r"empty\.pt is empty \(0 bytes\)"):
        load_checkpoint(tmp_path / "empty.pt", nn.Linear(20, 20))


def test_a_file_of_another_kind_is_not_called_cut_short(tmp_path):
    model = nn.Linear(2, 2)
    (tmp_path / "notes.pt").write_text("hello, world")
    with pytest.raises(ValueError) as info:
        load_checkpoint(tmp_path / "notes.pt", model)
    assert re.search(
        r"notes\.pt is not a checkpoint written by save_checkpoint: .*zip archive, "
        r"and this file begins with b'hell'",
        str(info.value),
    )
    assert "cut short" not in str(info.value)
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("readme.txt", "not a model")
    with pytest.raises(ValueError, match=r"other\.zip is a zip archive but not a Py"):
        load_checkpoint(tmp_path / "other.zip", model)
    torch.save({"format": 2, "model": {}}, tmp_path / "future.pt")
    with pytest.raises(
        ValueError, match=r"future\.pt was not .* \(it holds format 2\)"
    ):
        load_checkpoint(tmp_path / "future.pt", model)
    with pytest.raises(IsADirectoryError, match=r"is a folder, not a checkpoint"):
        load_checkpoint(tmp_path, model)


def _resolve(name: str):
    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def test_a_value_the_loader_refuses_is_named_with_a_fix_that_works(tmp_path):
    # A file save_checkpoint would not write: torch.save with a numpy scalar and an
    # enum member in it, as an older save_checkpoint did.
    model = nn.Linear(2, 2)
    path = tmp_path / "old.pt"
    state = {"acc": np.float64(0.5), "phase": Phase.MAIN}
    torch.save(
        {"format": 1, "model": model.state_dict(), "optimizer": None, "extra": state},
        path,
    )
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, model)
    message = str(info.value)
    assert re.search(
        r"old\.pt holds a value that torch\.load\(weights_only=True\) refuses to "
        r"rebuild: numpy\.(_core|core)\.multiarray\.scalar \(a numpy value\); ",
        message,
    ), message
    assert "cut short" not in message and "safe_globals([numpy." in message
    scoped = hasattr(torch.serialization, "safe_globals")  # torch 2.5 and later
    assert ("with torch.serialization.safe_globals([" in message) == scoped
    # Following the message, one type at a time, does load the file.
    allowed = []
    try:
        for _ in range(6):
            try:
                if scoped:
                    with torch.serialization.safe_globals(allowed):
                        extra = load_checkpoint(path, model)
                else:
                    torch.serialization.add_safe_globals(allowed)
                    extra = load_checkpoint(path, model)
                break
            except ValueError as e:
                named = re.search(r"refuses to rebuild: ([\w.]+)[ ;]", str(e))
                assert named, str(e)
                allowed.append(_resolve(named.group(1)))
        else:
            raise AssertionError(f"still refused after allowing {allowed}")
    finally:
        if not scoped:
            torch.serialization.clear_safe_globals()
    assert Phase in allowed
    assert extra == {"acc": 0.5, "phase": Phase.MAIN}
    # And saved again, it loads with no allowance at all.
    save_checkpoint(path, model, **extra)
    assert load_checkpoint(path, model) == {"acc": 0.5, "phase": 2}


# --- load: a device that does not exist -------------------------------------------


@pytest.mark.skipif(
    torch.cuda.device_count() > 0,
    reason="this machine has a GPU: cuda:0 exists (the next test checks an index "
    "past the last one)",
)
def test_cuda_on_a_machine_without_a_gpu_says_there_is_none(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2))
    with pytest.raises(
        ValueError,
        match=r"map_location='cuda:0', but this machine has no cuda device "
        r"\(torch\.cuda\.device_count\(\) is 0\); load with map_location='cpu'",
    ):
        load_checkpoint(path, nn.Linear(2, 2), map_location="cuda:0")


def test_a_device_past_the_visible_ones_is_refused_before_reading(tmp_path):
    count = torch.cuda.device_count()  # counts without starting CUDA
    path = save_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2))
    model = nn.Linear(2, 2)
    before = model.weight.clone()
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, model, map_location=f"cuda:{count}")
    expected = (
        "this machine has no cuda device"
        if count == 0
        else rf"only {count} cuda device\(s\) are visible here"
    )
    assert re.search(rf"map_location='cuda:{count}', but {expected}", str(info.value))
    assert torch.equal(model.weight, before)  # nothing was loaded


def test_the_visible_devices_are_named(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "c.pt", nn.Linear(2, 2))
    # Two GPUs, as a node would show; refused before any CUDA call is made.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ValueError,
        match=r"map_location=device\(type='cuda', index=2\), but only 2 cuda "
        r"device\(s\) are visible here \(cuda:0 to cuda:1\); on a rank, use "
        r"'cuda:<local_rank>'",
    ):
        load_checkpoint(path, nn.Linear(2, 2), map_location=torch.device("cuda", 2))
    with pytest.raises(ValueError, match=r"map_location='gpu:0' is not a device"):
        load_checkpoint(path, nn.Linear(2, 2), map_location="gpu:0")


# --- save: where the file cannot be written --------------------------------------


@pytest.mark.parametrize("inside", ["c.pt", "sub/c.pt"])
def test_saving_under_a_regular_file_names_that_file(tmp_path, inside):
    (tmp_path / "blocker").write_text("a file, not a folder")
    path = tmp_path / "blocker" / inside
    with pytest.raises(NotADirectoryError) as info:
        save_checkpoint(path, nn.Linear(2, 2))
    assert str(info.value) == (
        f"[Errno {errno.ENOTDIR}] cannot save checkpoint {path}: {tmp_path}/blocker "
        "is a file, not a folder, so nothing can be created in it; save to another "
        "path, or move that file away first"
    )


def test_saving_onto_a_folder_says_so(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(
        IsADirectoryError, match=r"runs: it is a folder; give a file name in it"
    ):
        save_checkpoint(tmp_path / "runs", nn.Linear(2, 2))
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(name, options)``: a new folder ``name`` with a small tmpfs mounted on
    it where this machine lets the test do so (root with mount rights). Returns the
    folder and whether the mount was made; each mount is undone after the test."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> tuple[Path, bool]:
        where = tmp_path / name
        where.mkdir()
        if os.geteuid() != 0 or shutil.which("mount") is None:
            return where, False
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            return where, False
        mounted.append(where)
        return where, True

    yield mount
    for where in mounted:
        done = subprocess.run(["umount", str(where)], timeout=30, check=False)
        if done.returncode != 0:  # still busy: detach it now, freed when idle
            subprocess.run(["umount", "-l", str(where)], timeout=30, check=True)


def _fail_writes(monkeypatch, code: int) -> None:
    """Simulate a write that the OS refuses with ``code``, where a real one cannot
    be arranged: the flush to disk of the temporary file raises it."""

    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)


def _no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("inside", ["c.pt", "sub/c.pt"])
def test_saving_into_a_read_only_folder_says_so(tmp_path, tmpfs, monkeypatch, inside):
    folder, real = tmpfs("ro", "size=64k,ro")
    if not real:  # no mount allowed here: the same error, simulated
        _fail_writes(monkeypatch, errno.EROFS)
    path = folder / inside
    with pytest.raises(OSError) as info:
        save_checkpoint(path, nn.Linear(2, 2))
    assert info.value.errno == errno.EROFS
    # The folder named is the one the write was refused in: "sub" cannot be made.
    refused_in = path.parent if path.parent.is_dir() else folder
    assert str(info.value) == (
        f"[Errno {errno.EROFS}] cannot save checkpoint {path}: {refused_in} is on a "
        "read-only file system; save to a folder you can write to (the job's "
        "working directory, or scratch on a cluster)"
    )
    assert ".tmp" not in str(info.value)


def test_saving_into_a_folder_without_write_permission_says_so(tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        probe = folder / "probe"
        try:
            probe.write_text("x")
        except PermissionError:
            pass  # a real refusal (not root)
        else:  # root writes regardless of the mode: simulate the refusal
            probe.unlink()
            _fail_writes(monkeypatch, errno.EACCES)
        with pytest.raises(PermissionError) as info:
            save_checkpoint(folder / "c.pt", nn.Linear(2, 2))
    finally:
        folder.chmod(0o755)
    where = re.escape(str(folder))
    assert re.fullmatch(
        rf"\[Errno {errno.EACCES}\] cannot save checkpoint {where}/c\.pt: no "
        rf"permission to write in {where} \(mode dr-xr-xr-x, owner uid \d+\); save "
        r"to a folder you own, or have write permission granted on it \(chmod u\+w\)",
        str(info.value),
    ), str(info.value)
    assert _no_temp_files(folder)


def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(
    tmp_path, tmpfs, monkeypatch
):
    # Room for a small checkpoint, not for a big one.
    folder, real = tmpfs("full", "size=64k")
    big = nn.Linear(200, 200)  # 160 KB of weights
    path = folder / "c.pt"
    small = nn.Linear(2, 2)
    save_checkpoint(path, small, epoch=1)
    if not real:  # no mount allowed here: the same error, simulated
        _fail_writes(monkeypatch, errno.ENOSPC)
    with pytest.raises(OSError) as info:
        save_checkpoint(path, big, epoch=2)
    assert info.value.errno == errno.ENOSPC
    path_re, folder_re = re.escape(str(path)), re.escape(str(folder))
    assert re.fullmatch(
        rf"\[Errno {errno.ENOSPC}\] cannot save checkpoint {path_re}: no space left "
        rf"on the disk of {folder_re} \([\d.]+ \w+ free there; the checkpoint needs "
        r"about "
        r"160\.8 KB\)\. Nothing was written: the previous checkpoint, if any, is "
        r"intact\. Free space .*, or save to a file system with room .*",
        str(info.value),
    ), str(info.value)
    monkeypatch.undo()
    assert [p.name for p in folder.iterdir()] == ["c.pt"]  # no temporary file left
    other = nn.Linear(2, 2)
    assert load_checkpoint(path, other) == {"epoch": 1}
    assert torch.equal(other.weight, small.weight)


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.EDQUOT, r"your disk quota is used up on the disk of .*`quota -s`"),
        (errno.EIO, r"Input/output error \(EIO\) while writing into .*save elsewhere"),
    ],
    ids=["quota", "io-error"],
)
def test_other_write_failures_name_the_checkpoint_and_the_cause(
    tmp_path, monkeypatch, code, says
):
    _fail_writes(monkeypatch, code)
    path = tmp_path / "c.pt"
    with pytest.raises(
        OSError, match=rf"cannot save checkpoint {path}: {says}"
    ) as info:
        save_checkpoint(path, nn.Linear(2, 2))
    assert info.value.errno == code
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too
