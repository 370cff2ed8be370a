"""The slow tests of test_compiled.py: make test runs them, make test-fast leaves
them out.

train(compile=...): the model trained through torch.compile learns what the eager
model learns, and the History keeps the steps that compiled (the first, and the one
whose batch changed shape) apart from the steady state; under DDP the graph is cut
at the gradient buckets. "aot_eager" traces and splits as inductor does without
generating code, which keeps these tests cheap; one test compiles with inductor.

A g++ that runs but cannot compile (its back end, cc1plus, out of its reach: issue
45's offline node) is named in one line; train(compile=True) raises that line;
notebook 01's lesson traces with aot_eager instead. Inductor reads ``$CXX`` when it
is first imported, so a compiler that cannot compile is put first on the PATH of a
fresh Python, with an empty temporary folder (inductor's caches and precompiled
headers are kept under it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import clean_env, repo_env
from torch import nn

import workshop
from workshop.lessons.notebook01_compiled import WideMLP
from workshop.training import compiled
from workshop.training.compiled import INDUCTOR_CACHE, check_compile, graphs_compiled

# 1,437 training digits in batches of 100: 14 full batches, then one of 37.
BATCH = 100


# Training here, in the test's process (not a rank's): these run after the others.
in_process = pytest.mark.backward_in_process


def _loader():
    return workshop.make_loader(workshop.digits(), BATCH, shuffle=True)


def _run(compile_with, epochs=1, max_steps=None):
    torch.manual_seed(0)
    model = workshop.SmallCNN()
    history = workshop.train(
        model, _loader(), epochs=epochs, max_steps=max_steps, progress=False,
        compile=compile_with, device="cpu",
    )  # fmt: skip
    return model, history


@in_process
def test_the_compiled_model_learns_what_the_eager_one_learns():
    eager_model, eager = _run(False)
    model, compiled = _run("aot_eager")
    # The same operations, traced: the same numbers within float32's rounding.
    assert compiled.loss == pytest.approx(eager.loss, rel=1e-4)
    for a, b in zip(model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert eager.compiled_steps == [] and eager.compile_summary() == "not compiled"


@in_process
def test_the_first_step_and_the_smaller_last_batch_compile_and_are_kept_apart():
    _, history = _run("aot_eager", epochs=2)
    # Step 1 compiles; step 15, the first batch of 37, compiles once more with its
    # batch dimension left symbolic; epoch 2 (steps 16 to 30) compiles nothing.
    assert history.compiled_steps == [1, 15]
    assert history.graphs == 2
    assert history.warmup_samples == BATCH + 37
    assert 0 < history.warmup_seconds < sum(history.seconds)
    steady = history.steady_samples_per_second
    assert steady is not None and steady > 0
    summary = history.compile_summary()
    assert summary.startswith("compiled 2 graphs in steps 1, 15 (")
    assert summary.endswith(f"s); steady state {steady:,.0f} samples/s")


@pytest.mark.parametrize(
    "value, error, match",
    [
        (1, TypeError, r"compile must be True, False or a torch.compile backend's "),
        ("inductr", ValueError, r"compile='inductr' is not a torch.compile backend "
                                r"here; give True \(inductor\) or one of .*aot_eager"),
    ],
)  # fmt: skip
def test_a_bad_compile_value_is_refused_before_training(value, error, match):
    with pytest.raises(error, match=match):
        workshop.train(workshop.SmallCNN(), _loader(), compile=value, progress=False)
    assert check_compile(True) == "inductor" and check_compile(False) is None


def _mlp(width: int) -> nn.Module:
    # Notebook 02's model for the same lesson: a class of the workshop's, since under
    # DDP Dynamo compiles no frame of torch's own files (nn.Sequential's forward).
    return WideMLP(width)


def _ddp_compiled(bucket_cap_mb: float):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(_mlp(512), bucket_cap_mb=bucket_cap_mb)
    data = workshop.digits()
    sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=64, sampler=sampler)
    before = graphs_compiled()
    history = workshop.train(
        model, loader, max_steps=3, progress=False, compile="aot_eager", device="cpu"
    )
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(gathered[0], w) for w in gathered)
    return history.graphs, graphs_compiled() - before, history.loss, same


def test_under_ddp_the_graph_is_cut_at_the_gradient_buckets():
    # 2.6 MB of gradients. Buckets of 25 MB (DDP's default; its first bucket holds
    # 1 MB): two buckets. Buckets of 1 MB (the least torch takes under compile): more
    # buckets, and the graph is cut at each, so that each bucket's all-reduce starts
    # while the backward pass goes on.
    whole = workshop.launch(_ddp_compiled, 25.0, world_size=2, show="none")
    cut = workshop.launch(_ddp_compiled, 1.0, world_size=2, show="none")
    for run in (whole, cut):
        graphs, counted, _, same = run.returns[0]
        assert graphs == counted and same  # every rank holds the same weights
        assert run.returns[0][2] == run.returns[1][2]  # the job's loss, on both
    assert cut.returns[0][0] > whole.returns[0][0] > 1


def _no_compiler() -> str | None:
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "inductor needs a C++ compiler on a CPU; none is on PATH"
    return None


@pytest.mark.skipif(_no_compiler() is not None, reason=str(_no_compiler()))
@in_process
def test_inductor_compiles_the_loop_on_this_machine():
    # Where g++ is there but cannot compile, this fails with why, in one line: the
    # workshop says a node with gcc compiles, and the offline node's stand-in
    # (make test-site) must too.
    # A small model, so that generating its kernels takes seconds, not minutes.
    torch.manual_seed(0)
    model = _mlp(32)
    history = workshop.train(
        model, _loader(), max_steps=3, progress=False, compile=True, device="cpu"
    )
    assert history.compiled_steps == [1] and history.graphs == 1
    assert history.steps == 3


# g++ as a node has it when its back end is missing: --version answers, a compile
# does not. Each call is logged, so that the test sees a compile was tried.
BROKEN_GXX = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in --version|-v) echo "g++ (broken) 12.2.0"; exit 0;; esac
echo "g++: fatal error: cannot execute 'cc1plus': execvp: No such file or directory" >&2
echo "compilation terminated." >&2
exit 1
"""


PROBE = """
import json, sys
import workshop
from workshop.lessons import compile_backend
from workshop.training.compiled import inductor_unavailable

log = sys.argv[1]
compiles = lambda: sum(".cpp" in line for line in open(log))
found = {"why": inductor_unavailable(), "compiles": compiles()}
loader = workshop.make_loader(workshop.digits(), 100, shuffle=False)
try:
    workshop.train(workshop.SmallCNN(), loader, max_steps=2, progress=False,
                   compile=True, device="cpu")
except RuntimeError as error:
    found["error"] = str(error)
backend, found["lesson_why"] = compile_backend()
history = workshop.train(workshop.SmallCNN(), loader, max_steps=2, progress=False,
                         compile=backend, device="cpu")
found.update(backend=backend, compiled_steps=history.compiled_steps,
             compiles_after=compiles())
print(json.dumps(found))
"""


def test_a_compiler_that_cannot_compile_is_named_and_the_lesson_traces(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "g++.log"
    bin_dir.mkdir()
    gxx = bin_dir / "g++"
    gxx.write_text(BROKEN_GXX.format(log=log))
    gxx.chmod(0o755)
    log.write_text("")
    env = repo_env(PATH=f"{bin_dir}:{repo_env()['PATH']}", TMPDIR=str(tmp_path))
    env.pop("CXX", None)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(log)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    why = found["why"]
    assert why.startswith(
        "inductor cannot compile for the CPU here: g++ cannot compile: cannot "
        "execute 'cc1plus': execvp: No such file or directory; module load gcc"
    )
    assert "set CXX to a C++ compiler that works" in why and "\n" not in why
    # The probe compiled (the name alone was found), and only once in the process.
    assert found["compiles"] >= 1
    assert found["compiles_after"] == found["compiles"]
    # train(compile=True): one line, the cause, before any step.
    assert found["error"] == f"compile=True: {why}"
    # The lesson's path: it says why and traces with aot_eager.
    assert found["lesson_why"] == why and found["backend"] == "aot_eager"
    assert found["compiled_steps"] == [1]


def _compiler_here() -> str | None:
    name = compiled._configured_compiler().split()[0]
    return None if shutil.which(name) else f"no C++ compiler here ({name})"


@pytest.mark.skipif(_compiler_here() is not None, reason=str(_compiler_here()))
def test_this_machines_compiler_compiles(monkeypatch):
    monkeypatch.setattr(compiled, "_ANSWERS", {})
    assert compiled.inductor_unavailable() is None
    # Kept for the process: asked again, it does not compile again.
    monkeypatch.setattr(compiled, "_probe_inductor", lambda c: "probed again")
    assert compiled.inductor_unavailable() is None


def test_importing_the_package_sends_torch_dynamo_s_cache_out_of_tmp(tmp_path):
    # torch._dynamo makes the cache folder when it is imported (seen with torch
    # 2.15), in the temporary folder unless TORCHINDUCTOR_CACHE_DIR says otherwise.
    temp, home = tmp_path / "tmp", tmp_path / "cache"
    temp.mkdir()
    env = clean_env(TMPDIR=str(temp), XDG_CACHE_HOME=str(home))
    env.pop(INDUCTOR_CACHE, None)
    code = f"import workshop, torch._dynamo, os; print(os.environ[{INDUCTOR_CACHE!r}])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        timeout=300, check=True,
    ).stdout  # fmt: skip
    assert out.strip() == str(home / "scaling-pytorch-hpc" / "inductor")
    assert list(temp.iterdir()) == []
