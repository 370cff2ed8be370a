"""Notebook 01 (one node, many GPUs): its exercises, checked with
``workshop.check("01.bubble", answer)``, and the questions of its closing quiz,
shown by ``workshop.quiz("01")``.
"""

from __future__ import annotations

from typing import Any

from .judges import Exercise, close, first_wrong_case
from .questions import question

__all__ = ["EXERCISES", "QUESTIONS", "QUIZ"]


def _bubble_function(answer: Any) -> bool | str:
    cases = [(1, 1), (2, 1), (2, 4), (4, 8), (8, 32), (3, 3)]
    return first_wrong_case(answer, "bubble", cases, lambda s, m: (s - 1) / (m + s - 1))


def _accumulate(answer: Any) -> bool | str:
    # accumulate= counts backward passes: 8.0 is the right number in the wrong type,
    # which train() would refuse, so say that rather than only "not yet".
    if isinstance(answer, float) and answer.is_integer():
        return (
            f"accumulate= takes a whole number of micro-batches (an int), not {answer}"
        )
    return isinstance(answer, int) and not isinstance(answer, bool) and answer == 8


EXERCISES: dict[str, Exercise] = {
    "01.dp": Exercise(
        "(samples per GPU, copies of the weights during the forward pass) when "
        "DataParallel on 4 GPUs gets a batch of 256",
        lambda a: tuple(a) == (64, 4) if isinstance(a, (tuple, list)) else False,
        "scatter splits the batch evenly; replicate puts one copy of the model on "
        "every device",
    ),
    "01.bubble": Exercise(
        "a function bubble(stages, micro_batches) giving the idle fraction of a "
        "pipeline (all forwards, then all backwards)",
        _bubble_function,
        "count the time steps of one pass: micro_batches + stages - 1; each stage is "
        "busy for micro_batches of them",
    ),
    "01.accumulate": Exercise(
        "accumulate= for micro-batches of 16 to give the gradient of a batch of 128",
        _accumulate,
        "each optimizer step should have seen 128 samples in total",
    ),
    "01.speedup": Exercise(
        "speed-up of 4 GPUs over 1 for a step of 6 ms fixed cost plus 2 ms of "
        "per-sample work, the batch split 4 ways",
        close(8 / 6.5),
        "only the per-sample part shrinks: 2 ms becomes 0.5 ms; the 6 ms stay",
    ),
}

QUESTIONS = (
    question(
        "Where should you train a model on a cluster?",
        "compute node",
        "b",
        (
            "On the login node, where you edit and submit jobs",
            "Login nodes are shared by everyone for editing, compiling and submitting; "
            "training there slows them all down.",
        ),
        (
            "On a compute node that the scheduler hands out",
            "Ask Slurm for one (salloc, sbatch, or a portal's Jupyter session) and "
            "work there.",
        ),
        (
            "On any node where nvidia-smi runs",
            "Where a tool runs says nothing about whether the node is yours to use; "
            "ask the scheduler for a compute node.",
        ),
    ),
    question(
        "What does torch.nn.DataParallel do at every step?",
        "replicates",
        "c",
        (
            "Starts one process per GPU, each with its own copy of the model",
            "That is DistributedDataParallel; DataParallel runs in one process, one "
            "thread per device.",
        ),
        (
            "Puts the first layers on one GPU and the rest on another",
            "That is splitting the model (section 4); every DataParallel replica holds "
            "the whole model.",
        ),
        (
            "Scatters the batch, copies the model to every device, gathers the outputs",
            "Scatter, replicate, forward, gather, at every step, from one process.",
        ),
        (
            "Copies the weights once, then exchanges only the gradients",
            "It copies the weights to every device at every step; exchanging only "
            "gradients is what DistributedDataParallel does.",
        ),
    ),
    question(
        "A pipeline of 2 stages runs 4 micro-batches, all forwards then all "
        "backwards. What share of the time does each device sit idle?",
        "bubble",
        "a",
        (
            "20%",
            "(stages - 1) / (micro_batches + stages - 1) = 1 / 5: each pass takes 5 "
            "slots and each device is busy in 4 of them.",
        ),
        (
            "25%",
            "That is (stages - 1) / micro_batches, the idle slots over the busy ones; "
            "divide by all 5 slots of a pass instead.",
        ),
        (
            "50%",
            "That is the bubble of a single micro-batch: then only one device works "
            "at a time.",
        ),
        (
            "0%",
            "The second device waits for the first micro-batch, and the first waits "
            "for the last gradients: there is always a bubble.",
        ),
    ),
    question(
        "The two-stage model was compared with the same weights unsplit, with 4 "
        "micro-batches. What did the check find?",
        "unsplit",
        "d",
        (
            "Everything equal bit for bit: the same numbers on the same device",
            "True of 1 micro-batch; with 4 the gradients are summed in another order, "
            "so their last bits differ.",
        ),
        (
            "Gradients only roughly equal: a pipeline approximates the whole batch",
            "They agreed within float32 rounding: the micro-batches' weighted "
            "gradients add up to the whole batch's.",
        ),
        (
            "Different outputs, since activations are copied from one device to "
            "the other",
            "Copying a tensor to another device changes no bit: the outputs were "
            "equal bit for bit.",
        ),
        (
            "Equal outputs; gradients equal up to float32 rounding",
            "Section 4: the micro-batch gradients are added into .grad in another "
            "order, and float addition is not associative.",
        ),
    ),
    question(
        "Gradient accumulation over 4 micro-batches of 16 (each loss divided by 4) "
        "gives which gradient?",
        "accumulation",
        "b",
        (
            "An approximation of the batch of 64 that improves with more micro-batches",
            "It is not an approximation: section 5 checked that the gradients equal "
            "those of the whole batch.",
        ),
        (
            "That of one batch of 64, up to float32 rounding (BatchNorm aside)",
            "The sum of the micro-batches' gradients is the whole batch's, added in "
            "another order; only BatchNorm's per-batch statistics differ.",
        ),
        (
            "Four gradients, one per optimizer step",
            "The optimizer steps once, after all 4 micro-batches; that is what keeps "
            "the result equal to a batch of 64.",
        ),
    ),
    question(
        "What does mixed precision with torch.autocast and bfloat16 change?",
        "autocast",
        "d",
        (
            "Stores the weights and gradients in 16 bits, halving the model's memory",
            "The weights stay in 32 bits; it is the activations that shrink.",
        ),
        (
            "Changes the loss curve: training ends at a worse accuracy",
            "bfloat16 keeps float32's range: section 5's cell compares the two runs' "
            "losses epoch by epoch.",
        ),
        (
            "Makes every step faster, on any processor, GPU or CPU",
            "On a CPU without bfloat16 units it can be slower; the speed-up comes from "
            "tensor cores.",
        ),
        (
            "Computes most operations in 16 bits; saved activations shrink a lot",
            "Half the bytes per value (section 5 measured a 42 % cut: some tensors "
            "stay in 32 bits), and much faster math on tensor cores.",
        ),
    ),
    question(
        "Why does float16 training need a GradScaler while bfloat16 training does not?",
        "GradScaler",
        "a",
        (
            "float16 stops near 6e-8: smaller gradients round to 0 unless scaled up",
            "Its 5 exponent bits end at 2**-24; bfloat16 has float32's 8 (doc 001's "
            "float16 recipe pairs autocast with a scaler).",
        ),
        (
            "bfloat16 has more fraction bits than float16, so small gradients stay "
            "exact",
            "It has fewer, 7 against 10; what it has more of is exponent bits, "
            "float32's 8, hence float32's range.",
        ),
        (
            "The scaler makes float16 matrix multiplications run faster",
            "It only multiplies the loss and divides the gradients back; the speed "
            "comes from the 16-bit math itself.",
        ),
        (
            "bfloat16 cannot overflow, so no step ever has to be skipped",
            "It overflows too, near 3.4e38 as float32 does, but gradients never get "
            "there; float16 overflows above 65,504.",
        ),
    ),
    question(
        "You split a batch over more devices. Which part of a step gets shorter?",
        "Amdahl",
        "c",
        (
            "Every part: N devices make each step N times faster",
            "The fixed part (Python, kernel launches, the optimizer over every "
            "weight) stays, so the speed-up can never pass 1 / (fixed share).",
        ),
        (
            "Only the optimizer step, which each device does for part of the weights",
            "The optimizer still updates every weight at every step: that is part of "
            "the fixed cost.",
        ),
        (
            "Only the work that grows with the number of samples",
            "Each device gets fewer samples; the fixed part stays, as Amdahl's law "
            "says.",
        ),
    ),
)

#: The quiz that closes the notebook: its title and questions.
QUIZ = ("One node, many GPUs", QUESTIONS)
