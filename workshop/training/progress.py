"""What the training loop reports: progress lines while it runs, a History at the end.

Plain lines, never rewritten in place (a carriage-return bar becomes one enormous line
in a Slurm log): at most one every ``every`` seconds, and one per epoch::

    epoch 1/3  step 40/90  loss 0.512  1234 samples/s
    epoch 1/3  loss 0.498  accuracy 0.861  eval accuracy 0.903  1210 samples/s  1.2 s

For output that is the same at every run (a notebook's checked cells), pass
``every=None`` and ``show_speed=False``; a :class:`History` prints no times unless
asked.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["History", "Progress"]


class Progress:
    """Prints what the training loop is doing, at a bounded rate; give one to
    :func:`workshop.training.loop.train` as ``progress=``.

    Args:
        every: seconds between two step lines within an epoch; None prints epoch-end
            lines only (the same lines at every run); 0 prints every step.
        show_speed: add samples/s (and the epoch's seconds) to the lines.
        enabled: print at all; None prints on global rank 0 only.
        stream: where lines go; None: ``sys.stdout`` at the time of printing.
        clock: seconds, for tests; ``time.monotonic`` by default.

    Raises:
        ValueError: ``every`` is negative, or not a number (a string, True).

    Example:
        >>> progress = Progress(every=None, show_speed=False)
        >>> progress.start(epochs=2)
        >>> progress.epoch_end(1, loss=0.4321, accuracy=0.9)
        epoch 1/2  loss 0.432  accuracy 0.900
    """

    def __init__(
        self,
        every: float | None = 10.0,
        *,
        show_speed: bool = True,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        number = isinstance(every, (int, float)) and not isinstance(every, bool)
        if every is not None and not (number and every >= 0):
            raise ValueError(
                f"every={every!r} must be seconds >= 0, or None for epoch-end lines "
                "only; pass every=10, for example"
            )
        self.every, self.show_speed, self.enabled = every, show_speed, enabled
        self.stream, self._clock = stream, clock
        self._on = bool(enabled)
        self._epochs = 1
        self._steps: int | None = None
        self._last_time = 0.0
        self._last_samples = 0

    def start(self, epochs: int, steps_per_epoch: int | None = None) -> None:
        """Begin a run of ``epochs`` epochs (``steps_per_epoch`` None: unknown)."""
        if self.enabled is None:
            from ..env import rank_info

            self._on = rank_info().is_main
        else:
            self._on = bool(self.enabled)
        self._epochs, self._steps = epochs, steps_per_epoch
        self._last_time, self._last_samples = self._clock(), 0

    def due(self) -> bool:
        """True when a step line is due: cheap, so the loop waits for the GPU's loss
        only then."""
        return (
            self._on
            and self.every is not None
            and self._clock() - self._last_time >= self.every
        )

    def step(self, epoch: int, step: int, loss: float, samples: int) -> None:
        """Print a step line: ``step`` optimizer steps and ``samples`` so far in
        ``epoch`` (from 1), their mean ``loss``, the rate since the previous line."""
        now = self._clock()
        parts = [self._epoch_label(epoch), self._step_label(step), f"loss {loss:.3f}"]
        if self.show_speed and now > self._last_time:
            rate = (samples - self._last_samples) / (now - self._last_time)
            parts.append(f"{rate:.0f} samples/s")
        self._last_time, self._last_samples = now, samples
        self._print(parts)

    def epoch_end(
        self,
        epoch: int,
        loss: float,
        accuracy: float,
        eval_accuracy: float | None = None,
        samples_per_second: float | None = None,
        seconds: float | None = None,
    ) -> None:
        """Print an epoch's summary (``epoch`` from 1); speed and time only with
        ``show_speed``."""
        parts = [
            self._epoch_label(epoch),
            f"loss {loss:.3f}",
            f"accuracy {accuracy:.3f}",
        ]
        if eval_accuracy is not None:
            parts.append(f"eval accuracy {eval_accuracy:.3f}")
        if self.show_speed and samples_per_second is not None:
            parts.append(f"{samples_per_second:.0f} samples/s")
        if self.show_speed and seconds is not None:
            parts.append(f"{seconds:.1f} s")
        # The next epoch's first step line measures its rate and interval from here.
        self._last_time, self._last_samples = self._clock(), 0
        self._print(parts)

    def _epoch_label(self, epoch: int) -> str:
        return f"epoch {epoch}/{self._epochs}"

    def _step_label(self, step: int) -> str:
        return f"step {step}/{self._steps}" if self._steps else f"step {step}"

    def _print(self, parts: list[str]) -> None:
        if not self._on:
            return
        # flush: a batch job's stdout is a file, buffered in blocks of kilobytes, and
        # the log would show nothing for minutes.
        print("  ".join(parts), file=self.stream or sys.stdout, flush=True)

    def __repr__(self) -> str:
        return (
            f"Progress(every={self.every!r}, show_speed={self.show_speed!r}, "
            f"enabled={self.enabled!r})"
        )


@dataclass
class History:
    """What :func:`workshop.training.loop.train` measured, one entry per epoch.

    In a job the figures are the whole job's, the same on every rank. Two histories
    compare equal when they learned the same; times are left out of the comparison.

    Attributes:
        loss: mean training loss over the epoch's samples (while the model learned).
        accuracy: fraction of the epoch's training samples classified right.
        eval_accuracy: accuracy on ``eval_loader`` after each epoch; empty without.
        samples_per_second: training samples per second of the epoch.
        seconds: the epoch's training time (evaluation not included).
        steps: optimizer steps taken in all.
        compiled_steps: under ``train(compile=...)``, the steps (from 1) during
            which ``torch.compile`` compiled a graph.
        graphs: graphs compiled during those steps (one per DDP bucket).
        warmup_seconds: the time of those steps, compiling included.
        warmup_samples: the samples those steps trained on.
    """

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)
    samples_per_second: list[float] = field(default_factory=list, compare=False)
    seconds: list[float] = field(default_factory=list, compare=False)
    steps: int = 0
    compiled_steps: list[int] = field(default_factory=list, compare=False)
    graphs: int = field(default=0, compare=False)
    warmup_seconds: float = field(default=0.0, compare=False)
    warmup_samples: int = field(default=0, compare=False)

    @property
    def steady_samples_per_second(self) -> float | None:
        """Samples per second over every epoch, leaving out the steps that compiled
        (None when no time is left once they are out)."""
        seconds = sum(self.seconds) - self.warmup_seconds
        if not self.seconds or seconds <= 0:
            return None
        pairs = zip(self.samples_per_second, self.seconds, strict=True)
        samples = sum(rate * spent for rate, spent in pairs)
        return (samples - self.warmup_samples) / seconds

    def compile_summary(self) -> str:
        """One line on what compiling cost: the steps that compiled, the graphs, the
        warm-up time and the steady state's rate; "not compiled" otherwise."""
        if not self.compiled_steps:
            return "not compiled"
        steady = self.steady_samples_per_second
        rate = f"{steady:,.0f} samples/s" if steady is not None else "no steady state"
        steps = ", ".join(map(str, self.compiled_steps))
        return (
            f"compiled {self.graphs} graph{'s' if self.graphs != 1 else ''} in "
            f"step{'s' if len(self.compiled_steps) != 1 else ''} {steps} "
            f"({self.warmup_seconds:.1f} s); steady state {rate}"
        )

    @property
    def epochs(self) -> int:
        """Number of epochs recorded (a partial last one included)."""
        return len(self.loss)

    @property
    def final_loss(self) -> float | None:
        """Training loss of the last epoch (None before any)."""
        return self.loss[-1] if self.loss else None

    @property
    def final_accuracy(self) -> float | None:
        """Training accuracy of the last epoch (None before any)."""
        return self.accuracy[-1] if self.accuracy else None

    @property
    def final_eval_accuracy(self) -> float | None:
        """Evaluation accuracy after the last epoch (None without eval_loader)."""
        return self.eval_accuracy[-1] if self.eval_accuracy else None

    def table(self, times: bool = False) -> str:
        """The history as a text table, one row per epoch.

        Args:
            times: add samples/s and seconds (not the same at every run).

        Returns:
            The table, without a trailing newline.

        Example:
            >>> print(History(loss=[0.5], accuracy=[0.9], steps=3).table())
            epoch   loss  accuracy
                1  0.500     0.900
        """
        columns: list[tuple[str, list[float], str]] = [
            ("loss", self.loss, ".3f"),
            ("accuracy", self.accuracy, ".3f"),
        ]
        if self.eval_accuracy:
            columns.append(("eval accuracy", self.eval_accuracy, ".3f"))
        if times:
            columns.append(("samples/s", self.samples_per_second, ".0f"))
            columns.append(("seconds", self.seconds, ".2f"))
        header = ["epoch"] + [name for name, _, _ in columns]
        rows = [
            [str(epoch + 1)]
            + [format(values[epoch], spec) for _, values, spec in columns]
            for epoch in range(self.epochs)
        ]
        widths = [
            max(len(row[i]) for row in [header, *rows]) for i in range(len(header))
        ]
        return "\n".join(
            "  ".join(
                cell.rjust(width) for cell, width in zip(row, widths, strict=True)
            )
            for row in [header, *rows]
        )

    def __repr__(self) -> str:
        # No times: a notebook that shows a History must show the same at every run.
        def rounded(value: float | None) -> str:
            return "None" if value is None else f"{value:.4f}"

        return (
            f"History(epochs={self.epochs}, steps={self.steps}, "
            f"final_loss={rounded(self.final_loss)}, "
            f"final_accuracy={rounded(self.final_accuracy)}, "
            f"final_eval_accuracy={rounded(self.final_eval_accuracy)})"
        )
