"""Checkpoints for DDP training: saved by rank 0 only, written atomically, loaded on
every rank onto its own device.

Atomic: the bytes go to a temporary file beside the checkpoint and are renamed over
it (``os.replace``, one step), so a job killed mid-write leaves the previous one
intact. What can be saved loads: :func:`load_checkpoint` reads with
``torch.load(weights_only=True)`` (opening a file runs no code), so a save keeps
plain data only and refuses anything else, naming where it is.

Notebook 02, section "Checkpointing", uses it::

    save_checkpoint("ckpt.pt", ddp_model, optimizer, epoch=epoch)  # every rank calls
    state = load_checkpoint("ckpt.pt", ddp_model, optimizer)       # every rank calls
    start_epoch = state["epoch"] + 1
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import re
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint_errors import (
    check_destination,
    check_device,
    os_error_in,
    read_error,
    write_error,
)

__all__ = ["load_checkpoint", "save_checkpoint"]

_FORMAT = 1


def _unwrap(model: nn.Module) -> nn.Module:
    # DDP keeps the real model in .module; saving that keeps the keys free of the
    # "module." prefix, so the checkpoint loads into a plain model too.
    return getattr(model, "module", model)


def _distributed() -> tuple[int, bool]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), True
    return 0, False


def _temp_name(path: Path, pid: int) -> Path:
    return path.with_name(f".{path.name}.{pid}.tmp")


def _remove_stale_temps(path: Path) -> None:
    """Remove temporary files left by writers that died mid-write."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.tmp")
    for other in path.parent.glob(f".{path.name}.*.tmp"):
        match = pattern.fullmatch(other.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:  # its writer is gone: nobody will finish it
            with contextlib.suppress(FileNotFoundError):
                other.unlink()
        except PermissionError:  # another user's live process: leave it alone
            pass


def _write_atomically(state: dict[str, Any], path: Path) -> None:
    check_destination(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(path, e, state) from e
    _remove_stale_temps(path)
    temp = _temp_name(path, os.getpid())
    try:
        with open(temp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename
        os.replace(temp, path)  # one step: readers see the old file or the new one
    except BaseException as e:
        with contextlib.suppress(OSError):
            temp.unlink()
        cause = os_error_in(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        # Name the user's path, not the hidden temporary file the OS complained of.
        raise write_error(path, cause, state) from e
    # Make the rename itself durable (a crash right after could otherwise undo it).
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _check_optimizer(optimizer: Any, example: str) -> None:
    # A module passed as the optimizer has a state_dict() too: without this its
    # weights would be saved as the optimizer's state, or loaded into it.
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer must be a torch.optim optimizer or None, not a "
            f"{type_name(optimizer)}; e.g. {example} with optimizer = "
            "torch.optim.SGD(model.parameters(), lr=0.05)"
        )


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    **extra: Any,
) -> Path:
    """Save the model (and optimizer) to ``path``: rank 0 writes, every rank waits
    (call it on every rank at the same point; no rank runs ahead of the file).

    Args:
        path: the checkpoint file; its directory is created if missing.
        model: the model, plain or DDP-wrapped (the inner model is saved).
        optimizer: its state is saved too, so a resumed run continues exactly.
        **extra: plain values to keep beside them (epoch, step, accuracy):
            numbers, strings, lists, tuples, dicts, tensors; numpy scalars and
            enum members are kept as the plain values they hold.

    Returns:
        The path written.

    Raises:
        TypeError: a value :func:`load_checkpoint` could not read back (named
            by place, e.g. ``extra['history'][3]``, on every rank); or a model,
            optimizer or path of the wrong kind.
        OSError: the file could not be written; the message names ``path``, the
            cause and a fix, and a previous checkpoint there is left intact.

    Example:
        >>> save_checkpoint("ckpt.pt", ddp_model, optimizer, epoch=3)  # doctest: +SKIP
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file name, got {path!r}; e.g. 'ckpt.pt'")
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; e.g. "
            "save_checkpoint('ckpt.pt', model, optimizer)"
        )
    _check_optimizer(optimizer, "save_checkpoint('ckpt.pt', model, optimizer)")
    path = Path(path)
    # Every rank checks (cheap: references, no copies), so that a value that cannot
    # be saved stops all ranks with the same error instead of rank 0 alone while
    # the others wait at the barrier.
    state = {
        "format": _FORMAT,
        "model": plain_copy(_unwrap(model).state_dict(), "model.state_dict()"),
        "optimizer": (
            plain_copy(optimizer.state_dict(), "optimizer.state_dict()")
            if optimizer is not None
            else None
        ),
        # Its class, so that a load into another kind is refused: an SGD state
        # loads into Adam without a word, and Adam's first step fails on 'betas'.
        "optimizer_class": None if optimizer is None else type(optimizer).__name__,
        "extra": plain_copy(extra, "extra"),
    }
    rank, distributed = _distributed()
    if rank == 0:
        _write_atomically(state, path)
    if distributed:
        import torch.distributed as dist

        dist.barrier()
    return path


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device | None = None,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model`` (and
    ``optimizer``) on this rank, onto the model's device (else a checkpoint saved
    from ``cuda:0`` would crowd every rank of a node onto one GPU).

    Args:
        path: the checkpoint file.
        model: the model to fill, plain or DDP-wrapped, already on its device.
        optimizer: filled with the saved optimizer state, if given.
        map_location: where to put the loaded tensors; default: the model's device.

    Returns:
        The ``extra`` values saved with it (e.g. ``{"epoch": 3}``).

    Raises:
        FileNotFoundError: no file at ``path``.
        IsADirectoryError: ``path`` is a folder.
        ValueError: a device this machine lacks; a file damaged, not from
            :func:`save_checkpoint` or holding a refused value; a model of another
            shape (the first differences named), an optimizer over other
            parameters or of another class, or none saved. Each names ``path``.
        PermissionError: ``path`` cannot be opened for reading.
        TypeError: ``optimizer`` is not a torch.optim optimizer.

    Example:
        >>> state = load_checkpoint("ckpt.pt", ddp_model, optimizer)  # doctest: +SKIP
        >>> start_epoch = state["epoch"] + 1                          # doctest: +SKIP
    """
    _check_optimizer(optimizer, "load_checkpoint('ckpt.pt', model, optimizer)")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            errno.EISDIR,
            f"{path} is a folder, not a checkpoint; give the checkpoint file in it",
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}; check the path, or start from scratch when "
            "there is none yet (Path(path).exists() tells which)"
        )
    if map_location is None:
        first = next(iter(model.parameters()), None)
        map_location = first.device if first is not None else "cpu"
    else:
        check_device(map_location)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except OSError as e:
        if e.filename is not None:
            raise  # the file could not be opened (permissions): the OS named it
        # torch's zip reader reports a file cut short past its first kilobytes as
        # a bare "[Errno 22] Invalid argument" (it seeks before the file's start,
        # looking for the archive's directory): say what is wrong with the file.
        raise read_error(path, e) from e
    except Exception as e:
        raise read_error(path, e) from e
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        found = (
            f"format {state['format']!r}"
            if isinstance(state, dict) and "format" in state
            else f"a {type(state).__name__} without a format {_FORMAT} marker"
        )
        raise ValueError(
            f"{path} was not written by save_checkpoint (it holds {found}); load it "
            "with torch.load instead, or give the path of a checkpoint that "
            "save_checkpoint wrote"
        )
    inner = _unwrap(model)
    # Checked before anything is copied: torch's load_state_dict copies every entry
    # that fits before it reports those that do not, which leaves a model half
    # loaded. (A module whose load hook renames entries is left to torch to judge.)
    mismatch = _mismatch(inner.state_dict(), state["model"])
    if mismatch and not any(m._load_state_dict_pre_hooks for m in inner.modules()):
        raise ValueError(
            f"{path} was saved from a model of another shape than the one given: "
            f"{'; '.join(mismatch)}. Build the model the checkpoint was saved from "
            "(the same class with the same sizes: layers, widths, classes) and load "
            "into that; nothing was loaded"
        )
    if optimizer is not None:
        if state["optimizer"] is None:
            raise ValueError(
                f"{path} holds no optimizer state (it was saved without one); "
                "call load_checkpoint without optimizer"
            )
        saved, given = state.get("optimizer_class"), type(optimizer).__name__
        if saved is not None and saved != given:  # (None: saved before it was kept)
            raise ValueError(
                f"{path} holds the state of an optimizer of class {saved}, but one "
                f"of class {given} was given; build one of class {saved} to continue "
                f"the run it was saved from, or leave optimizer out to start the "
                f"{given} afresh; nothing was loaded"
            )
        try:  # torch checks the groups before it changes anything
            optimizer.load_state_dict(state["optimizer"])
        except ValueError as e:  # torch's message names no file
            raise ValueError(
                f"{path} holds the state of an optimizer over other parameters "
                f"({e}); build the model and optimizer the checkpoint was saved "
                "from (the same parameter groups), or leave optimizer out to "
                "start the optimizer afresh"
            ) from e
    try:
        inner.load_state_dict(state["model"])
    except RuntimeError as e:
        # A module's own check refused it; torch's first lines say why (its whole
        # message can list every entry of a large model, hence the cut).
        said = " ".join(str(e).split())[:300]
        raise ValueError(
            f"{path} does not fit the model given ({said}); build the model the "
            "checkpoint was saved from and load into that"
        ) from e
    return state["extra"]


def _shape(value: Any) -> list[int] | None:
    """A tensor's shape; None for other values and a lazy module's parameter."""
    try:
        return list(value.shape)
    except (AttributeError, RuntimeError, ValueError):
        return None


def _names(keys: list[str], most: int = 3) -> str:
    shown = ", ".join(keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _mismatch(own: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """How the checkpoint's model state differs from the model's (empty when they
    fit): the first few differences say enough, where torch lists every one."""
    reshaped = []
    for key, value in own.items():
        theirs, ours = _shape(saved.get(key)), _shape(value)
        if theirs is not None and ours is not None and theirs != ours:
            reshaped.append(
                f"{key} is {theirs} in the checkpoint but {ours} in the model"
            )
    missing = [key for key in own if key not in saved]
    unexpected = [key for key in saved if key not in own]
    found = reshaped[:2]
    if len(reshaped) > 2:
        found.append(f"{len(reshaped) - 2} more of another shape")
    if missing:
        found.append(f"the model has {_names(missing)}, which the checkpoint lacks")
    if unexpected:
        found.append(f"the checkpoint has {_names(unexpected)}, which the model lacks")
    return found


# Exact types, not isinstance: np.float64 is a float and IntEnum members are ints,
# yet the loader refuses both (it checks the class each value is rebuilt from). Only
# classes its allowlist has held since torch 2.4 are here, so the file also loads
# with the oldest torch the workshop supports.
_LEAVES = (type(None), bool, int, float, str)  # Python's plain values, and torch's
_LEAVES += (torch.Tensor, nn.Parameter, torch.Size, torch.device, torch.dtype)
_CONTAINERS = (dict, OrderedDict, list, tuple)


def type_name(value: Any) -> str:
    """``numpy.float64``, ``collections.defaultdict``; builtins by their bare name."""
    kind = type(value)
    module = kind.__module__
    name = kind.__qualname__
    return name if module == "builtins" else f"{module}.{name}"


def _numpy_generic() -> type | None:
    # Only when numpy is already imported: a value cannot be a numpy scalar before.
    numpy = sys.modules.get("numpy")
    return numpy.generic if numpy is not None else None


def _hint(value: Any) -> str:
    """What to pass instead of ``value``, as a short phrase."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "torch.from_numpy(x) for a tensor, or x.tolist()"
    if isinstance(value, torch.Tensor):
        return "x.as_subclass(torch.Tensor), a plain tensor"
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return "x._asdict() or tuple(x)"
    for plain in (dict, list, tuple, str, int, float):
        if isinstance(value, plain):
            return f"{plain.__name__}(x)"
    if isinstance(value, set | frozenset):
        return "sorted(x) or list(x)"
    if isinstance(value, nn.Module | torch.optim.Optimizer):
        return "x.state_dict()"
    return "a number, string, list, dict or tensor made from it"


def _refuse(where: str, value: Any, why: str = "") -> TypeError:
    return TypeError(
        f"{where} is of type {type_name(value)}{why}, which a checkpoint cannot hold: "
        "load_checkpoint reads with torch.load(weights_only=True), which loads plain "
        "data only (numbers, strings, lists, tuples, dicts, tensors) so that opening "
        f"a file runs no code. Pass {_hint(value)} instead"
    )


def plain_copy(value: Any, where: str) -> Any:
    """``value`` with numpy scalars (``.item()``) and enum members (``.value``)
    replaced, keys too; containers are copied only where something inside changed.

    Args:
        value: what is about to be saved.
        where: how the user would write its place, e.g. ``"extra['acc']"``.

    Returns:
        ``value`` itself, or a copy holding only values the loader accepts.

    Raises:
        TypeError: a value the loader would refuse, with no exact plain
            equivalent (named by place and type); or a container that holds itself.

    Example:
        >>> plain_copy({"acc": [1.5]}, "extra")
        {'acc': [1.5]}
    """
    return _plain(value, where, frozenset())


def _plain(value: Any, where: str, inside: frozenset[int]) -> Any:
    kind = type(value)
    if kind in _LEAVES:
        return value
    numpy_generic = _numpy_generic()
    if isinstance(value, enum.Enum):
        plain, how = value.value, ".value"
    elif numpy_generic is not None and isinstance(value, numpy_generic):
        plain, how = value.item(), ".item()"
    else:
        plain = how = None
    if how is not None:
        if type(plain) not in _LEAVES + _CONTAINERS:  # e.g. datetime64's datetime
            raise _refuse(where, value, f" (its {how} is a {type_name(plain)})")
        return _plain(plain, where, inside)  # an enum of tuples, say
    if kind not in _CONTAINERS:
        raise _refuse(where, value)
    if id(value) in inside:
        # A loop would make this walk recurse forever; a checkpoint needs none.
        raise TypeError(
            f"{where} contains itself (a {kind.__name__} that holds a reference to "
            "one of the containers around it); a checkpoint keeps trees of values "
            "only: store a copy of the inner value instead"
        )
    inside = inside | {id(value)}
    # Leaves are checked inline: building each child's place (a repr) only for the
    # values that need a closer look keeps a large state dict quick to walk.
    if kind in (list, tuple):
        items = [
            v if type(v) in _LEAVES else _plain(v, f"{where}[{i}]", inside)
            for i, v in enumerate(value)
        ]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return kind(items)
    changed = False
    pairs = []
    for key, item in value.items():
        new_key = (
            key if type(key) in _LEAVES else _plain(key, f"{where} key {key!r}", inside)
        )
        new_item = (
            item if type(item) in _LEAVES else _plain(item, f"{where}[{key!r}]", inside)
        )
        changed = changed or new_key is not key or new_item is not item
        pairs.append((new_key, new_item))
    if not changed:
        return value
    copy = kind(pairs)
    # state_dict() keeps module versions in an attribute of the OrderedDict;
    # load_state_dict needs it for modules that changed their layout.
    if hasattr(value, "__dict__"):
        vars(copy).update(vars(value))
    return copy
