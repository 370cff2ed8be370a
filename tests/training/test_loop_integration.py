"""The slow tests of test_loop.py (they start processes, kernels or ranks, or take
seconds): make test runs them, make test-fast leaves them out: whole trainings, and the
loop on DDP ranks."""

from __future__ import annotations

import math
import time

import pytest
import torch
from test_loop import _cnn, _test_loader, _train_loader
from torch.utils.data.distributed import DistributedSampler

from workshop import launch
from workshop.training.data import digits
from workshop.training.loaders import make_loader
from workshop.training.loop import train
from workshop.training.models import SmallCNN
from workshop.training.progress import Progress

# Nearly every test here trains in this process, which on a GPU machine leaves it
# unable to fork ranks: they run after the other tests (conftest.py).
pytestmark = pytest.mark.backward_in_process


def test_small_cnn_learns_the_digits_in_three_epochs(record_property):
    model = _cnn()
    start = time.perf_counter()
    history = train(
        model,
        _train_loader(),
        epochs=3,
        device="cpu",
        eval_loader=_test_loader(),
        progress=False,
    )
    wall = time.perf_counter() - start
    per_epoch = sum(history.seconds) / history.epochs
    record_property("digits_test_accuracy", history.final_eval_accuracy)
    record_property("seconds_per_epoch", per_epoch)
    print(
        f"\nSmallCNN on digits, 1 CPU thread: test accuracy "
        f"{history.final_eval_accuracy:.3f}, {per_epoch:.2f} s per epoch, "
        f"{wall:.1f} s in all\n{history.table(times=True)}"
    )
    assert history.final_eval_accuracy > 0.85, history.table()
    assert history.loss[0] > history.loss[-1]
    assert wall < 30, f"3 epochs took {wall:.1f} s on the CPU"


def test_training_twice_with_a_seed_gives_the_same_history():
    runs = []
    for _ in range(2):
        model = _cnn(seed=1)
        history = train(
            model,
            _train_loader(),
            epochs=2,
            max_steps=30,
            seed=0,
            device="cpu",
            progress=False,
        )
        runs.append((history, [p.detach().clone() for p in model.parameters()]))
    (first, params), (second, params_again) = runs
    assert first == second  # losses and accuracies; the times are not compared
    assert first.loss == second.loss and first.epochs == 2
    assert all(torch.equal(a, b) for a, b in zip(params, params_again, strict=True))


def test_bf16_autocast_learns_like_float32(record_property):
    histories = {}
    for amp in (None, "bf16"):
        histories[amp] = train(
            _cnn(), _train_loader(), epochs=2, amp=amp, device="cpu", progress=False
        )
    fp32, bf16 = histories[None], histories["bf16"]
    record_property("fp32_loss", fp32.loss)
    record_property("bf16_loss", bf16.loss)
    print(f"\nloss per epoch: float32 {fp32.loss}, bfloat16 {bf16.loss}")
    # bfloat16 keeps 8 bits of mantissa (float32: 24), so the runs drift apart a
    # little; measured difference about 0.002 on losses of 0.3 to 1.6.
    for a, b in zip(fp32.loss, bf16.loss, strict=True):
        assert abs(a - b) < 0.05, (fp32.loss, bf16.loss)
    assert abs(fp32.final_accuracy - bf16.final_accuracy) < 0.03


def _ddp_rank(epochs: int):
    """What notebook 02's DDP cell runs on every rank."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(SmallCNN())
    data = digits("train")
    loader = make_loader(data, 32, shuffle=False, sampler=DistributedSampler(data))
    history = train(
        model,
        loader,
        epochs=epochs,
        eval_loader=_test_loader(),
        progress=Progress(every=None, show_speed=False),
    )
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return history, checksum


def test_the_loop_runs_unchanged_on_ddp_ranks(no_leftover_children):
    result = launch(_ddp_rank, 2, world_size=2, backend="gloo", show="none")
    (history, checksum), (history_1, checksum_1) = result.returns
    # The job's figures, summed over ranks, are the same on both; so are the
    # weights, which DDP keeps in step.
    assert history == history_1
    assert checksum == checksum_1
    assert history.steps == 2 * math.ceil(1437 / 2 / 32)
    assert history.loss[1] < history.loss[0]
    # Only rank 0 printed.
    assert result.stdout[0].splitlines() == [
        f"epoch {e + 1}/2  loss {history.loss[e]:.3f}  accuracy "
        f"{history.accuracy[e]:.3f}  eval accuracy {history.eval_accuracy[e]:.3f}"
        for e in range(2)
    ]
    assert result.stdout[1] == ""
