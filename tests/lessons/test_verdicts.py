"""workshop.lessons.verdicts: conclusions computed from measured figures."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from workshop.lessons import verdicts as v


def test_rate_ratio_reads_the_ratio_as_printed_and_guards_a_zero_base():
    assert v.rate_ratio("bf16", 262, "fp32", 2131) == (
        "bf16: 262 samples/s, 0.12x fp32's 2,131: slower here"
    )
    about = v.rate_ratio("a", 104.4, "b", 100)  # 1.04 as printed: within 5%
    assert about.endswith("1.04x b's 100: about as fast here")
    assert v.rate_ratio("a", 105, "b", 100).endswith("1.05x b's 100: faster here")
    assert v.rate_ratio("a", 95, "b", 100).endswith("slower here")
    assert "no ratio" in v.rate_ratio("a", 10, "b", 0, "files/s")


def test_fastest_names_the_fastest_and_each_ratio():
    line = v.fastest({"PNG files": 3135, "one .tar": 3733, "one .npy": 17567})
    assert line == "fastest here: one .npy, 4.71x one .tar and 5.60x PNG files"
    assert "measured 0" in v.fastest({"a": 5.0, "b": 0.0})
    with pytest.raises(ValueError, match="at least one rate"):
        v.fastest({})


def test_bucket_trend_needs_one_direction_and_more_than_twice_the_noise():
    noisy = [(25, 1, 56.1), (1, 1, 50.3), (0.1, 2, 55.3), (0.02, 3, 53.1)]
    assert v.bucket_trend(noisy).endswith("a trend with the bucket size: no")
    falling = [(25, 1, 56.1), (1, 1, 55.3), (0.1, 2, 50.3), (0.02, 3, 43.1)]
    assert v.bucket_trend(falling).endswith("yes")
    within_noise = [(25, 1, 56.1), (1, 1, 50.0), (0.1, 2, 49.0), (0.02, 3, 48.0)]
    assert v.bucket_trend(within_noise).endswith("no")
    with pytest.raises(ValueError, match="two caps or more"):
        v.bucket_trend([(25, 1, 50.0)])


@dataclass
class Row:
    mode: str
    world_size: int
    speedup: float | None
    efficiency: float | None
    base_world_size: int = 1


@dataclass
class Result:
    rows: list


def test_scaling_verdict_reads_the_largest_world_size_of_each_mode():
    result = Result(
        [
            Row("weak", 1, 1.0, 1.0),
            Row("weak", 2, 1.343, 0.67),
            Row("strong", 1, 1.0, 1.0),
            Row("strong", 2, 0.826, 0.41),
        ]
    )
    assert v.scaling_verdict(result).splitlines() == [
        "weak scaling, 1 to 2 ranks: speed-up 1.34, efficiency 67%: faster than 1 rank",
        "strong scaling, 1 to 2 ranks: speed-up 0.83, efficiency 41%: slower than 1 "
        "rank",
    ]
    alone = Result([Row("weak", 1, 1.0, 1.0)])
    assert "only 1 rank(s) measured" in v.scaling_verdict(alone)


class FakeMonitor:
    def __init__(self, loop_ms: str) -> None:
        self.text = (
            "phase               seconds  steps  ms/step  CPU %  process CPU %\n"
            f"decode in the loop      3.5     24    {loop_ms}     52             51\n"
            "decoded ahead           0.8     24     32.2     51             52"
        )

    def table(self) -> str:
        return self.text


def test_starved_device_subtracts_the_steps_and_counts_cores():
    line = v.starved_device(
        FakeMonitor("147.2"), "decode in the loop", "decoded ahead", 2
    )
    assert line.splitlines() == [
        "decode in the loop: 147.2 ms a step against 32.2 ms decoded ahead:",
        "  115.0 ms of each step (78%) prepared data while the device waited",
        "this process kept 1.02 and 1.04 of 2 cores busy: about one core in both: yes",
    ]
    fed = v.starved_device(
        FakeMonitor(" 30.0"), "decode in the loop", "decoded ahead", 2
    )
    assert "no step waited for data here" in fed
    with pytest.raises(KeyError, match="no phase 'x'"):
        v.starved_device(FakeMonitor("1.0"), "x", "decoded ahead")


@dataclass
class Run:
    ranks: int
    accuracies: tuple

    @property
    def accuracy(self) -> float:
        return sum(self.accuracies) / len(self.accuracies)


@dataclass
class Batches:
    runs: tuple


def test_batch_verdicts_from_the_means_and_the_seeds_spread():
    batches = Batches(
        (
            Run(1, (0.87, 0.81, 0.64)),
            Run(4, (0.17, 0.19, 0.29)),
            Run(4, (0.46, 0.49, 0.54)),
            Run(4, (0.49, 0.54, 0.53)),
        )
    )
    lines = v.batch_verdicts(batches).splitlines()
    assert lines[0] == "4 ranks, same lr: 0.217 against 1 rank's 0.773: behind"
    assert lines[1] == "lr x 4: 0.520, recovers 54% of that gap"
    assert lines[2] == (
        "warm-up against none: -0.023; the seeds spread over 0.08: within the spread"
    )
