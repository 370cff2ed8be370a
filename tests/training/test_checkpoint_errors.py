"""workshop.training.checkpoint_errors, through load_checkpoint: a file cut short
anywhere, a model or optimizer of another shape, and a file that cannot be opened
each give one message that names the checkpoint, says what is wrong and how to go
on, never torch's bare error."""

from __future__ import annotations

import itertools
import os
import re

import pytest
import torch
from torch import nn

from workshop.training.checkpoint import load_checkpoint, save_checkpoint


def _model(width: int = 50, layers: int = 2) -> nn.Sequential:
    torch.manual_seed(0)
    sizes = [20] + [width] * (layers - 1) + [10]
    modules: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        modules += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*modules[:-1])


def _with_momentum(model: nn.Module) -> torch.optim.Optimizer:
    """An optimizer that holds state (momentum buffers), stepped without autograd:
    the gradients are set by hand, so no backward pass runs in this process."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer


def _cut_points(size: int) -> list[int]:
    """Every ~3% of ``size`` bytes, and each of the last 8 bytes."""
    return sorted({size * i // 33 for i in range(33)} | set(range(size - 8, size)))


def test_a_checkpoint_cut_anywhere_says_it_is_cut_short(tmp_path):
    model = _model()
    whole = save_checkpoint(tmp_path / "whole.pt", model, _with_momentum(model))
    data = whole.read_bytes()
    # Large enough that most cuts fall past the first 4 KB, where torch's reader
    # used to fail with a bare "OSError: [Errno 22] Invalid argument".
    assert len(data) > 12_000
    cuts = _cut_points(len(data))
    assert len(cuts) == 41 and cuts[-1] == len(data) - 1
    said = {}
    for cut in cuts:
        path = tmp_path / f"cut-{cut}.pt"
        path.write_bytes(data[:cut])
        target = _model()
        with pytest.raises(ValueError) as info:
            load_checkpoint(path, target, _with_momentum(target))
        said[cut] = str(info.value)
    for cut, message in said.items():
        if cut == 0:
            assert message.startswith(f"{tmp_path / 'cut-0.pt'} is empty (0 bytes)")
        else:
            assert message.startswith(
                f"{tmp_path / f'cut-{cut}.pt'} is cut short or damaged: it begins "
                f"as a zip archive but its end (the archive's directory) is missing "
                f"({cut} bytes)"
            ), (cut, message)
        assert "Use an older checkpoint, or start again" in message, (cut, message)
    # The whole file still loads: the cut copies were the trouble, not the save.
    assert load_checkpoint(whole, _model()) == {}


def test_the_bare_os_error_of_torchs_reader_is_chained_as_the_cause(tmp_path):
    data = save_checkpoint(tmp_path / "c.pt", _model()).read_bytes()
    (tmp_path / "late.pt").write_bytes(data[:-1])
    with pytest.raises(ValueError, match=r"late\.pt is cut short or damaged") as info:
        load_checkpoint(tmp_path / "late.pt", _model())
    # Kept for whoever debugs torch itself, under the message that explains it.
    assert isinstance(info.value.__cause__, OSError | RuntimeError)


def test_a_model_of_another_width_names_the_parameters_and_both_shapes(tmp_path):
    wide = _model(width=50)
    with torch.no_grad():
        wide[2].bias.fill_(7.0)  # the one entry that would fit the narrow model
    save_checkpoint(tmp_path / "wide.pt", wide)
    narrow = _model(width=30)
    before = {k: v.clone() for k, v in narrow.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{tmp_path / 'wide.pt'} was saved from a model of another shape than "
            "the one given: 0.weight is [50, 20] in the checkpoint but [30, 20] in "
            "the model; 0.bias is [50] in the checkpoint but [30] in the model; "
            "1 more of another shape. Build the model the checkpoint was saved from"
        )
        + r".*; nothing was loaded$",
    ):
        load_checkpoint(tmp_path / "wide.pt", narrow)
    # torch's load_state_dict would have copied the bias that fits, then failed.
    after = narrow.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_model_with_other_layers_names_what_only_one_of_them_has(tmp_path):
    save_checkpoint(tmp_path / "two.pt", _model(layers=2))
    with pytest.raises(
        ValueError,
        match=r"two\.pt was saved from a model of another shape than the one given: "
        r"2\.weight is \[10, 50\] in the checkpoint but \[50, 50\] in the model; "
        r"2\.bias is \[10\] in the checkpoint but \[50\] in the model; "
        r"the model has 4\.weight, 4\.bias, which the checkpoint lacks\. Build",
    ):
        load_checkpoint(tmp_path / "two.pt", _model(layers=3))
    save_checkpoint(tmp_path / "three.pt", _model(layers=3))
    with pytest.raises(
        ValueError,
        match=r"three\.pt was saved .*: 2\.weight is \[50, 50\] in the checkpoint but "
        r"\[10, 50\] in the model; .*the checkpoint has 4\.weight, 4\.bias, which "
        r"the model lacks",
    ):
        load_checkpoint(tmp_path / "three.pt", _model(layers=2))


def test_an_optimizer_over_other_parameters_is_named_with_the_checkpoint(tmp_path):
    model = _model()
    grouped = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[2].parameters()}],
        lr=0.1,
    )
    save_checkpoint(tmp_path / "groups.pt", model, grouped)
    target = _model()
    with pytest.raises(
        ValueError,
        match=r"groups\.pt holds the state of an optimizer over other parameters "
        r"\(loaded state dict has a different number of parameter groups\); build "
        r"the model and optimizer the checkpoint was saved from",
    ):
        load_checkpoint(tmp_path / "groups.pt", target, _with_momentum(target))


def test_a_failed_optimizer_load_leaves_the_model_as_it_was(tmp_path):
    model = _model()
    with torch.no_grad():
        model[0].weight.fill_(7.0)
    save_checkpoint(tmp_path / "plain.pt", model)  # without the optimizer
    grouped = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[2].parameters()}],
        lr=0.1,
    )
    save_checkpoint(tmp_path / "groups.pt", model, grouped)
    target = _model()
    optimizer = _with_momentum(target)  # its step changes the weights: first
    before = target[0].weight.clone()
    for name, said in [
        ("plain.pt", "holds no optimizer state"),
        ("groups.pt", "holds the state of an optimizer over other parameters"),
    ]:
        with pytest.raises(ValueError, match=rf"{re.escape(name)} {said}"):
            load_checkpoint(tmp_path / name, target, optimizer)
        assert torch.equal(target[0].weight, before), name


class _Strict(nn.Linear):
    """A module whose own loading refuses what torch's checks let through."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        raise RuntimeError("_Strict refuses every checkpoint")


def test_a_modules_own_refusal_is_reported_with_the_checkpoint(tmp_path):
    save_checkpoint(tmp_path / "c.pt", nn.Linear(3, 2))
    with pytest.raises(
        ValueError,
        match=r"c\.pt does not fit the model given \(_Strict refuses every "
        r"checkpoint\); build the model the checkpoint was saved from",
    ):
        load_checkpoint(tmp_path / "c.pt", _Strict(3, 2))


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root reads a file whatever its permissions",
)
def test_a_checkpoint_that_cannot_be_opened_is_named_by_the_system(tmp_path):
    path = save_checkpoint(tmp_path / "locked.pt", _model())
    path.chmod(0)
    with pytest.raises(PermissionError, match=r"Permission denied: .*locked\.pt"):
        load_checkpoint(path, _model())
