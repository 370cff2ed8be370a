"""What a checkpoint may hold: the values ``torch.load(weights_only=True)`` reads back.

:func:`workshop.training.checkpoint.load_checkpoint` loads with ``weights_only=True``,
so that opening a file runs no code. That loader refuses many values ``torch.save``
writes without complaint (numpy scalars, enum members, namedtuples, numpy arrays), and
the refusal would only show up at the next load, maybe hours later, on a resumed run.
:func:`plain_copy` runs at save time instead: it turns the few values with an exact
plain equivalent into that equivalent and refuses the rest, naming where they are.
"""

from __future__ import annotations

import enum
import sys
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

# Exact types, not isinstance: np.float64 is a float and IntEnum members are ints,
# yet the loader refuses both (it checks the class each value is rebuilt from). Only
# classes its allowlist has held since torch 2.4 are here, so the file also loads
# with the oldest torch the workshop supports.
_LEAVES = (
    type(None),
    bool,
    int,
    float,
    str,
    torch.Tensor,
    nn.Parameter,
    torch.Size,
    torch.device,
    torch.dtype,
)
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
    """``value`` with numpy scalars and enum members replaced by plain equivalents.

    ``np.float64(0.5)`` becomes ``0.5`` (``.item()``), ``np.int64(3)`` becomes ``3``
    and an enum member becomes its ``.value``; dict keys are treated alike.
    Containers are copied only where something inside them changed, so a state
    dict keeps its identity (and its ``_metadata``) when nothing did.

    Args:
        value: what is about to be saved.
        where: how the user would write its place, e.g. ``"extra['acc']"``; error
            messages name the offending value by extending it.

    Returns:
        ``value`` itself, or a copy holding only values the loader accepts.

    Raises:
        TypeError: a value the loader would refuse and that has no exact plain
            equivalent (a numpy array, a namedtuple, a set, an arbitrary object),
            naming its place (``extra['history'][3]``) and its type; or a
            container that holds itself.

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
