"""What ``calibrate`` measured, as a record the planner reads.

:class:`Calibration` holds one machine's figures, gives them as GPU and Network
records (:meth:`Calibration.gpu`, :meth:`Calibration.network`), and is saved and read
back as JSON, every field checked (:func:`load_calibration`).
:mod:`workshop.planner.calibrating` measures it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .hardware import GPU, Network

__all__ = [
    "CALIBRATION_KIND",
    "FAMILIES",
    "VERSION",
    "Calibration",
    "calibration_from",
    "load_calibration",
]

#: What the JSON file says it is, and the layout of its fields.
CALIBRATION_KIND = "workshop.planner calibration"
VERSION = 2
#: The families of operations calibrate() times at the model's shape.
FAMILIES = ("norm", "activation", "residual", "loss", "attention", "optimizer")


# --- the record ---------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` measured on one machine.

    Attributes:
        processor: the CPU's model name, or the GPU's name.
        device, precision: "cpu" or "cuda"; "fp32" or "bf16".
        threads: compute threads the CPU figures were measured with.
        memory_gb: the device's memory (on a CPU the memory available).
        matmul_points: ``((m, n, k, FLOP/s), ...)``, smallest FLOPs first.
        operation_points: ``((family, rate), ...)``, forward and backward, counted
            as the formula sheet counts them.
        memory_gbs, memory_bytes: GB/s of ``c = a + b``, and one tensor's bytes.
        launch_s: seconds of one add on a one-element tensor.
        allreduce_backend, allreduce_ranks: "gloo" or "nccl", on this machine.
        busbw_points: ``((bytes, GB/s), ...)`` ascending, nccl-tests' busbw.
        allreduce_small_s: seconds of the smallest all-reduce.
        torch_version, host, created: what measured it, where, when.
    """

    processor: str
    device: str
    precision: str
    threads: int
    memory_gb: float
    matmul_points: tuple[tuple[int, int, int, float], ...]
    operation_points: tuple[tuple[str, float], ...]
    memory_gbs: float
    memory_bytes: int
    launch_s: float
    allreduce_backend: str
    allreduce_ranks: int
    busbw_points: tuple[tuple[int, float], ...]
    allreduce_small_s: float
    torch_version: str
    host: str
    created: str

    @property
    def name(self) -> str:
        """``"calibrated: <CPU model or GPU name>"``."""
        return f"calibrated: {self.processor}"

    @property
    def best_flops(self) -> float:
        """The fastest matrix product measured, FLOP/s."""
        return max(p[3] for p in self.matmul_points)

    @property
    def alpha(self) -> float:
        """Latency of one message: the smallest all-reduce over its ring's
        ``2 (n - 1)`` messages (Thakur, Rabenseifner and Gropp, 2005)."""
        return self.allreduce_small_s / max(1, 2 * (self.allreduce_ranks - 1))

    def _where(self) -> str:
        return (
            f"measured by python -m workshop.planner calibrate on {self.host}, "
            f"{self.created}, torch {self.torch_version}"
        )

    def gpu(self) -> GPU:
        """This machine as the planner's GPU record, its fastest measured product
        the peak of both precisions."""
        where = self._where()
        threads = f", {self.threads} threads" if self.device == "cpu" else ""
        best = self.best_flops / 1e12
        return GPU(
            self.name,
            memory_gb=self.memory_gb,
            bf16_tflops=best,
            fp32_tflops=best,
            source=f"{where}: the fastest {self.precision} product{threads}, used "
            "as the peak of both precisions",
            matmul_bf16_tflops=best if self.precision == "bf16" else None,
            matmul_source=f"{where}{threads}" if self.precision == "bf16" else "",
            memory_gbs=self.memory_gbs,
            memory_source=f"{where}: c = a + b on {self.memory_bytes:,} B tensors, "
            "bytes read + written",
            launch_s=self.launch_s,
            matmul_points=self.matmul_points,
            matmul_precision=self.precision,
            operation_rates=self.operation_points,
        )

    def network(self) -> Network:
        """The all-reduce figures as the planner's network record, both links alike
        (the ranks shared this machine)."""
        top = self.busbw_points[-1][1]
        return Network(
            self.name,
            intra_node_gbs=top,
            inter_node_gbs=top,
            alpha_intra=self.alpha,
            alpha_inter=self.alpha,
            source=f"{self._where()}: {self.allreduce_backend} all-reduce on "
            f"{self.allreduce_ranks} ranks of this machine, busbw by size; "
            "between nodes taken as within",
            busbw_intra=self.busbw_points,
            busbw_inter=self.busbw_points,
        )

    def summary(self) -> str:
        """The figures in a few lines of at most 88 columns."""
        threads = f", {self.threads} thread{'s' * (self.threads > 1)}"
        lines = [
            f"{self.name}",
            f"  {self.device}{threads if self.device == 'cpu' else ''}, "
            f"{self.precision} products, torch {self.torch_version}, {self.host}",
            f"  matrix products ({len(self.matmul_points)}):"
            f"{'m x n x k':>24}{'GFLOP/s':>12}",
        ]
        for m, n, k, rate in self.matmul_points:
            lines.append(f"{'':<26}{f'{m} x {n} x {k}':>24}{rate / 1e9:>12,.1f}")
        for family, rate in self.operation_points:
            unit = "GFLOP/s" if family == "attention" else "GB/s"
            what = "one step" if family == "optimizer" else "forward + backward"
            label = f"{family} ({what})"
            lines.append(f"  {label:<50}{rate / 1e9:>12,.1f} {unit}")
        lines += [
            f"  memory: c = a + b, {self.memory_bytes / 1e6:,.0f} MB tensors: "
            f"{self.memory_gbs:,.1f} GB/s (read + written)",
            f"  one small op (add of 1 element): {self.launch_s * 1e6:,.1f} us",
            f"  all-reduce, {self.allreduce_backend} on {self.allreduce_ranks} ranks:"
            f"{'bytes':>13}{'busbw GB/s':>14}",
        ]
        for size, bw in self.busbw_points:
            lines.append(f"{'':<40}{size:>13,}{bw:>14.3f}")
        lines.append(
            f"  latency of a small message (alpha): {self.alpha * 1e6:,.1f} us"
        )
        return "\n".join(line[:88] for line in lines)

    def as_data(self) -> dict[str, Any]:
        """The record as plain data for JSON, kind and version first."""
        return {"kind": CALIBRATION_KIND, "version": VERSION, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        """Write the record as JSON; return the path."""
        path = Path(path)
        path.write_text(json.dumps(self.as_data(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """A record :meth:`save` wrote (:func:`load_calibration`)."""
        return load_calibration(path)


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(
        f"{path} is not a calibration: {why}; write one with "
        "python -m workshop.planner calibrate --out FILE"
    )


def _positive(value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _points(path: Path, name: str, raw: Any, width: int) -> tuple:
    """``raw`` as points of ``width`` positive numbers, the leading ones whole."""
    if not isinstance(raw, list) or not raw:
        raise _bad(path, f"{name} is {raw!r}, not a non-empty list of points")
    points = []
    for point in raw:
        if (
            not isinstance(point, list)
            or len(point) != width
            or not all(_positive(v) for v in point)
            or not all(isinstance(v, int) for v in point[:-1])
        ):
            raise _bad(
                path,
                f"{name} holds {point!r}, not {width - 1} whole numbers and a rate, "
                "all above 0",
            )
        points.append((*point[:-1], float(point[-1])))
    return tuple(points)


def load_calibration(path: str | Path) -> Calibration:
    """The :class:`Calibration` saved in ``path``, every field checked.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file that is not a calibration, naming what is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no calibration file {path}; write one with python -m workshop.planner "
            "calibrate --out FILE"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(path, f"not JSON ({exc})") from None
    return calibration_from(data, path)


def calibration_from(data: Any, path: Path | str) -> Calibration:
    """The :class:`Calibration` of ``data`` (:meth:`Calibration.as_data` read back),
    every field checked; ``path`` names where it came from.

    Raises:
        ValueError: data that is not a calibration, naming what is wrong.
    """
    path = Path(path)
    if not isinstance(data, dict) or data.get("kind") != CALIBRATION_KIND:
        raise _bad(path, f"its kind is not {CALIBRATION_KIND!r}")
    if data.get("version") != VERSION:
        raise _bad(path, f"version {data.get('version')!r}, this reads {VERSION}")
    names = {f.name for f in fields(Calibration)}
    given = set(data) - {"kind", "version"}
    if given != names:
        missing, extra = sorted(names - given), sorted(given - names)
        raise _bad(path, f"fields missing {missing}, unknown {extra}")
    data = {k: data[k] for k in names}
    for name in ("memory_gb", "memory_gbs", "launch_s", "allreduce_small_s"):
        if not _positive(data[name]):
            raise _bad(path, f"{name} is {data[name]!r}, not a number above 0")
    for name in ("threads", "memory_bytes", "allreduce_ranks"):
        if not _positive(data[name]) or not isinstance(data[name], int):
            raise _bad(path, f"{name} is {data[name]!r}, not a whole number above 0")
    for name, allowed in (
        ("device", ("cpu", "cuda")),
        ("precision", ("fp32", "bf16")),
        ("allreduce_backend", ("gloo", "nccl")),
    ):
        if data[name] not in allowed:
            raise _bad(path, f"{name} is {data[name]!r}, not one of {allowed}")
    for name in ("processor", "torch_version", "host", "created"):
        if not isinstance(data[name], str):
            raise _bad(path, f"{name} is {data[name]!r}, not text")
    data["matmul_points"] = _points(path, "matmul_points", data["matmul_points"], 4)
    data["busbw_points"] = _points(path, "busbw_points", data["busbw_points"], 2)
    families = data["operation_points"]
    if not isinstance(families, list) or not all(
        isinstance(p, list) and len(p) == 2 and p[0] in FAMILIES and _positive(p[1])
        for p in families
    ):
        raise _bad(
            path,
            f"operation_points is {families!r}, not a list of [family, rate above 0] "
            f"with a family of {FAMILIES}",
        )
    data["operation_points"] = tuple((f, float(r)) for f, r in families)
    sizes = [p[0] for p in data["busbw_points"]]
    if sizes != sorted(set(sizes)):
        raise _bad(path, f"busbw_points' sizes {sizes} do not ascend")
    return Calibration(**data)
