"""The errors of :mod:`workshop.training.checkpoint`, each naming the checkpoint's path,
the real cause and a fix.

The operating system reports a failed save against the hidden temporary file the
bytes went to (``.ckpt.pt.1234.tmp``), and torch reports a full disk as "unexpected
pos"; ``torch.load`` reports a cut-short file, a file of another kind and a value it
refuses to rebuild in much the same words. These helpers tell them apart.
"""

from __future__ import annotations

import contextlib
import errno
import pickle
import re
import shutil
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch


def check_destination(path: Path) -> None:
    """Refuse a path that is a folder, or that runs through a file, before writing."""
    if path.is_dir():
        raise IsADirectoryError(
            errno.EISDIR,
            f"cannot save checkpoint {path}: it is a folder; give a file name in it, "
            f"e.g. {path / 'ckpt.pt'}",
        )
    for parent in path.parents:
        if parent.is_dir():
            return
        if parent.exists():
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"cannot save checkpoint {path}: {parent} is a file, not a folder, so "
                "nothing can be created in it; save to another path, or move that "
                "file away first",
            )


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError that made a write fail: ``error`` itself, or the one behind
    torch.save's RuntimeError ("unexpected pos" for a full disk); else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while isinstance(current, OSError | RuntimeError) and id(current) not in seen:
        if isinstance(current, OSError) and current.errno is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _existing_folder(path: Path) -> Path:
    """The folder the write went to: the nearest one of ``path``'s that exists."""
    return next((p for p in path.parents if p.is_dir()), path.parent)


def _size(nbytes: int) -> str:
    value, unit = float(nbytes), "bytes"
    for bigger in ("KB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.0f} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def write_error(path: Path, cause: OSError, state: dict[str, Any]) -> OSError:
    """An OSError of the same errno that names ``path``, the cause and a fix."""
    folder = _existing_folder(path)
    code = cause.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        what = (
            "no space left on the disk"
            if code == errno.ENOSPC
            else "your disk quota is used up on the disk"
        )
        room = f"the checkpoint needs about {_size(_tensor_bytes(state))}"
        with contextlib.suppress(OSError):
            room = f"{_size(shutil.disk_usage(folder).free)} free there; " + room
        text = (
            f"{what} of {folder} ({room}). Nothing was written: the previous "
            "checkpoint, if any, is intact. Free space (old checkpoints, outputs; "
            "`df -h` and `quota -s` show what is left), or save to a file system "
            "with room (on a cluster: scratch rather than home)"
        )
    elif code == errno.EROFS:
        text = (
            f"{folder} is on a read-only file system; save to a folder you can "
            "write to (the job's working directory, or scratch on a cluster)"
        )
    elif code in (errno.EACCES, errno.EPERM):
        mode = ""
        with contextlib.suppress(OSError):
            info = folder.stat()
            mode = f" (mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid})"
        text = (
            f"no permission to write in {folder}{mode}; save to a folder you own, or "
            "have write permission granted on it (chmod u+w)"
        )
    else:
        name = errno.errorcode.get(code, str(code))
        text = (
            f"{cause.strerror or cause} ({name}) while writing into {folder}; check "
            "that the folder exists, is writable and has room, or save elsewhere"
        )
    return OSError(code, f"cannot save checkpoint {path}: {text}")


def check_device(map_location: Any) -> None:
    """Refuse a device that does not exist here before torch.load fails deep inside
    on it (counting devices does not start CUDA, so ranks can still fork)."""
    if not isinstance(map_location, str | torch.device):
        return  # a dict or a function: torch.load's own business
    try:
        device = torch.device(map_location)
    except RuntimeError as e:
        raise ValueError(
            f"map_location={map_location!r} is not a device ({e}); use e.g. 'cpu' "
            "or 'cuda:0', or leave it out to load onto the model's device"
        ) from e
    if device.type in ("cpu", "meta"):
        return
    count_devices = getattr(getattr(torch, device.type, None), "device_count", None)
    if count_devices is None:
        return  # a backend without a count: let torch.load judge
    count = count_devices()
    kind = device.type
    if count == 0:
        raise ValueError(
            f"map_location={map_location!r}, but this machine has no {kind} device "
            f"(torch.{kind}.device_count() is 0); load with map_location='cpu', or "
            "leave map_location out to load onto the model's own device"
        )
    if device.index is not None and device.index >= count:
        raise ValueError(
            f"map_location={map_location!r}, but only {count} {kind} device(s) are "
            f"visible here ({kind}:0 to {kind}:{count - 1}); on a rank, use "
            f"'{kind}:<local_rank>' or leave map_location out to load onto the "
            "model's own device (CUDA_VISIBLE_DEVICES may hide the others)"
        )


_ZIP_START = b"PK\x03\x04"  # how every file of torch.save's (zip) format begins
# How torch's weights_only loader names the class it refused, in its two messages.
_REFUSED_TYPE = re.compile(
    r"GLOBAL (\S+) was not an allowed global"
    r"|Can only build .* but got <class '([^']+)'>"
)
_UNPICKLER_SAYS = re.compile(
    r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)", re.DOTALL
)


def read_error(path: Path, error: Exception) -> ValueError:
    """Why ``torch.load`` could not read ``path``: cut short or damaged, not a
    checkpoint at all, or holding a value that weights_only loading refuses."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_ZIP_START))
        size = path.stat().st_size
    except OSError as e:  # gone or unreadable since torch.load tried
        return ValueError(f"{path} could not be read back: {e}")
    damaged = (
        "Use an older checkpoint, or start again. save_checkpoint never leaves a "
        "file half-written (it replaces the old one in one step), so look for a copy "
        "that did not finish, another writer, or a failing disk"
    )
    if size == 0:
        return ValueError(
            f"{path} is empty (0 bytes): a write that never finished (a full disk, "
            f"or a writer killed at once). {damaged}"
        )
    if head != _ZIP_START:
        return ValueError(
            f"{path} is not a checkpoint written by save_checkpoint: torch.save "
            f"writes a zip archive, and this file begins with {head!r} ({size} "
            "bytes). Check the path; a file of another kind is read by its own tool"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return ValueError(
            f"{path} is cut short or damaged: it begins as a zip archive but its "
            f"end (the archive's directory) is missing ({size} bytes). {damaged}"
        )
    if not any(name.endswith("data.pkl") for name in names):
        return ValueError(
            f"{path} is a zip archive but not a PyTorch file (no data.pkl among "
            f"{names[:5]}); give the path of a checkpoint that save_checkpoint wrote"
        )
    message = str(error)
    refused = _REFUSED_TYPE.search(message)
    if isinstance(error, pickle.UnpicklingError) and refused is not None:
        name = refused.group(1) or refused.group(2)
        numpy = " (a numpy value)" if name.startswith("numpy") else ""
        return ValueError(
            f"{path} holds a value that torch.load(weights_only=True) refuses to "
            f"rebuild: {name}{numpy}; that loader rebuilds plain data only, so that "
            "opening a file runs no code. save_checkpoint stores plain equivalents "
            "(float, int, an enum's .value) or refuses such values, so this file was "
            "written some other way (torch.save, an older save_checkpoint). If you "
            f"trust it, {_allow(name)} (add any further type the next try names), "
            "then save it again with save_checkpoint"
        )
    said = _UNPICKLER_SAYS.search(message)
    detail = said.group(1) if said else f"{type(error).__name__}: {message}"
    detail = " ".join(detail.split())[:300]  # torch's text spans several lines
    return ValueError(
        f"{path} is a PyTorch file that could not be read back ({detail}): "
        f"it is damaged, or was not written by save_checkpoint. {damaged}"
    )


def _allow(name: str) -> str:
    """How to let ``torch.load`` rebuild the type ``name``, on the installed torch."""
    import torch.serialization

    if hasattr(torch.serialization, "safe_globals"):  # torch 2.5 and later
        return (
            "allow the type for one load: `with torch.serialization.safe_globals("
            f"[{name}]): load_checkpoint(...)`"
        )
    return (  # torch 2.4 has only the process-wide list
        f"allow the type: `torch.serialization.add_safe_globals([{name}])`, then "
        "load_checkpoint(...) again"
    )
