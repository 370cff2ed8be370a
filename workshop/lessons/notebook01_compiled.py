"""The compiled path (notebook 01 §5, notebook 02 §7): when ``torch.compile`` pays
off inside a job's time limit, and how DDP cuts the compiled graph at its buckets.

The training itself is :func:`workshop.train` with ``compile=``; this module holds
the arithmetic of the break-even and the worker notebook 02 launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..training.progress import History

__all__ = [
    "BreakEven",
    "break_even",
    "compile_backend",
    "compile_break_even",
    "ddp_compiled_graphs",
]


@dataclass(frozen=True)
class BreakEven:
    """Compiling against eager, in seconds: what the warm-up costs and each step
    saves.

    Attributes:
        warmup_seconds: the time compiling adds before the steady state.
        eager_step: seconds of one eager step.
        compiled_step: seconds of one compiled step in the steady state.
        where: the machine and model the figures come from.
    """

    warmup_seconds: float
    eager_step: float
    compiled_step: float
    where: str

    @property
    def steps(self) -> float | None:
        """Steps after which the compiled run has caught up: warm-up / (eager step -
        compiled step); None when the compiled step is not faster (it never does)."""
        saved = self.eager_step - self.compiled_step
        return self.warmup_seconds / saved if saved > 0 else None

    @property
    def speedup(self) -> float:
        """How many times as fast as eager a compiled step runs (below 1: slower)."""
        # break_even refuses a step time that is not positive; this guards a
        # BreakEven made by hand.
        if self.compiled_step <= 0:
            return float("inf")
        return self.eager_step / self.compiled_step

    def summary(self) -> str:
        """Three lines: the steps' times; where compiling pays off, or that it does
        not; and how many times as fast as eager the compiled step runs. All from
        the figures: on a CPU compiled may be faster or slower than eager."""
        head = (
            f"{self.where}: eager {self.eager_step * 1e3:.1f} ms a step, compiled "
            f"{self.compiled_step * 1e3:.1f} ms"
        )
        ratio = f"  compiled is {self.speedup:.2f}x as fast as eager here"
        steps = self.steps
        if steps is None:
            return (
                f"{head}\n  compiled is not faster here: the warm-up of "
                f"{self.warmup_seconds:.1f} s never pays off; train eager\n{ratio}"
            )
        return (
            f"{head}\n  the warm-up of {self.warmup_seconds:.1f} s pays off after "
            f"{steps:,.0f} steps, {steps * self.eager_step:,.0f} s of eager training"
            f"\n{ratio}"
        )


def break_even(
    warmup_seconds: float, eager_step: float, compiled_step: float, where: str
) -> BreakEven:
    """When compiling pays off: warm-up / (eager step - compiled step) steps.

    Args:
        warmup_seconds: the time compiling adds (>= 0).
        eager_step: seconds of one eager step (> 0).
        compiled_step: seconds of one compiled step (> 0).
        where: the machine and model, printed first.

    Returns:
        A :class:`BreakEven`; its ``steps`` is None when compiled is not faster.

    Raises:
        ValueError: a negative warm-up or a step time that is not positive.

    Example:
        >>> round(break_even(37.0, 0.064, 0.046, "H100").steps)
        2056
    """
    if warmup_seconds < 0 or eager_step <= 0 or compiled_step <= 0:
        raise ValueError(
            f"break_even needs warmup_seconds >= 0 and step times > 0, got "
            f"{warmup_seconds}, {eager_step}, {compiled_step}; pass seconds"
        )
    return BreakEven(warmup_seconds, eager_step, compiled_step, where)


def compile_break_even(eager: History, compiled: History, where: str) -> BreakEven:
    """The break-even of two runs of :func:`workshop.train` on the same data, one
    eager and one with ``compile=``: the eager run's mean step, the compiled run's
    steady step (leaving out the steps that compiled), and the warm-up those steps
    took beyond a steady step each.

    Raises:
        ValueError: ``compiled`` did not compile, or has no step left once the steps
            that compiled are out.
    """
    compiling = len(compiled.compiled_steps)
    steady = compiled.steps - compiling
    if not compiling or steady <= 0:
        raise ValueError(
            f"compile_break_even needs a compiled run with steady steps, got "
            f"{compiled.steps} steps of which {compiling} compiled; train it with "
            "compile=True and more steps"
        )
    eager_step = sum(eager.seconds) / eager.steps
    compiled_step = (sum(compiled.seconds) - compiled.warmup_seconds) / steady
    warmup = max(compiled.warmup_seconds - compiling * compiled_step, 0.0)
    return break_even(warmup, eager_step, max(compiled_step, 1e-9), where)


def compile_backend() -> tuple[str, str | None]:
    """The backend notebook 01's compiled run uses here, and why not inductor.

    Returns:
        ("inductor", None) where inductor compiles for this CPU (a tiny function
        compiled once, :func:`workshop.training.compiled.inductor_unavailable`);
        else ("aot_eager", the reason in one line): aot_eager traces and splits the
        graph as inductor does, so the warm-up and the recompilation still show,
        but it generates no code (no speed-up).
    """
    from ..training.compiled import inductor_unavailable

    why = inductor_unavailable()
    return ("aot_eager", why) if why else ("inductor", None)


class WideMLP(nn.Module):
    """Three hidden layers of 512 on the 16x16 digits: 2.6 MB of gradients, enough
    for several 1 MB buckets. A class of the workshop, not ``nn.Sequential``: under
    DDP, Dynamo compiles the wrapped module's forward only when its class is defined
    outside torch's own files."""

    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Linear(256, width), nn.Linear(width, width), nn.Linear(width, width)]
        )
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def ddp_compiled_graphs(bucket_cap_mb: float, backend: str = "aot_eager") -> tuple:
    """On each rank: :class:`WideMLP` under DDP with ``bucket_cap_mb``, trained 2
    steps through ``torch.compile(backend)``.

    Returns:
        (graphs compiled, DDP's buckets as planned in MiB, the gradients' MiB, the
        weights equal on every rank).
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..comm.bucket_plan import gradient_bytes, plan_buckets
    from ..training.data import digits
    from ..training.loop import train

    torch.manual_seed(0)
    model = WideMLP()
    sizes = gradient_bytes(model)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    data = digits()
    sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=64, sampler=sampler)
    history = train(
        ddp, loader, max_steps=2, progress=False, compile=backend, device="cpu"
    )
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(gathered[0], w) for w in gathered)
    # Under compile, torch takes no cap below 1 MB, and its first bucket holds 1 MB.
    planned = [b / 2**20 for b in plan_buckets(sizes, bucket_cap_mb, 1.0)]
    return history.graphs, planned, sum(sizes) / 2**20, same
