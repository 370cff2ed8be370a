"""Small models, batches and gradient checks shared by the single-node lesson tests
(data parallelism by hand, and the pipeline)."""

from __future__ import annotations

import copy

import torch
from torch import nn

CPU2 = [torch.device("cpu")] * 2


def mlp(seed: int = 0) -> nn.Module:
    """A BatchNorm-free model: BatchNorm normalises each chunk on its own, so chunked
    gradients would differ from the whole batch's."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 5))


def batch(n: int = 10, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random inputs for :func:`mlp` and their class labels."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(5, (n,), generator=g)


def whole_batch_grads(model: nn.Module, x, y, loss_fn) -> tuple[list, float]:
    """Gradients and loss of one ordinary pass over the whole batch, on a copy."""
    ref = copy.deepcopy(model)
    loss = loss_fn(ref(x), y)
    loss.backward()
    return [p.grad.clone() for p in ref.parameters()], float(loss.detach())


def assert_same_grads(model: nn.Module, expected: list) -> None:
    """``model``'s gradients equal ``expected`` within float32 rounding."""
    for p, g in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad.cpu(), g.cpu(), rtol=1e-5, atol=1e-6)


def lane(events, device) -> list[tuple]:
    """(phase, micro-batch) of the events on one device, in order."""
    return [(e.phase, e.micro_batch) for e in events if e.device == device]
