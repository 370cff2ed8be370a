"""Is the split model the same model? :func:`check_split` compares a
:class:`~workshop.lessons.notebook01_pipeline.TwoStageModel` with an unsplit copy of it.

Used by notebook 01, section 4, as notebook 04 checks tensor parallelism with
:func:`workshop.parallel.check_tensor_parallel`: same weights, so the same outputs
and, through the pipeline of micro-batches, the same gradients, within float32
rounding::

    check = check_split(model, x, y, micro_batches=4, loss_fn=nn.CrossEntropyLoss())
    check.ok, check.bitwise_outputs, check.gradient_difference
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

# The forward pass of the split model runs the very same operations as the unsplit
# one, so its outputs agree bit for bit on devices of one kind. The gradients of a
# pipeline are sums over micro-batches, each micro-batch's loss weighted by its share:
# the same numbers added in another order, so they agree within RELATIVE_TOLERANCE.
from ..training.precision import RELATIVE_TOLERANCE
from .notebook01_devices import LossFn
from .notebook01_pipeline import TwoStageModel, _stages_of, pipeline_forward_backward

__all__ = ["SplitCheck", "check_split"]


@dataclass
class SplitCheck:
    """What :func:`check_split` found, as plain data.

    Attributes:
        micro_batches: pieces the pipeline cut the batch into.
        output_difference: largest absolute difference of the outputs.
        gradient_difference: largest absolute difference of any gradient.
        loss_difference: difference of the two losses of the whole batch.
        tolerance: the difference allowed (:data:`RELATIVE_TOLERANCE` times the
            largest number compared, at least 1).
        bitwise_outputs: the outputs are equal bit for bit.
        bitwise_gradients: every gradient is equal bit for bit.
        ok: every difference is within ``tolerance``.
    """

    micro_batches: int
    output_difference: float
    gradient_difference: float
    loss_difference: float
    tolerance: float
    bitwise_outputs: bool
    bitwise_gradients: bool
    ok: bool

    def summary(self) -> str:
        """One line of at most 88 columns, stable from run to run."""

        def how(bitwise: bool) -> str:
            return "equal bit for bit" if bitwise else "differ by rounding"

        pieces = "micro-batch" if self.micro_batches == 1 else "micro-batches"
        return (
            f"{self.micro_batches:2} {pieces:13}: outputs {how(self.bitwise_outputs)}, "
            f"gradients {how(self.bitwise_gradients)}; ok: {self.ok}"
        )


def check_split(
    model: TwoStageModel,
    batch: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: int,
    loss_fn: LossFn,
) -> SplitCheck:
    """Compare a model split across two devices with the same model unsplit.

    Builds the unsplit model from copies of the stages (the same weights) on the
    first stage's device, then compares (1) the outputs of one forward pass over
    the whole batch, and (2) the gradients of
    :func:`~workshop.lessons.notebook01_pipeline.pipeline_forward_backward` with
    ``micro_batches`` against one backward pass of the unsplit model over the whole
    batch, parameter by parameter, and the two losses.

    The model's gradients are set to None first, and are left holding the
    pipeline's gradients.

    Args:
        model: a :class:`TwoStageModel` (stages without BatchNorm, whose per
            micro-batch statistics would make the gradients differ).
        batch: inputs, samples along dimension 0.
        targets: one per sample.
        micro_batches: pieces to cut the batch into, 1 .. len(batch).
        loss_fn: ``loss_fn(outputs, targets)`` returning the mean loss.

    Returns:
        A :class:`SplitCheck`.

    Raises:
        ValueError: ``batch`` and ``targets`` of different lengths, an empty batch,
            or ``micro_batches`` outside 1 .. len(batch).
        TypeError: ``model`` has no ``stages`` and ``devices``.

    Example:
        >>> model = TwoStageModel(["cpu", "cpu"], in_features=8, hidden=16)
        >>> x, y = torch.randn(8, 8), torch.randint(10, (8,))
        >>> check_split(model, x, y, 4, nn.CrossEntropyLoss()).ok
        True
    """
    stages, devices = _stages_of(model)
    if len(batch) == 0 or len(batch) != len(targets):
        raise ValueError(
            f"check_split got {len(batch)} inputs and {len(targets)} targets; pass "
            "a batch of one target per input, at least one sample"
        )
    # The same weights, one device: the model as it would run without the split.
    whole = nn.Sequential(*(copy.deepcopy(s) for s in stages)).to(devices[0])
    with torch.no_grad():
        split_out = model(batch).to("cpu")
        whole_out = whole(batch.to(devices[0])).to("cpu")

    model.zero_grad(set_to_none=True)
    timeline = pipeline_forward_backward(model, batch, targets, micro_batches, loss_fn)
    loss = loss_fn(whole(batch.to(devices[0])), targets.to(devices[0]))
    loss.backward()
    pairs = [
        (p.grad.to("cpu"), q.grad.to("cpu"))
        for p, q in zip(model.parameters(), whole.parameters(), strict=True)
    ]
    pairs.append((torch.tensor([timeline.loss]), torch.tensor([loss.item()])))

    def largest_difference(items: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        return max(float((a - b).abs().max()) for a, b in items)

    largest = max(
        float(t.abs().max()) for pair in [*pairs, (split_out, whole_out)] for t in pair
    )
    tolerance = RELATIVE_TOLERANCE * max(1.0, largest)
    outputs = largest_difference([(split_out, whole_out)])
    gradients = largest_difference(pairs[:-1])
    losses = largest_difference(pairs[-1:])
    return SplitCheck(
        micro_batches=micro_batches,
        output_difference=outputs,
        gradient_difference=gradients,
        loss_difference=losses,
        tolerance=tolerance,
        bitwise_outputs=torch.equal(split_out, whole_out),
        bitwise_gradients=all(torch.equal(a, b) for a, b in pairs[:-1]),
        ok=max(outputs, gradients, losses) <= tolerance,
    )
