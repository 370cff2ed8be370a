"""What the node check (:mod:`workshop.instructor.check_node`) finds: the steps it has,
each step's result, the whole report, and the settings of its training step. The
steps (``check_steps.py``) and the verdict (``check_node.py``) both read these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["STEPS", "CheckReport", "CheckStep", "TrainSettings"]

PASS, FAILED, SKIPPED = "PASS", "FAILED", "SKIPPED"
#: The steps, in the order they run; the names ``--skip`` takes.
STEPS = ("doctor", "gpu-tests", "launch", "nccl", "compile", "train", "notebooks")


@dataclass
class CheckStep:
    """What one step found.

    Attributes:
        name: the step, one of :data:`STEPS`.
        status: "PASS", "FAILED" or "SKIPPED".
        seconds: how long it ran.
        summary: one line: the figures, why it was skipped, or what went wrong.
        fix: for a failure, what to do about it.
        figures: the measurements, for the JSON file.
    """

    name: str
    status: str
    seconds: float = 0.0
    summary: str = ""
    fix: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    """Every step's result, and where and how long the check ran."""

    host: str
    steps: list[CheckStep]
    seconds: float = 0.0

    @property
    def failed(self) -> list[CheckStep]:
        """The steps that failed, in order."""
        return [s for s in self.steps if s.status == FAILED]

    @property
    def exit_status(self) -> int:
        """0 when nothing failed, else 1."""
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as ``--json`` writes it."""
        return {
            "host": self.host,
            "ready": not self.failed,
            "exit_status": self.exit_status,
            "seconds": self.seconds,
            "steps": [asdict(s) for s in self.steps],
        }


@dataclass(frozen=True)
class TrainSettings:
    """What the ``train`` step runs: options of ``python -m workshop.bench train``."""

    model: str = "resnet50"
    batch_size: int | None = None  # the benchmark's default: 256 on a GPU
    image_size: int = 224
    steps: int = 30
    warmup: int = 5
    amp: str = "bf16"
    channels_last: bool = True

    def args(self) -> list[str]:
        """The benchmark's command-line options.

        Example:
            >>> TrainSettings(model="smallcnn", steps=3).args()[:6]
            ['--model', 'smallcnn', '--image-size', '224', '--steps', '3']
        """
        args = ["--model", self.model, "--image-size", str(self.image_size)]
        args += ["--steps", str(self.steps), "--warmup", str(self.warmup)]
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size)]
        args += ["--amp", self.amp]
        return args + (["--channels-last"] if self.channels_last else [])
