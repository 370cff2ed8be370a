"""Scaling PyTorch on HPC: the helper package the workshop's notebooks import.

What a learner types in every notebook is here; the rest is reached by topic.

Ranks (notebook 02 on)
    launch(fn, world_size=N) runs ``fn`` on N real ranks from a cell (NCCL on GPUs,
    gloo on CPUs) and brings back every rank's output, result and error; it raises
    LaunchError with every rank stopped. process_group is what each rank runs around
    the lesson's code, whether started by launch, torchrun, srun or mpirun;
    rank_device, backend_name and RankInfo describe the rank.
Training (every notebook)
    digits, cifar10, make_loader, per_rank_batch; SmallCNN, resnet,
    count_parameters; train, train_step, evaluate, Progress; save_checkpoint,
    load_checkpoint. has_collective asks this torch whether gloo runs a collective.
The workshop itself
    doctor (what this machine has), check (an exercise's answer), quiz (the quiz that
    closes a notebook), progress (your exercises, quizzes and where you stopped),
    raise_hand, lower_hand and hand (ask the instructor for help, or say you are
    done: a portal's class board shows it).

Topics, each with its own table of contents (``help(workshop.draw)``):
    draw      pictures of what the ranks did (notebooks 01, 02, 04)
    comm      what ranks exchange: traces, the ring all-reduce, DDP's buckets (02)
    bench     measured all-reduce and scaling, and published figures (02, 03)
    cluster   torchrun, mpirun, Slurm and modules from a cell (03)
    parallel  tensor, pipeline and sharded parallelism, the parameter server (04)
    planner   the layout planner, checked against PyTorch (04)
    training  throughput, precision, files and the profiler's schedule (01, 05)
    machine   monitoring, the network and file systems (05)
    lessons   the helpers of one lesson each (01, 03, 05)
    sources   the source documents' tables (03, 05)

The instructor's tools are commands: ``python -m workshop --help``.
"""

from . import (
    bench,
    cluster,
    comm,
    draw,
    lessons,
    machine,
    parallel,
    planner,
    sources,
    training,
)
from ._version import __version__ as __version__
from .env import RankInfo, backend_name, rank_device
from .features import has_collective
from .lessons.exercises import check
from .lessons.notebook_place import watch_cells as _watch_cells
from .lessons.progress import hand, lower_hand, progress, raise_hand
from .lessons.quiz import quiz
from .machine.doctor import doctor
from .ranks.launcher import launch
from .ranks.session import LaunchError
from .ranks.worker import process_group
from .training.batches import per_rank_batch
from .training.checkpoint import load_checkpoint, save_checkpoint
from .training.cifar import cifar10
from .training.compiled import keep_compiled_code_in_cache as _keep_compiled
from .training.data import digits
from .training.loaders import make_loader
from .training.loop import train
from .training.models import SmallCNN, count_parameters, resnet
from .training.progress import Progress
from .training.steps import evaluate, train_step

# Before anything compiles (none of the imports above imports torch._dynamo, which
# makes the cache folder): torch.compile's cache in the user's cache folder, not a
# torchinductor_USER folder in /tmp, for this process and all it starts.
_keep_compiled()
# In a Jupyter kernel, each cell's notebook, section and error type go into the
# learner's record (workshop.progress() shows it); nothing is printed, no output
# changes. Elsewhere (a script, a rank) this does nothing.
_watch_cells()

__all__ = [
    "LaunchError",
    "Progress",
    "RankInfo",
    "SmallCNN",
    "backend_name",
    "bench",
    "check",
    "cifar10",
    "cluster",
    "comm",
    "count_parameters",
    "digits",
    "doctor",
    "draw",
    "evaluate",
    "hand",
    "has_collective",
    "launch",
    "lessons",
    "load_checkpoint",
    "lower_hand",
    "machine",
    "make_loader",
    "parallel",
    "per_rank_batch",
    "planner",
    "process_group",
    "progress",
    "quiz",
    "raise_hand",
    "rank_device",
    "resnet",
    "save_checkpoint",
    "sources",
    "train",
    "train_step",
    "training",
]
