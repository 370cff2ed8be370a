"""Watch a running cell or job: CPU, host memory, disk and network, and the GPUs, over
time, beside the training's steps (notebook 05, "Watching a running job")::

    with Monitor(interval=0.2) as mon:
        with mon.phase("decode in the loop"):
            train(model, loader, progress=mon.progress())
    mon.plot()

A daemon thread samples Linux's counters (:mod:`workshop.machine.monitor_probes`) and
the GPUs every ``interval`` seconds. In a batch job, run it in the background::

    python -m workshop monitor --output monitor-$SLURM_JOB_ID.csv --seconds 3600 &

It writes a CSV row per sample as it goes (a killed job keeps its rows) and stops
after ``--seconds``, at SIGTERM or Ctrl-C; ``plot_monitor(load_samples(path))``
draws it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .._cli import above_zero, writable_file
from ..training.progress import Progress
from .monitor_plot import COLUMNS, Sample, plot_monitor, sample_row, step_gaps
from .monitor_probes import SMI_TIMEOUT, Gpus, difference, read_counters, scope_line

__all__ = ["Monitor", "add_arguments", "run_from_args"]

#: Smallest sampling interval: below it the sampler itself loads a core.
MIN_INTERVAL = 0.05


class Monitor:
    """Samples this machine in a background thread while a cell or a job runs.

    A context manager: sampling starts on entry and always stops on exit. Mark steps
    with :meth:`step` (or give :meth:`progress` to ``workshop.train``), name stretches
    with :meth:`phase`; :meth:`plot` draws it all, :meth:`table` sums up each phase.

    Args:
        interval: seconds between samples, at least ``MIN_INTERVAL`` (0.05); figures
            are averages over each interval (a sample may come late while Python code
            holds the GIL, and still averages since the one before).
        gpu: read the GPUs if there are any; False skips them.

    Attributes:
        samples: the :class:`Sample` list, in time order.
        steps: seconds since the start at which each step was marked.
        phases: (name, start, end) of each :meth:`phase`, in seconds since the start.
        gpu_source: "NVML", "nvidia-smi" or "none".

    Raises:
        ValueError: ``interval`` is not a number of seconds >= 0.05.
        RuntimeError: from :meth:`start`: not Linux (no ``/proc``), or started already.

    Example:
        >>> with Monitor(interval=0.1) as mon:
        ...     mon.step()
        >>> len(mon.steps)
        1
    """

    def __init__(self, interval: float = 0.2, *, gpu: bool = True) -> None:
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not interval >= MIN_INTERVAL
            or math.isinf(interval)
        ):
            raise ValueError(
                f"interval={interval!r} must be seconds between samples, at least "
                f"{MIN_INTERVAL} (faster sampling loads the CPU it measures); pass "
                "interval=0.2, for example"
            )
        self.interval = float(interval)
        self.samples: list[Sample] = []
        self.steps: list[float] = []
        self.phases: list[tuple[str, float, float]] = []
        self._gpu_wanted = gpu
        self.gpu_source = "none"
        self._t0: float | None = None
        self._end: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> Monitor:
        """Start sampling in a daemon thread; returns the monitor."""
        if self._thread is not None:
            raise RuntimeError(
                "this Monitor was started already; make a new Monitor(...) for a new "
                "recording"
            )
        counters = read_counters()  # fails here, in the caller, if not Linux
        gpus = Gpus(self._gpu_wanted)
        self.gpu_source = gpus.source
        self._t0 = time.monotonic()
        self._thread = threading.Thread(
            target=self._sample_loop,
            args=(counters, self._t0, gpus),
            name="workshop-monitor",
            daemon=True,  # never keeps a kernel or a job's Python from exiting
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and wait for the thread (a few seconds at most).

        Raises:
            RuntimeError: the sampler failed (the message says how), or its thread did
                not stop in time.
        """
        if self._thread is None:
            return
        self._stop.set()
        if self._end is None:
            self._end = self.now()
        # A sample takes one nvidia-smi query at most, killed after SMI_TIMEOUT.
        self._thread.join(timeout=self.interval + SMI_TIMEOUT + 3)
        if self._thread.is_alive():
            raise RuntimeError(
                "the monitor's thread did not stop within "
                f"{self.interval + SMI_TIMEOUT + 3:.0f} s; it is a daemon thread and "
                "ends with this Python process"
            )
        if self._error is not None:
            error = self._error
            raise RuntimeError(f"the monitor stopped sampling: {error}") from error

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        except RuntimeError:
            if exc is None:  # else the body's own error is the one to see
                raise

    def now(self) -> float:
        """Seconds since :meth:`start` (0.0 before it)."""
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def step(self) -> None:
        """Mark that one training step ended now (call it once per step)."""
        self.steps.append(self.now())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Name the stretch its body runs (``with mon.phase("workers"):``), shaded."""
        start = self.now()
        try:
            yield
        finally:
            self.phases.append((str(name), start, self.now()))

    def progress(self, every: float | None = None, **options) -> Progress:
        """A Progress for ``workshop.train(..., progress=mon.progress())`` that marks
        every step here, when the loop finished issuing it.

        Args:
            every: as :class:`workshop.training.progress.Progress`; None prints only
                epoch-end lines.
            **options: more of Progress's arguments (``show_speed``, ``enabled``).
        """
        monitor = self

        class _Marking(Progress):
            def due(self) -> bool:  # train() asks this once after every step
                monitor.step()
                return super().due()

        return _Marking(every, **options)

    def table(self) -> str:
        """Each phase (or the whole recording): seconds, steps, median ms per step,
        mean CPU % of the machine and of this process, and mean GPU % if any, in a
        table at most 88 characters wide (a long phase name is cut).

        Example:
            >>> print(mon.table())  # doctest: +SKIP
        """
        phases = self.phases or [("whole recording", 0.0, self._end or self.now())]
        gpu = any(s.gpu_percent for s in self.samples)
        header = ["phase", "seconds", "steps", "ms/step", "CPU %", "process CPU %"]
        rows = [header + (["GPU %"] if gpu else [])]
        gaps = step_gaps(self.steps, self.phases)
        for name, start, end in phases:
            inside = [s for s in self.samples if start <= s.time <= end]
            times = sorted(1000 * g for t, g in gaps if start <= t <= end)
            row = [
                name,
                f"{end - start:.1f}",
                str(sum(start <= t <= end for t in self.steps)),
                f"{times[len(times) // 2]:.1f}" if times else "-",
                _mean([s.cpu_percent for s in inside]),
                _mean([s.process_cpu_percent for s in inside]),
            ]
            if gpu:
                row.append(_mean([_avg(s.gpu_percent) for s in inside]))
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        # At most 88 columns: a long phase name is cut, its end marked "...".
        over = sum(widths) + 2 * (len(widths) - 1) - 88
        if over > 0:
            widths[0] -= over
            for r in rows:
                if len(r[0]) > widths[0]:
                    r[0] = r[0][: widths[0] - 3] + "..."
        return "\n".join(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        )

    def plot(self, title: str = ""):
        """The recording drawn by :func:`workshop.machine.monitor_plot.plot_monitor`."""
        return plot_monitor(self.samples, self.steps, self.phases, title=title)

    def _sample_loop(self, last: dict[str, float], t0: float, gpus: Gpus) -> None:
        last_time = t0
        try:
            while not self._stop.wait(self.interval):
                counters = read_counters()
                now = time.monotonic()
                sample = difference(last, counters, now - last_time, now - t0)
                util, memory = gpus.read()
                if util:
                    sample = sample.with_gpus(util, memory)
                self.samples.append(sample)
                last, last_time = counters, now
        except Exception as e:  # kept for stop() to raise in the caller's thread
            self._error = e
        finally:
            gpus.close()

    def __repr__(self) -> str:
        return (
            f"Monitor(interval={self.interval:g}, samples={len(self.samples)}, "
            f"steps={len(self.steps)}, gpu_source={self.gpu_source!r})"
        )


def _mean(values: Sequence[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{sum(values) / len(values):.0f}" if values else "-"


def _avg(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``python -m workshop monitor``'s options to ``parser``."""
    parser.add_argument(
        "--interval",
        type=above_zero("--interval 1"),
        default=1.0,
        help="seconds between samples (default 1)",
    )
    parser.add_argument(
        "--seconds",
        type=above_zero("--seconds 600"),
        default=3600.0,
        help="stop after this long (default 3600)",
    )
    parser.add_argument(
        "--output",
        type=writable_file("--output monitor.csv"),
        default=Path("monitor.csv"),
        help="CSV file to write (default monitor.csv)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Sample until ``args.seconds`` pass, SIGTERM or Ctrl-C; a CSV row per sample.

    Args:
        args: ``interval``, ``seconds`` and ``output``, as :func:`add_arguments` adds.

    Returns:
        0 (stopped by time or signal), 2 on a bad argument (after saying why).

    Example:
        >>> run_from_args(argparse.Namespace(interval=0.1, seconds=0.5,
        ...               output=Path("m.csv")))  # doctest: +SKIP
    """
    if not args.seconds > 0:
        print(
            f"workshop monitor: --seconds {args.seconds} must be > 0, e.g. 600",
            file=sys.stderr,
        )
        return 2
    try:
        monitor = Monitor(args.interval)
    except ValueError as e:
        print(f"workshop monitor: {e}", file=sys.stderr)
        return 2

    def stop(signum, frame):  # Slurm's scancel and the job's end send SIGTERM
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    written = 0
    try:
        with open(args.output, "w", buffering=1) as out, monitor:
            out.write(",".join(COLUMNS) + "\n")
            print(
                f"workshop monitor: sampling every {args.interval:g} s into "
                f"{args.output} (GPUs: {monitor.gpu_source})",
                flush=True,
            )
            scope = scope_line()
            if scope:
                print(f"workshop monitor: {scope}", flush=True)
            deadline = time.monotonic() + args.seconds
            with contextlib.suppress(KeyboardInterrupt):
                while time.monotonic() < deadline and monitor.running:
                    time.sleep(
                        min(args.interval, max(0.0, deadline - time.monotonic()))
                    )
                    for sample in monitor.samples[written:]:
                        out.write(",".join(sample_row(sample)) + "\n")
                        written += 1
            monitor.stop()  # then the samples taken since the last write
            for sample in monitor.samples[written:]:
                out.write(",".join(sample_row(sample)) + "\n")
                written += 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"workshop monitor: {written} samples in {args.output}", flush=True)
    return 0
