"""What one rank of the fake world sends, and a step without arithmetic.

For :mod:`workshop.planner.fake_rank`, in the child process of
:func:`workshop.planner.fake_world.fake_run`: where each piece of PyTorch the check
needs lives (:func:`find_features`; torch 2.4 keeps two of them elsewhere), a
dispatch mode that writes down every collective with its mesh dimension and the
bytes it carries (:class:`Collectives`), and :func:`no_arithmetic`, within which
matrix products and big copies only allocate their output. The fake collectives
carry no values, so the values of the products mean nothing; on a CPU without bf16
units one bf16 product of an 8B model's head takes seconds, and touching every byte
of every gathered block takes more.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

#: Where each feature lives, newest first (torch 2.4 has the second of each pair).
_PLACES: dict[str, tuple[tuple[str, str], ...]] = {
    "fake_pg": (("torch.testing._internal.distributed.fake_pg", "FakeStore"),),
    "device_mesh": (("torch.distributed.device_mesh", "init_device_mesh"),),
    "fully_shard": (
        ("torch.distributed.fsdp", "fully_shard"),
        ("torch.distributed._composable.fsdp", "fully_shard"),
    ),
    "parallelize_module": (
        ("torch.distributed.tensor.parallel", "parallelize_module"),
    ),
    "comm_debug_mode": (
        ("torch.distributed.tensor.debug", "CommDebugMode"),
        ("torch.distributed._tensor.debug", "CommDebugMode"),
    ),
}


def find_features() -> dict[str, str | None]:
    """For each feature, the module it was imported from, or None if torch lacks it."""
    found: dict[str, str | None] = {}
    for feature, places in _PLACES.items():
        found[feature] = None
        for module, name in places:
            try:
                if hasattr(importlib.import_module(module), name):
                    found[feature] = module
                    break
            except ImportError:
                continue
    return found


def warm_up() -> None:
    """Import everything a run needs, once, before the child forks one per run."""
    find_features()
    importlib.import_module("torch.nn.parallel")
    importlib.import_module("torch.distributed.optim")
    importlib.import_module("torch.utils._python_dispatch")


def _get(feature: str, name: str | None = None) -> Any:
    for module, attr in _PLACES[feature]:
        try:
            return getattr(importlib.import_module(module), name or attr)
        except (ImportError, AttributeError):
            continue
    raise RuntimeError(f"this torch ({torch.__version__}) has no {feature}")


# --- what the rank sends ------------------------------------------------------------
_OUTPUTS = ("output_tensor", "outputs", "output_tensors", "output_lists", "out")
_INPUTS = (
    "input_tensor",
    "inputs",
    "input_tensors",
    "input",
    "input_list",
    "tensors",
    "tensor",
)


def _kind(op_name: str) -> str | None:
    name = op_name.split("::")[-1].split(".")[0]
    for kind, words in (
        ("all_gather", ("allgather", "all_gather")),
        ("reduce_scatter", ("reduce_scatter",)),
        ("all_reduce", ("allreduce", "all_reduce")),
        ("broadcast", ("broadcast",)),
        ("all_to_all", ("alltoall", "all_to_all")),
        ("send_recv", ("send", "recv", "p2p")),
    ):
        if any(w in name for w in words):
            return kind
    return None


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class Collectives:
    """A dispatch mode that writes down each collective: its kind, the mesh dimension
    of its process group, and the bytes of the full tensors it carries (an
    all-gather's output, a reduce-scatter's input, an all-reduce's tensor)."""

    def __init__(self, groups: dict[str, tuple[str, int]]):
        from torch.utils._python_dispatch import TorchDispatchMode

        record = self._record

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
                    record(func, args, kwargs)
                return func(*args, **kwargs)

        self.groups = groups  # process group name: (mesh dimension, size)
        self.mode = _Mode()
        self.calls: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.sizes: dict[str, int] = {}

    def _record(self, func: Any, args: tuple, kwargs: dict) -> None:
        kind = _kind(func._schema.name)
        if kind is None:
            return
        names = [a.name for a in func._schema.arguments][: len(args)]
        named = dict(zip(names, args, strict=True))
        named.update(kwargs)
        group, size = self._group(named)
        if kind == "all_gather" and not any(k in named for k in _OUTPUTS):
            carried = _nbytes(next(named[k] for k in _INPUTS if k in named)) * size
        elif kind == "all_gather":
            carried = _nbytes(next(named[k] for k in _OUTPUTS if k in named))
        else:
            carried = _nbytes(next(named[k] for k in _INPUTS if k in named))
        key = f"{kind} {group}"
        self.calls[key][0] += 1
        self.calls[key][1] += carried
        self.sizes[key] = size

    def _group(self, named: dict[str, Any]) -> tuple[str, int]:
        if "process_group" in named:
            pg = named["process_group"]
            if not isinstance(pg, dist.ProcessGroup):  # the dispatcher's boxed form
                pg = dist.ProcessGroup.unbox(pg)
            name, size = pg.group_name, pg.size()
        else:
            name = str(named.get("group_name"))
            size = (
                int(named.get("group_size") or 0) or self.groups.get(name, ("", 0))[1]
            )
        return self.groups.get(name, (f"group{size}", size))[0], size

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Calls and bytes so far, by "kind dimension"."""
        return {k: (v[0], v[1]) for k, v in sorted(self.calls.items())}


@contextlib.contextmanager
def no_arithmetic() -> Iterator[None]:
    """Within it, the CPU kernels of the matrix products only allocate their output
    (uninitialised, the right shape and dtype), and big copies copy nothing."""
    lib = _replacements()
    try:
        yield
    finally:
        lib._destroy()


def _replacements() -> Any:
    lib = torch.library.Library("aten", "IMPL")

    def mm(a, b):
        return a.new_empty((a.shape[0], b.shape[1]))

    def addmm(bias, a, b, beta=1, alpha=1):
        return a.new_empty((a.shape[0], b.shape[1]))

    def bmm(a, b):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    def baddbmm(bias, a, b, beta=1, alpha=1):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        for name, fn in (
            ("mm", mm),
            ("addmm", addmm),
            ("bmm", bmm),
            ("baddbmm", baddbmm),
        ):
            lib.impl(name, fn, "CPU")
        if hasattr(torch.library, "get_kernel"):  # torch 2.9 and newer
            # Big copies too (FSDP's copies into and out of its gather and reduce
            # buffers, dtype casts): only their shapes matter here, and touching
            # every byte of every gathered block is what makes a step slow.
            real = torch.library.get_kernel("aten::copy_", "CPU")

            def copy_(keys, dst, src, non_blocking=False):
                if not isinstance(src, torch.Tensor):  # a number reaches us as one
                    return dst.fill_(src)
                if dst.numel() >= _BIG:
                    return dst
                return real.call_boxed(keys, dst, src, non_blocking)

            lib.impl("copy_", copy_, "CPU", with_keyset=True)
            real_fill = torch.library.get_kernel("aten::fill_.Scalar", "CPU")

            def fill_(keys, dst, value):  # zeroed gradients and buffers
                if dst.numel() >= _BIG:
                    return dst
                return real_fill.call_boxed(keys, dst, value)

            lib.impl("fill_.Scalar", fill_, "CPU", with_keyset=True)
            real_chunk_cat = torch.library.get_kernel("aten::_chunk_cat.out", "CPU")

            def chunk_cat(keys, tensors, dim, num_chunks, *, out):  # FSDP2's copy-in
                if out.numel() >= _BIG:
                    return out
                return real_chunk_cat.call_boxed(
                    keys, tensors, dim, num_chunks, out=out
                )

            lib.impl("_chunk_cat.out", chunk_cat, "CPU", with_keyset=True)
    return lib


_BIG = 1 << 16  # elements: copies at least this big are skipped


def group_names(mesh: Any) -> dict[str, tuple[str, int]]:
    """(mesh dimension, size) by process group name, and the whole world's."""
    world = dist.distributed_c10d._get_default_group()
    names = {world.group_name: ("world", world.size())}
    for dim in mesh.mesh_dim_names:
        names[mesh[dim].get_group().group_name] = (dim, mesh[dim].size())
    return names
