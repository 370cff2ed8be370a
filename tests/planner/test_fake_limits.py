"""fake_run's limits: a world it cannot finish within its timeout is refused before
any process starts, with the time from the module's measured cost model; a child
stopped on a timeout says which phase it was in, and the advice fits that phase."""

from __future__ import annotations

import re
import time

import pytest

from workshop.planner import fake_world
from workshop.planner.fake_world import fake_run, fake_runs
from workshop.planner.layout import Layout, model_shape

B8 = model_shape("transformer-8b")


def test_a_million_rank_world_is_refused_within_a_second_with_its_time():
    start = time.perf_counter()
    with pytest.raises(ValueError) as e:
        fake_run("transformer-8b", Layout(dp=2**20, zero=3), rank=5, timeout=120)
    assert time.perf_counter() - start < 1
    # the numbers come from the formula: mesh 81.2 s (measured at 1,048,576 ranks),
    # 9 tensors x 2**20 ranks x 14 us = 132.12 s per block, 32 blocks, root 3 tensors
    assert e.match(
        r"^fake_run: a world of 1,048,576 ranks \(transformer-8b, dp=1048576 .*\) "
        r"would take at least 4,357 s here \(start 4 s \+ mesh 81\.2 s \+ sharding "
        r"32 blocks x 132\.12 s \+ root 44\.04 s\), and at least 1,089 s on a machine "
        r"4x faster: more than 2 x timeout=120 s\. .*FSDP2 cuts each tensor into "
        r"dp=1,048,576 shards\. HINT: choose a smaller layout .* raise timeout= to at "
        r"least 4,357$"
    )


def test_a_million_ranks_of_one_block_each_name_the_mesh_as_the_cause():
    # tp=8, pp=32, dp=4,096: one block per stage, cheap to shard; the mesh is not
    layout = Layout(dp=4096, tp=8, pp=32, zero=3)
    with pytest.raises(ValueError, match=r"mesh 81\.2 s \+ .*holds all 1,048,576"):
        fake_run("transformer-8b", layout, timeout=5)


def test_the_total_of_several_runs_counts():
    layout = Layout(dp=65536, zero=3)
    one = fake_world._least_seconds(B8, layout, 0)["total"]
    assert one == pytest.approx(65536 * 31e-6 + 32 * 23.7 + 3 * 23.7 / 9)
    with pytest.raises(ValueError, match=r"; 2 runs, 1,541 s in all"):
        fake_runs([("transformer-8b", layout, 0, {"step": False})] * 2, timeout=150)


@pytest.mark.parametrize(
    "model, layout",
    [
        ("transformer-8b", Layout(dp=128, tp=8, zero=3)),
        ("transformer-8b", Layout(dp=1024, zero=3)),
        ("transformer-8b", Layout(dp=32, tp=8, pp=4, zero=3, micro_batches=8)),
        ("tiny", Layout(dp=4, zero=3)),
    ],
)
def test_a_layout_the_tests_run_is_not_refused(model, layout):
    # the layouts test_fake_world runs; the check alone, no child
    job = fake_world._job(model, layout, 1, True, None, 1)
    assert fake_world._check_time([job], timeout=30) is None


def test_a_timeout_while_starting_advises_a_longer_timeout():
    assert "still starting" in fake_world._where("", [])
    assert "timeout=16 or more" in fake_world._where("some warning\n", [])


@pytest.mark.parametrize(
    "phase, advice",
    [
        ("mesh", r"building the DeviceMesh of 1,048,576 ranks .*smaller world"),
        ("shard", r"sharded each tensor into dp=131,072 chunks .*a smaller dp"),
        ("step", r"in the step \(layers_in_step=2, .*a smaller layers_in_step"),
        ("allocate", r"in phase 'allocate'\. HINT: a longer timeout$"),
    ],
)
def test_a_timeout_names_the_phase_and_advice_that_fits_it(phase, advice):
    job = {"layout": vars(Layout(dp=131072, tp=8, zero=3)), "layers_in_step": 2}
    job["batch_tokens"] = None
    err = f"{fake_world.PHASE_MARK}0 mesh\n{fake_world.PHASE_MARK}0 {phase}\n"
    assert re.search(advice, fake_world._where(err, [job]))
    two = fake_world._where(err.replace(" 0 ", " 1 "), [job, job])
    assert two.startswith("in run 2 of 2 ")
