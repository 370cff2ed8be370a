"""workshop.training.loop and workshop.training.steps: the loop that notebooks 01 and 02
share.

What the lessons claim, shown here: gradient accumulation equals a larger batch,
bfloat16 autocast learns like float32, a seed makes a run repeatable, SmallCNN learns
the digits in seconds on a CPU, and the same loop runs on DDP ranks.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from workshop import launch
from workshop.env import visible_gpu_count
from workshop.training.data import digits
from workshop.training.loaders import make_loader
from workshop.training.loop import _lr_factor, train
from workshop.training.models import SmallCNN
from workshop.training.progress import Progress
from workshop.training.steps import evaluate, resolve_device, train_step

# Nearly every test here trains in this process, which on a GPU machine leaves it
# unable to fork ranks: they run after the other tests (conftest.py).
pytestmark = pytest.mark.backward_in_process

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    # With torch's default of one compute thread per core, a second busy process on a
    # 2-core machine (a parallel test run, an open notebook) makes the two threads
    # wait for each other at every operation: 20x slower. One thread is immune, and
    # results do not change with the machine's core count (the summation order of
    # a convolution does).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cnn(seed: int = 0) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN()


def _mlp(seed: int = 0) -> nn.Module:
    """A model without BatchNorm: its gradients do not depend on how a batch is cut."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))


def _train_loader(batch_size: int = 64, shuffle: bool = True):
    return make_loader(digits("train"), batch_size, shuffle=shuffle, seed=0)


def _test_loader():
    return make_loader(digits("test"), 360, shuffle=False)


def _gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


# --- (d) SmallCNN learns the digits ---------------------------------------------------


# --- (c) a seed makes a run repeatable ------------------------------------------------


# --- (b) bfloat16 autocast ------------------------------------------------------------


# --- (e) fp16 needs a GPU -------------------------------------------------------------


def test_fp16_on_the_cpu_says_to_use_bf16():
    with pytest.raises(
        ValueError,
        match=(
            r"amp='fp16' autocast needs a GPU, but this run is on device='cpu', "
            r"where float16 autocast is not generally supported; pass amp='bf16'"
        ),
    ):
        train(_mlp(), _train_loader(), amp="fp16", device="cpu", progress=False)


# --- (a) gradient accumulation --------------------------------------------------------


def _step_gradients(model: nn.Module, micro_batches) -> list[torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    train_step(model, micro_batches, optimizer)
    return _gradients(model)


@pytest.mark.parametrize("sizes", [(8, 8, 8, 8), (5, 11, 16)])
@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["no-batchnorm", "cnn-eval-mode"])
def test_accumulated_micro_batches_give_the_gradient_of_one_big_batch(make, sizes):
    images, labels = digits("train").tensors
    x, y = images[:32], labels[:32]
    cuts = torch.tensor(sizes).cumsum(0).tolist()
    micro = [(x[a:b], y[a:b]) for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]

    # BatchNorm in train mode normalises each micro-batch by its own mean and
    # variance, which differ from those of the whole batch: the gradients then
    # differ. In eval mode it uses its running statistics, the same for all.
    big, small = make(), make()
    big.eval(), small.eval()
    one = _step_gradients(big, [(x, y)])
    accumulated = _step_gradients(small, micro)
    assert _max_difference(one, accumulated) < 1e-6


def test_batchnorm_in_train_mode_makes_accumulated_gradients_differ():
    images, labels = digits("train").tensors
    x, y = images[:32], labels[:32]
    one = _step_gradients(_cnn(), [(x, y)])
    accumulated = _step_gradients(_cnn(), [(x[:16], y[:16]), (x[16:], y[16:])])
    assert _max_difference(one, accumulated) > 1e-3


def test_train_with_accumulate_steps_like_a_k_times_larger_batch():
    small_batches = _mlp()
    big_batches = _mlp()
    common = {"epochs": 1, "max_steps": 5, "device": "cpu", "progress": False}
    a = train(small_batches, _train_loader(16, False), accumulate=4, **common)
    b = train(big_batches, _train_loader(64, False), **common)
    assert a.steps == b.steps == 5
    assert a.loss[0] == pytest.approx(b.loss[0], abs=1e-6)
    for p, q in zip(small_batches.parameters(), big_batches.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_train_step_skips_the_all_reduce_of_all_but_the_last_micro_batch():
    class FakeDDP(nn.Module):
        """Counts no_sync() like DistributedDataParallel would use it."""

        def __init__(self) -> None:
            super().__init__()
            self.module = _mlp()
            self.unsynced = 0

        def forward(self, x):
            return self.module(x)

        def no_sync(self):
            self.unsynced += 1
            return contextlib.nullcontext()

    model = FakeDDP()
    images, labels = digits("train").tensors
    batch = [(images[i : i + 4], labels[i : i + 4]) for i in (0, 4, 8)]
    train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.1))
    assert model.unsynced == 2


# --- (f) channels_last ----------------------------------------------------------------


def test_channels_last_gives_the_same_training_within_tolerance():
    results = {}
    for channels_last in (False, True):
        model = _cnn()
        history = train(
            model,
            _train_loader(),
            max_steps=10,
            channels_last=channels_last,
            device="cpu",
            progress=False,
        )
        results[channels_last] = (history, model)
    (plain, plain_model), (last, last_model) = results[False], results[True]
    conv = last_model.features[0][0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    # Another memory layout sums in another order: equal to rounding, not bitwise.
    assert last.loss[0] == pytest.approx(plain.loss[0], rel=1e-4)
    for p, q in zip(plain_model.parameters(), last_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=1e-3)


# --- the loop's other promises --------------------------------------------------------


def test_progress_lines_match_the_history(capsys):
    history = train(
        _mlp(),
        _train_loader(),
        epochs=2,
        device="cpu",
        eval_loader=_test_loader(),
        progress=Progress(every=None, show_speed=False),
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"epoch {e + 1}/2  loss {history.loss[e]:.3f}  accuracy "
        f"{history.accuracy[e]:.3f}  eval accuracy {history.eval_accuracy[e]:.3f}"
        for e in range(2)
    ]


def test_progress_false_prints_nothing(capsys):
    train(_mlp(), _train_loader(), max_steps=2, device="cpu", progress=False)
    assert capsys.readouterr().out == ""


def test_max_steps_stops_mid_epoch():
    history = train(
        _mlp(), _train_loader(), epochs=5, max_steps=7, device="cpu", progress=False
    )
    assert history.steps == 7
    assert history.epochs == 1  # the first epoch has 23 steps


def test_a_distributed_sampler_is_reseeded_every_epoch():
    seen = []

    class Recording(DistributedSampler):
        def set_epoch(self, epoch: int) -> None:
            seen.append(epoch)
            super().set_epoch(epoch)

    data = digits("train")
    sampler = Recording(data, num_replicas=1, rank=0, seed=0)
    loader = make_loader(data, 256, shuffle=False, sampler=sampler)
    train(_mlp(), loader, epochs=3, device="cpu", progress=False)
    assert seen == [0, 1, 2]


def test_cosine_schedule_decays_from_lr_to_near_zero():
    assert _lr_factor("cosine", 0, 100) == 1.0
    assert _lr_factor("cosine", 50, 100) == pytest.approx(0.5)
    assert _lr_factor("cosine", 99, 100) < 0.001
    assert _lr_factor("constant", 99, 100) == 1.0


def test_cosine_schedule_needs_a_length_or_max_steps():
    data = digits("train")
    batches = (data[i : i + 64] for i in range(0, 640, 64))  # no len()
    with pytest.raises(ValueError, match=r"the loader has no length; pass max_steps"):
        train(_mlp(), batches, device="cpu", progress=False)
    history = train(_mlp(), batches, max_steps=3, device="cpu", progress=False)
    assert history.steps == 3


def test_evaluate_counts_right_answers_and_restores_the_mode():
    class Constant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.eye(10)[torch.full((len(x),), 3)] + self.weight

    data = TensorDataset(torch.zeros(8, 1), torch.tensor([3, 3, 3, 1, 2, 3, 0, 3]))
    model = Constant().train()
    assert evaluate(model, make_loader(data, 3, shuffle=False), "cpu") == 5 / 8
    assert model.training
    with pytest.raises(ValueError, match=r"the loader yielded no samples"):
        evaluate(model, [], "cpu")
    with pytest.raises(TypeError, match=r"loader must give batches of \(inputs, "):
        evaluate(model, None, "cpu")  # "'NoneType' object is not iterable" before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amp": "int8"}, r"amp='int8' is not known; pass amp=None \(float32\), "),
        (
            {"optimizer": "lamb"},
            r"optimizer must be one of 'sgd' or 'adam', not 'lamb'",
        ),
        (
            {"schedule": "step"},
            r"schedule must be one of 'cosine' or 'constant', not 'step'",
        ),
        ({"epochs": 0}, r"epochs must be a whole number, 1 or more, not 0"),
        ({"accumulate": 0}, r"accumulate must be a whole number, 1 or more, not 0"),
        ({"lr": -0.1}, r"lr must be a learning rate above 0, not -0\.1"),
        # Trained to NaN weights, or failed in torch's words, before (issue 35).
        ({"lr": math.inf}, r"lr must be a learning rate above 0, not inf"),
        ({"lr": "0.1"}, r"lr must be a learning rate above 0, not '0\.1'"),
        ({"seed": "x"}, r"seed='x' must be a whole number, e\.g\. seed=0, or None"),
        ({"device": "gpu0"}, r"device='gpu0' is not a device; pass 'cpu', 'cuda', "),
    ],
)
def test_train_rejects_bad_arguments(kwargs, message):
    kwargs = {"device": "cpu", "progress": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        train(_mlp(), _train_loader(), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # "no" is true: channels-last was switched on by it.
        ({"channels_last": "no"}, r"channels_last must be True or False, got 'no'"),
        ({"progress": "yes"}, r"progress must be True, False or a Progress, got"),
        ({"model": None}, r"model must be a torch.nn.Module, got NoneType; e\.g\. "),
        ({"loader": None}, r"loader must give batches of \(inputs, targets\), got "),
        # It failed only after the first epoch's training.
        ({"eval_loader": 5}, r"eval_loader must give batches of \(inputs, targets"),
    ],
)
def test_train_refuses_an_object_of_the_wrong_kind_before_a_step(kwargs, message):
    args = {"model": _mlp(), "loader": _train_loader(), "progress": False} | kwargs
    model, loader = args.pop("model"), args.pop("loader")
    with pytest.raises(TypeError, match=message):
        train(model, loader, device="cpu", **args)


def test_train_step_wants_a_list_of_pairs_and_an_optimizer():
    model = _mlp()
    x, y = next(iter(_train_loader()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for wrong in ((x, y), x):  # the pair itself; a tensor ("ambiguous" before)
        with pytest.raises(TypeError, match=r"for one batch pass \[\(inputs, "):
            train_step(model, wrong, opt)
    with pytest.raises(TypeError, match=r"optimizer must be a torch.optim optim"):
        train_step(model, [(x, y)], None)


def test_an_empty_loader_is_an_error():
    empty = make_loader(digits("test"), 1000, shuffle=False, drop_last=True)
    with pytest.raises(ValueError, match=r"the loader yielded no batches in epoch 1"):
        train(_mlp(), empty, device="cpu", progress=False)


@pytest.mark.skipif(visible_gpu_count() > 0, reason="a GPU is visible here")
def test_asking_for_cuda_without_a_gpu_says_what_to_pass(monkeypatch):
    import workshop.training.steps

    # The machine without a GPU, on any machine (naming a device starts no CUDA).
    monkeypatch.setattr(workshop.training.steps, "visible_gpu_count", lambda: 0)
    with pytest.raises(ValueError, match=r"device='cuda' but no CUDA GPU is visible"):
        resolve_device("cuda")
    assert resolve_device(None) == CPU
    monkeypatch.setattr(workshop.training.steps, "visible_gpu_count", lambda: 1)
    assert resolve_device(None) == torch.device("cuda")
    assert resolve_device("cuda:0") == torch.device("cuda", 0)


# --- the same loop on DDP ranks ------------------------------------------------------


# --- GPU paths (run in a rank, so this process never initialises CUDA) ----------------


def _gpu_rank(options: list[dict]):
    results = []
    for kwargs in options:
        torch.manual_seed(0)
        model = SmallCNN()
        history = train(model, _train_loader(), epochs=2, progress=False, **kwargs)
        device = next(model.parameters()).device
        results.append((str(device), history.loss, history.final_accuracy))
    return results


@pytest.mark.gpu
@pytest.mark.skipif(visible_gpu_count() == 0, reason="needs a CUDA GPU; none here")
def test_mixed_precision_and_channels_last_on_a_gpu():
    options = [
        {},
        {"amp": "fp16"},
        {"amp": "bf16"},
        {"channels_last": True},
        {"amp": "bf16", "channels_last": True},
    ]
    result = launch(_gpu_rank, options, world_size=1, show="none")
    (device, fp32_loss, fp32_accuracy), *others = result.returns[0]
    assert device == "cuda:0"
    for kwargs, (_, loss, accuracy) in zip(options[1:], others, strict=True):
        assert all(abs(a - b) < 0.05 for a, b in zip(fp32_loss, loss, strict=True)), (
            kwargs,
            loss,
        )
        assert abs(accuracy - fp32_accuracy) < 0.03, kwargs
