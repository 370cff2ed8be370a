"""Record what a rank does with ``torch.distributed``, as plain data for diagrams.

Inside a rank (a function run by ``workshop.launch``, or a script under ``torchrun``)::

    with record() as events:            # torch.distributed's functions are wrapped here
        dist.all_reduce(torch.tensor([float(dist.get_rank())]))
    return events       # [TraceEvent(op="all_reduce", before=[0.0], ...)]

Outside a ``record()`` block nothing is wrapped, so tracing costs nothing when off.
Only calls through the module's attributes (``dist.all_reduce(...)``) are seen: a name
imported with ``from torch.distributed import all_reduce`` before the block, and what
PyTorch does internally (DDP's gradient buckets), bypass the wrappers.
:mod:`workshop.comm.trace_data` saves, reads back and groups the events.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..checks import whole

__all__ = ["OPS", "POINT_TO_POINT", "TraceEvent", "record"]

POINT_TO_POINT = ("send", "recv", "isend", "irecv")


@dataclass(frozen=True)
class _Spec:
    """How to read one function's arguments."""

    tensors: tuple[str, ...]  # parameters holding a tensor or a list of tensors
    peer: str | None = None  # point-to-point: the parameter naming the other rank
    root: str | None = None  # rooted collectives: the parameter naming the root
    reduces: bool = False  # takes op=ReduceOp
    nonblocking: bool = False  # always returns a Work (isend, irecv)
    # Calls with an input and an output: (the parameter read, the parameter written).
    io: tuple[str, str] | None = None


_SPECS: dict[str, _Spec] = {
    "send": _Spec(("tensor",), peer="dst"),
    "recv": _Spec(("tensor",), peer="src"),
    "isend": _Spec(("tensor",), peer="dst", nonblocking=True),
    "irecv": _Spec(("tensor",), peer="src", nonblocking=True),
    "broadcast": _Spec(("tensor",), root="src"),
    "all_reduce": _Spec(("tensor",), reduces=True),
    "reduce": _Spec(("tensor",), root="dst", reduces=True),
    "all_gather": _Spec(("tensor_list", "tensor"), io=("tensor", "tensor_list")),
    "all_gather_into_tensor": _Spec(
        ("output_tensor", "input_tensor"), io=("input_tensor", "output_tensor")
    ),
    "gather": _Spec(
        ("tensor", "gather_list"), root="dst", io=("tensor", "gather_list")
    ),
    "scatter": _Spec(
        ("tensor", "scatter_list"), root="src", io=("scatter_list", "tensor")
    ),
    "reduce_scatter": _Spec(
        ("output", "input_list"), reduces=True, io=("input_list", "output")
    ),
    "reduce_scatter_tensor": _Spec(
        ("output", "input"), reduces=True, io=("input", "output")
    ),
    "all_to_all": _Spec(
        ("output_tensor_list", "input_tensor_list"),
        io=("input_tensor_list", "output_tensor_list"),
    ),
    "all_to_all_single": _Spec(("output", "input"), io=("input", "output")),
    "barrier": _Spec(()),
}

#: The ``torch.distributed`` functions that :func:`record` wraps.
OPS: tuple[str, ...] = tuple(_SPECS)


@dataclass(frozen=True)
class TraceEvent:
    """One call to a ``torch.distributed`` function on one rank, as plain data.

    Attributes:
        seq: position of the call in this rank's recording (0, 1, 2, ...).
        op: the function's name, e.g. "all_reduce", "send", "barrier".
        peer: point-to-point calls: the other rank (global); for ``recv`` from any
            source the rank the message came from; for ``irecv`` from any, None.
        root: rooted collectives: the global rank of ``src``/``dst``; else None.
        reduce_op: "sum", "max", "avg", ... for reducing calls; otherwise None.
        world_size: size of the group the call ran in.
        shapes: shape of every tensor passed in, in parameter order, tensor lists
            expanded.
        dtype: the first tensor's dtype without "torch."; None for ``barrier``.
        nbytes: bytes of all the tensors passed in, each counted once: the data the
            call touches on this rank, not what goes on the wire (a ring all-reduce
            sends about 2(N-1)/N times the tensor).
        blocking: False for ``isend``/``irecv`` and calls with ``async_op=True``.
        start, end: ``time.time()`` just before the call and when it returned (for a
            non-blocking call, before the data has arrived).
        before: what the call reads on this rank, captured before it (None above
            ``max_values`` numbers): the one tensor's ``tolist()``, or for calls with an
            input and an output, the input (``scatter_list``, None off the root; the
            own tensor of ``gather``/``all_gather``; the input list of
            ``reduce_scatter``/``all_to_all``).
        after: what the call wrote on this rank: the one tensor, or the output
            (``gather_list``, None off the root). A non-blocking call's is captured
            when ``.wait()`` returns; without ``.wait()`` it stays None.
    """

    rank: int
    seq: int
    op: str
    peer: int | None
    root: int | None
    reduce_op: str | None
    world_size: int
    shapes: list[tuple[int, ...]]
    dtype: str | None
    nbytes: int
    blocking: bool
    start: float
    end: float
    before: Any
    after: Any


# ----------------------------------------------------------------- recording
@dataclass
class _Recorder:
    events: list[TraceEvent]
    max_values: int


_ACTIVE: list[_Recorder] = []  # the record() blocks open in this process
_ORIGINALS: dict[str, Callable[..., Any]] = {}  # filled while any block is open


def _tensors_of(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _values(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [t.detach().cpu().tolist() for t in value]
    return value.detach().cpu().tolist()


def _snapshot(spec: _Spec, bound: dict[str, Any], side: str) -> Any:
    """Values of what the call reads ("before") or writes ("after")."""
    if not spec.tensors:
        return None
    if spec.io is not None:
        return _values(bound[spec.io[0] if side == "before" else spec.io[1]])
    return _values(bound[spec.tensors[0]])


def _reduce_name(op: Any) -> str:
    name = getattr(op, "name", None) or getattr(getattr(op, "op", None), "name", None)
    return (name or str(op).rsplit(".", 1)[-1]).lower()


def _global(dist: Any, bound: dict[str, Any], name: str) -> int | None:
    """The global rank named by ``src``/``dst`` or by its group-local form."""
    rank = bound.get(name)
    local = bound.get(f"group_{name}")
    if rank is None and local is not None:
        group = bound.get("group") or dist.group.WORLD
        rank = dist.get_global_rank(group, local)
    return rank


class _Call:
    """What is known about one call before it runs."""

    def __init__(self, name: str, spec: _Spec, bound: dict[str, Any], limit: int):
        import torch.distributed as dist

        self.name = name
        self.spec = spec
        self.bound = bound
        tensors = [t for p in spec.tensors for t in _tensors_of(bound[p])]
        self.shapes = [tuple(int(n) for n in t.shape) for t in tensors]
        self.numel = sum(t.numel() for t in tensors)
        seen: dict[int, Any] = {id(t): t for t in tensors}
        self.nbytes = sum(t.numel() * t.element_size() for t in seen.values())
        self.dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else None
        self.small = self.numel <= limit
        self.before = _snapshot(spec, bound, "before") if self.small else None
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size(bound.get("group"))
        self.peer = _global(dist, bound, spec.peer) if spec.peer else None
        self.root = _global(dist, bound, spec.root) if spec.root else None
        self.reduce_op = _reduce_name(bound["op"]) if spec.reduces else None
        self.blocking = not (spec.nonblocking or bound.get("async_op", False))

    def event(self, seq: int, start: float, end: float, after: Any) -> TraceEvent:
        fields = dataclasses.fields(TraceEvent)
        known = {f.name: getattr(self, f.name) for f in fields if hasattr(self, f.name)}
        given = dict(seq=seq, op=self.name, shapes=list(self.shapes), after=after)
        return TraceEvent(**known | given | {"start": start, "end": end})


class _TracedWork:
    """A non-blocking call's Work, whose ``.wait()`` also records what arrived."""

    def __init__(self, work: Any, on_wait: Callable[[], None]):
        self._work = work
        self._on_wait: Callable[[], None] | None = on_wait

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        if self._on_wait is not None:
            on_wait, self._on_wait = self._on_wait, None
            on_wait()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _store(
    recorders: list[_Recorder], call: _Call, start: float, end: float, after: Any
) -> list[tuple[_Recorder, int]]:
    places = []
    for rec in recorders:
        mine = call.numel <= rec.max_values
        event = call.event(len(rec.events), start, end, after if mine else None)
        if not mine:
            event = dataclasses.replace(event, before=None)
        places.append((rec, len(rec.events)))
        rec.events.append(event)
    return places


def _after_wait(call: _Call, places: list[tuple[_Recorder, int]]) -> None:
    if not call.small:
        return
    after = _snapshot(call.spec, call.bound, "after")
    for rec, index in places:
        if call.numel <= rec.max_values and index < len(rec.events):
            rec.events[index] = dataclasses.replace(rec.events[index], after=after)


def _traced(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    spec = _SPECS[name]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorders = list(_ACTIVE)
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            limit = max(r.max_values for r in recorders)
            call = _Call(name, spec, bound.arguments, limit)
        except Exception:
            # Bad arguments (or no process group): let the real function raise its
            # own error, unrecorded.
            return original(*args, **kwargs)
        start = time.time()
        result = original(*args, **kwargs)
        end = time.time()
        try:
            if name == "recv" and call.peer is None and isinstance(result, int):
                call.peer = result  # recv from any source returns the sender
            if call.blocking or result is None:
                after = _snapshot(spec, call.bound, "after") if call.small else None
                _store(recorders, call, start, end, after)
                return result
            places = _store(recorders, call, start, end, None)
            return _TracedWork(result, functools.partial(_after_wait, call, places))
        except Exception as exc:  # a tracing bug must not break the lesson
            warnings.warn(
                f"workshop.comm.tracing could not record {name}: {exc!r}", stacklevel=2
            )
            return result

    return traced


@contextmanager
def record(max_values: int = 64) -> Iterator[list[TraceEvent]]:
    """Record this rank's ``torch.distributed`` calls made inside the block.

    The functions of :data:`OPS` are replaced by recording wrappers on entry and the
    very same originals put back on exit (also after an exception). Nested blocks do
    not wrap twice: both lists receive the calls. Results and exceptions are
    unchanged; a call that raises is not recorded. A non-blocking call returns its
    Work wrapped so that ``.wait()`` also records ``after``.

    Args:
        max_values: record a call's values (``before``/``after``) only when they hold
            at most this many numbers; above that only shapes, dtype and sizes.

    Yields:
        A list that fills with :class:`TraceEvent` in call order.

    Raises:
        ValueError: ``max_values`` is not a whole number, 0 or more.

    Example:
        >>> def step():                                        # doctest: +SKIP
        ...     with record() as events:
        ...         dist.all_reduce(torch.tensor([float(dist.get_rank())]))
        ...     return events
        >>> launch(step, world_size=2).returns[1][0].after      # doctest: +SKIP
        [1.0]
    """
    whole("max_values", max_values, least=0, fix="max_values=0 keeps shapes only")
    import torch.distributed as dist

    recorder = _Recorder([], max_values)
    if not _ACTIVE:
        for name in OPS:
            original = getattr(dist, name, None)
            if original is not None:
                _ORIGINALS[name] = original
                setattr(dist, name, _traced(name, original))
    _ACTIVE.append(recorder)
    try:
        yield recorder.events
    finally:
        _ACTIVE.remove(recorder)
        if not _ACTIVE:
            for name, original in _ORIGINALS.items():
                setattr(dist, name, original)
            _ORIGINALS.clear()


# ------------------------------------------------------------------ plain data
