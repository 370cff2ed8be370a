"""The questions of the notebooks' closing quizzes, shown by
:func:`workshop.lessons.quiz.quiz`: notebooks 01 and 02 here, 03 and 04 in
:mod:`~workshop.lessons.quizzes_scale`, 05 in :mod:`~workshop.lessons.quizzes_cluster`.

Every option carries a one-line explanation that the learner sees after choosing it:
why it is right, or why it is not. Which option is right is stored here, with the
package, as the exercises' answers are, and never printed before the learner answers.
Each question names a ``keyword`` of its notebook's text, so the tests can check that
the notebook teaches what the question asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LETTERS", "QUIZZES_EARLY", "Option", "Question", "question"]

LETTERS = "abcd"


@dataclass(frozen=True)
class Option:
    """One answer to a question, and why it is right or wrong."""

    text: str
    why: str


@dataclass(frozen=True)
class Question:
    """A multiple-choice question with one right option.

    Attributes:
        text: the question.
        keyword: a word the notebook's text contains where it teaches this.
        options: 3 or 4 options, shown as a), b), c), d).
        right: the letter of the right option (kept out of the repr).
    """

    text: str
    keyword: str
    options: tuple[Option, ...]
    right: str = field(repr=False)

    def __post_init__(self) -> None:
        # The data checks itself on import: a typo in a quiz fails at once.
        if not 3 <= len(self.options) <= len(LETTERS):
            raise ValueError(
                f"question {self.text!r} has {len(self.options)} options; give it "
                f"3 to {len(LETTERS)}"
            )
        if self.right not in LETTERS[: len(self.options)]:
            raise ValueError(
                f"question {self.text!r} marks option {self.right!r} right; it has "
                f"options {', '.join(LETTERS[: len(self.options)])}"
            )


def question(
    text: str, keyword: str, right: str, *options: tuple[str, str]
) -> Question:
    """A :class:`Question` from (option, why) pairs: the quizzes' compact form."""
    return Question(text, keyword, tuple(Option(t, why) for t, why in options), right)


QUIZ_01 = (
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
            "Exactly that of one batch of 64 (BatchNorm in training mode aside)",
            "The sum of the micro-batches' gradients is the whole batch's; only "
            "BatchNorm's per-batch statistics differ.",
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
            "In section 5 the loss followed the same path in both precisions.",
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

QUIZ_02 = (
    question(
        "Rank 0 has computed A = B*C and rank 1 D = E*F. Which one call leaves "
        "G = A*D on both ranks, and which kind of communication is it?",
        "collective computation",
        "c",
        (
            "dist.barrier(): synchronisation",
            "A barrier only makes the ranks wait for each other; no tensor moves "
            "and nothing is multiplied.",
        ),
        (
            "dist.broadcast(t, src=0): data movement",
            "Broadcast copies rank 0's A over rank 1's D: both end with A, and "
            "nobody has multiplied.",
        ),
        (
            "dist.all_reduce(t, op=ReduceOp.PRODUCT): collective computation",
            "It combines the ranks' tensors on the way (here by a product) and "
            "leaves the result on every rank.",
        ),
        (
            "dist.all_gather(out, t): collective computation",
            "all_gather moves the tensors unchanged, so it is data movement; each "
            "rank would still have to multiply.",
        ),
    ),
    question(
        "A ring all-reduce of a tensor of S bytes runs on N ranks. How many bytes "
        "does each rank send?",
        "2(N-1)/N",
        "a",
        (
            "2(N-1)/N * S",
            "2(N-1) steps of one chunk of S/N each: just under twice the tensor, "
            "whatever N.",
        ),
        (
            "(N-1) * S",
            "That is each rank sending its whole tensor to every other; the ring sends "
            "one chunk of S/N per step to one neighbour.",
        ),
        (
            "2 * (N-1) * S",
            "That sends the whole tensor in each of the 2(N-1) steps; each step sends "
            "one chunk, S/N.",
        ),
        (
            "S / N",
            "One chunk per step, but there are 2(N-1) steps: N-1 to reduce-scatter "
            "and N-1 to all-gather.",
        ),
    ),
    question(
        "You use a DistributedSampler but forget sampler.set_epoch(epoch). What "
        "happens?",
        "set_epoch",
        "b",
        (
            "Ranks read overlapping samples",
            "Each rank still gets its own share of the indices; only the order is "
            "affected.",
        ),
        (
            "Every epoch repeats the first epoch's order",
            "The sampler shuffles with seed + epoch; without set_epoch the epoch "
            "stays 0.",
        ),
        (
            "An error stops training at the second epoch",
            "Nothing complains: the mistake is silent, which is why workshop.train "
            "calls set_epoch for you.",
        ),
    ),
    question(
        "ResNet-50 has about 100 MB of gradients. Why does DDP, with its default "
        "bucket_cap_mb of 25, all-reduce them in one bucket more than 100 / 25?",
        "first bucket",
        "c",
        (
            "It all-reduces the weights of the first step in a bucket of their own",
            "DDP copies rank 0's weights once, when it wraps the model; the buckets "
            "hold only gradients.",
        ),
        (
            "It keeps one bucket spare for the optimizer's state",
            "The optimizer's state never travels: every rank steps its own optimizer "
            "with the same averaged gradients.",
        ),
        (
            "The first bucket has a cap of its own, 1 MiB",
            "So the last layers' gradients, ready first, start their all-reduce at "
            "once while backward goes on.",
        ),
        (
            "Each bucket holds gradients of one layer type only",
            "DDP fills buckets in backward order whatever the layer; only dtype and "
            "device keep gradients apart.",
        ),
    ),
    question(
        "Why does rank 0 write a checkpoint to a temporary file and then os.replace "
        "it over the old one?",
        "os.replace",
        "a",
        (
            "A job killed while writing leaves the previous checkpoint whole",
            "The rename happens in one step, so the file under the checkpoint's name "
            "is always complete.",
        ),
        (
            "It makes saving faster",
            "It writes the same bytes, and a rename besides: the point is safety, "
            "not speed.",
        ),
        (
            "So the other ranks can read the checkpoint while it is written",
            "The other ranks wait at a barrier until rank 0 is done; nobody reads a "
            "checkpoint being written.",
        ),
    ),
    question(
        "A DistributedSampler with its defaults deals 10 samples to 4 ranks. What "
        "does each rank read in one epoch?",
        "drop_last",
        "d",
        (
            "3 samples on ranks 0 and 1, 2 on ranks 2 and 3",
            "Unequal shares would give ranks unequal steps, and the rank with one "
            "more would wait in an all-reduce forever.",
        ),
        (
            "2 samples each; samples 8 and 9 are left out",
            "That is drop_last=True; by default the sampler pads the shares "
            "instead of dropping the tail.",
        ),
        (
            "Nothing: it raises an error, since 10 does not divide by 4",
            "The sampler never complains; it evens the shares out by itself.",
        ),
        (
            "3 samples each; two samples are read twice",
            "It pads to 12 by repeating the first indices, so every rank gets the "
            "same count.",
        ),
    ),
)

QUIZZES_EARLY: dict[str, tuple[str, tuple[Question, ...]]] = {
    "01": ("One node, many GPUs", QUIZ_01),
    "02": ("Distributed data parallel training", QUIZ_02),
}
