"""workshop.training.progress: plain progress lines at a bounded rate, rank 0 only, a
deterministic mode for checked notebook output, and the History a run returns."""

from __future__ import annotations

import io

import pytest

from workshop.training.progress import History, Progress


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _progress(**kwargs) -> tuple[Progress, Clock, io.StringIO]:
    clock, out = Clock(), io.StringIO()
    kwargs = {"enabled": True, **kwargs}
    progress = Progress(stream=out, clock=clock, **kwargs)
    progress.start(epochs=3, steps_per_epoch=90)
    return progress, clock, out


def test_a_step_line_is_due_once_every_interval():
    progress, clock, out = _progress(every=10)
    assert not progress.due()
    clock.now += 9.9
    assert not progress.due()
    clock.now += 0.1
    assert progress.due()
    progress.step(1, 40, loss=0.5123, samples=12340)
    assert out.getvalue() == "epoch 1/3  step 40/90  loss 0.512  1234 samples/s\n"
    assert not progress.due()  # the interval starts again from the printed line
    clock.now += 10
    progress.step(1, 80, loss=0.4, samples=12340 + 5000)
    assert out.getvalue().splitlines()[-1].endswith("loss 0.400  500 samples/s")


def test_epoch_end_lines_carry_accuracy_speed_and_time():
    progress, clock, out = _progress()
    clock.now += 1.25
    progress.epoch_end(
        1,
        loss=0.4981,
        accuracy=0.8612,
        eval_accuracy=0.9031,
        samples_per_second=1210.4,
        seconds=1.25,
    )
    assert out.getvalue() == (
        "epoch 1/3  loss 0.498  accuracy 0.861  eval accuracy 0.903  "
        "1210 samples/s  1.2 s\n"
    )


def test_without_speed_and_steps_the_lines_are_the_same_at_every_run():
    # What a notebook's checked cell uses: no step lines (their number depends on
    # timing) and no samples/s or seconds.
    progress, clock, out = _progress(every=None, show_speed=False)
    clock.now += 1000
    assert not progress.due()
    progress.epoch_end(
        2, loss=0.25, accuracy=0.9, samples_per_second=999.0, seconds=3.0
    )
    assert out.getvalue() == "epoch 2/3  loss 0.250  accuracy 0.900\n"


def test_step_lines_without_speed_or_a_known_length():
    clock, out = Clock(), io.StringIO()
    progress = Progress(
        every=0, show_speed=False, enabled=True, stream=out, clock=clock
    )
    progress.start(epochs=1)
    assert progress.due()
    progress.step(1, 7, loss=1.0, samples=70)
    assert out.getvalue() == "epoch 1/1  step 7  loss 1.000\n"


def test_lines_are_plain_lines_without_carriage_returns():
    progress, clock, out = _progress(every=0)
    for step in range(1, 4):
        clock.now += 1
        progress.step(1, step, loss=1.0 / step, samples=100 * step)
    progress.epoch_end(1, loss=0.5, accuracy=0.5)
    assert "\r" not in out.getvalue()
    assert len(out.getvalue().splitlines()) == 4


def test_silenced_progress_prints_nothing_and_is_never_due():
    progress, _, out = _progress(every=0, enabled=False)
    assert not progress.due()
    progress.step(1, 1, loss=1.0, samples=10)
    progress.epoch_end(1, loss=1.0, accuracy=0.1)
    assert out.getvalue() == ""


@pytest.mark.parametrize(("rank", "printed"), [("0", True), ("1", False)])
def test_by_default_only_rank_0_prints(monkeypatch, rank, printed):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = io.StringIO()
    progress = Progress(every=None, stream=out)
    progress.start(epochs=1)
    progress.epoch_end(1, loss=1.0, accuracy=0.5)
    assert bool(out.getvalue()) is printed


def test_default_stream_is_stdout_at_the_time_of_printing(capsys):
    progress = Progress(every=None, enabled=True)
    progress.start(epochs=1)
    progress.epoch_end(1, loss=1.0, accuracy=0.5)
    assert capsys.readouterr().out == "epoch 1/1  loss 1.000  accuracy 0.500\n"


@pytest.mark.parametrize("every", [-1, True, "10"])  # True was 1 s, "10" a TypeError
def test_an_interval_that_is_no_number_of_seconds_is_refused(every):
    with pytest.raises(ValueError, match=rf"every={every!r} must be seconds >= 0, or"):
        Progress(every=every)


def test_history_shows_no_times_unless_asked():
    history = History(
        loss=[1.23456, 0.5],
        accuracy=[0.5, 0.875],
        eval_accuracy=[0.6, 0.9],
        samples_per_second=[1234.5, 2345.6],
        seconds=[1.5, 0.75],
        steps=46,
    )
    assert history.table() == (
        "epoch   loss  accuracy  eval accuracy\n"
        "    1  1.235     0.500          0.600\n"
        "    2  0.500     0.875          0.900"
    )
    assert history.table(times=True).splitlines()[2].endswith("2346     0.75")
    assert repr(history) == (
        "History(epochs=2, steps=46, final_loss=0.5000, final_accuracy=0.8750, "
        "final_eval_accuracy=0.9000)"
    )
    assert history == History(
        loss=[1.23456, 0.5], accuracy=[0.5, 0.875], eval_accuracy=[0.6, 0.9], steps=46
    )
    assert History().final_loss is None


def test_history_table_fits_88_columns_with_big_numbers():
    history = History(
        loss=[12345.678] * 120,
        accuracy=[0.5] * 120,
        eval_accuracy=[0.6] * 120,
        samples_per_second=[12_345_678.9] * 120,
        seconds=[98_765.4] * 120,
        steps=10**9,
    )
    rows = history.table(times=True).splitlines()
    assert rows[-1].split() == ["120", "12345.678", "0.500", "0.600", "12345679",
                                "98765.40"]  # fmt: skip
    assert max(map(len, rows)) <= 88
