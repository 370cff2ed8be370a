"""Scaling PyTorch on HPC: the helper package the workshop's notebooks import.

Starting ranks (notebook 02 on): :func:`launch` runs a function on N real ranks from a
notebook cell and returns a :class:`RunResult`, or raises :class:`LaunchError` with
every rank stopped; :func:`process_group` is what every rank runs around the lesson's
code, whether started by ``launch``, ``torchrun``, ``srun`` or ``mpirun``;
:func:`rank_device` is the rank's device and :func:`backend_name` names the group's
backend ("nccl" for the "cpu:gloo,cuda:nccl" group that NCCL ranks get).

Training (every notebook): :func:`digits`, :func:`cifar10`, :func:`synthetic` and
:func:`make_loader` for data; :class:`SmallCNN` and :func:`resnet` for models;
:func:`train` and :func:`evaluate` for the loop.

One node, many devices (notebook 01): :func:`lesson_devices`,
:func:`data_parallel_step`, :func:`torch_data_parallel`, :class:`TwoStageModel`,
:func:`pipeline_forward_backward`, :func:`pipeline_schedule`, :func:`bubble_fraction`,
the ``draw_*`` diagrams, :func:`profile_steps`, :func:`saved_activation_bytes`,
:func:`time_steps` and the plots of measurements.

Communication (notebook 02): ``launch(..., trace=True)`` records every rank's calls;
:func:`collectives` groups them; the ``draw_*`` communication diagrams and the ring
all-reduce (:func:`ring_allreduce_steps`, :func:`ring_widget`) draw them;
:func:`has_collective` asks the installed torch whether gloo runs a collective.
:func:`timed_ddp_steps` records DDP's gradient buckets (:func:`ddp_timeline` for the
picture); :func:`save_checkpoint` and :func:`load_checkpoint` checkpoint DDP training.
:func:`communication_kind` names a call's kind (synchronisation, data movement,
collective computation); :func:`plan_buckets` (with :func:`gradient_bytes`) and
:func:`count_ddp_buckets` plan and count DDP's buckets; :func:`per_rank_batch` splits
a global batch among the ranks.

Measuring (notebooks 02 and 03): :func:`measure_allreduce` sweeps message sizes and
fits the ring model (:func:`plot_allreduce`); :func:`measure_scaling` measures weak and
strong scaling of DDP training (:func:`plot_scaling`, which also draws any published
table); :func:`load_allreduce` and :func:`load_scaling` read a batch job's results.
:func:`document_table` holds the source documents' benchmark tables as data and
:func:`plot_efficiency` draws their speed-up and efficiency beside a run's.

Beyond data parallelism (notebook 04), on real ranks, each checked against the
unsplit model: tensor parallelism (:class:`ColumnParallelLinear`,
:class:`RowParallelLinear`, :class:`TensorParallelMLP`, :func:`check_tensor_parallel`,
:func:`draw_tensor_parallel`), a pipeline whose stages are ranks
(:func:`run_pipeline`, :func:`idle_fraction`), sharded data parallelism
(:func:`measure_zero_memory`, :func:`zero_bytes`, :func:`measure_fsdp_memory`) and
the parameter server (:func:`parameter_server`, :func:`async_parameter_server`,
:func:`traffic_per_step`, with :func:`bytes_by_rank` counting traffic from traces;
:func:`sharded_parameter_server` and :func:`server_traffic` for several servers).

Planning a run at scale (notebook 04 §8): :class:`ModelShape` and :class:`Layout`
describe a model and its split (:data:`MODELS`, :data:`GPUS`, :data:`NETWORKS`,
:func:`model_shape`, :func:`build_transformer`); :func:`estimate` gives memory and step
time per GPU, each term a formula with its source, and :func:`best_layouts` ranks the
layouts that fit; :func:`fake_run` runs one rank of a world of up to thousands on
PyTorch's fake backend with the real FSDP2 and DTensor shards (:func:`fake_features`
says what this torch has), and :func:`compare` sets it beside the estimate;
:func:`measure_layout` and :func:`measured_against_estimate` check the estimate
against a real run (:func:`layout_machine`); :func:`plan`, :func:`planner`,
:func:`plot_plan` and :func:`plot_layouts` show it,
and :func:`scale_sources`, :func:`plot_published_busbw` and :func:`plot_published_mfu`
give published figures at scale to compare it with.

Many nodes (notebook 03): :func:`torchrun_command` and :func:`mpirun_command` write
launcher command lines, :func:`run_command` and :func:`run_commands` run them from a
cell (no rank left behind); :func:`slurm_cluster`, :func:`submit` and
:class:`SlurmJob` write, submit, watch and read batch jobs. :func:`mpi_installation`
and :func:`binding_lines` say which MPI is here and where its ranks run;
:func:`time_limit_minutes` reads ``--time``; :func:`module_system` and
:func:`module_load_environment` show what ``module load`` changes.
Working on a cluster (notebook 05): :func:`storage_table` prints a site's file
systems (Graham's, from document 004); :func:`write_aged_files` and
:func:`purge_dry_run` show what a scratch purge takes; :func:`quota_commands` runs a
site's quota tools; :func:`watch_allreduce` counts an interface's bytes around an
all-reduce (:func:`job_interface`, :func:`infiniband_ports`); :func:`recorded_steps`,
:func:`trace_files`, :func:`trace_steps`, :func:`stable_trace_name` and
:func:`quiet_profiler` go with ``torch.profiler``'s schedule.
:func:`doctor` tells what this machine has; :func:`check` checks an exercise;
:func:`quiz` shows the quiz that closes a notebook.
"""

from ._version import __version__ as __version__
from .bench.allreduce_bench import load_allreduce, measure_allreduce
from .bench.allreduce_plots import plot_allreduce
from .bench.efficiency_plots import plot_efficiency
from .bench.published import published_scaling, published_sources
from .bench.published_scale import scale_sources
from .bench.published_scale_plots import plot_published_busbw, plot_published_mfu
from .bench.scaling_bench import load_scaling, measure_scaling
from .bench.scaling_plots import plot_scaling
from .cluster.commands import (
    CommandError,
    CommandResult,
    free_port,
    mpirun_command,
    run_command,
    run_commands,
    srun_command,
    torchrun_command,
)
from .cluster.env_modules import module_load_environment, module_system
from .cluster.mpi_info import binding_lines, mpi_installation
from .cluster.slurm import SlurmCluster, SlurmJob, slurm_cluster, submit
from .cluster.slurm_time import scontrol_time_limit, time_limit_minutes
from .comm.bucket_plan import count_ddp_buckets, gradient_bytes, plan_buckets
from .comm.costmodel import ring_allreduce_time
from .comm.ddp_buckets import ddp_timeline, timed_ddp_steps, watch_buckets
from .comm.kinds import communication_kind
from .comm.ring import ring_allreduce_steps
from .comm.ring_collective import ring_all_reduce
from .comm.trace_data import collectives
from .comm.traffic import bytes_by_rank
from .draw.collective_diagram import draw_collective
from .draw.comm_diagrams import draw_rank_layout
from .draw.diagrams import draw_data_parallel_step, draw_schedule, draw_timeline
from .draw.p2p_diagram import draw_point_to_point
from .draw.plan_plots import plot_layouts, plot_plan
from .draw.plots import plot_speedup, plot_throughput
from .draw.ring_diagram import draw_ring_grid, draw_ring_step
from .draw.ring_view import RingWidget, ring_widget
from .draw.tensor_diagram import draw_tensor_parallel
from .draw.timeline_diagram import draw_rank_timeline
from .env import RankInfo, backend_name, rank_info, visible_gpu_count
from .features import has_collective
from .lessons.exercises import check
from .lessons.large_batch import compare_global_batch
from .lessons.pipeline import (
    TwoStageModel,
    bubble_fraction,
    pipeline_forward_backward,
    pipeline_schedule,
)
from .lessons.planner import plan
from .lessons.planner_widget import planner
from .lessons.quiz import quiz
from .lessons.single_node import data_parallel_step, lesson_devices, torch_data_parallel
from .lessons.split_check import SplitCheck, check_split
from .lessons.stuck import flight_record, summarize_error
from .machine.doctor import doctor
from .machine.interconnect import infiniband_ports, job_interface, watch_allreduce
from .machine.monitor import Monitor, admin_commands, load_samples, plot_monitor
from .machine.storage import purge_dry_run, quota_commands, write_aged_files
from .parallel.fake_compare import compare
from .parallel.fake_world import fake_features, fake_run
from .parallel.layout import (
    GPUS,
    MODELS,
    NETWORKS,
    Layout,
    ModelShape,
    model_shape,
)
from .parallel.layout_estimate import estimate
from .parallel.layout_measured import (
    layout_machine,
    measure_layout,
    measured_against_estimate,
)
from .parallel.layout_modules import build_transformer
from .parallel.layout_search import best_layouts
from .parallel.param_server import (
    allreduce_baseline,
    async_parameter_server,
    parameter_server,
    traffic_per_step,
)
from .parallel.param_shards import server_traffic, sharded_parameter_server
from .parallel.pipeline_ranks import idle_fraction, run_pipeline, schedule_order
from .parallel.sharded import check_zero_stage1, measure_zero_memory
from .parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelMLP,
)
from .parallel.tensor_check import (
    check_tensor_parallel,
    column_parallel_demo,
    tensor_parallel_bytes,
)
from .parallel.zero_memory import measure_fsdp_memory, zero_bytes
from .ranks.launcher import LaunchError, RunResult, launch
from .ranks.worker import process_group, rank_device
from .sources.storage import storage_table
from .sources.tables import document_table, document_tables
from .training.batches import per_rank_batch
from .training.checkpoint import load_checkpoint, save_checkpoint
from .training.data import cifar10, digits, make_loader, synthetic, time_loader
from .training.files import ImageFiles, count_opens, time_epochs, write_image_files
from .training.files_packed import PackedImages, TarImages, pack_images, pack_tar
from .training.loop import evaluate, train, train_step
from .training.models import SmallCNN, count_parameters, resnet
from .training.precision import (
    float_format,
    low_precision_loss,
    saved_activation_bytes,
)
from .training.profiler_schedule import (
    quiet_profiler,
    recorded_steps,
    stable_trace_name,
    trace_files,
    trace_steps,
)
from .training.profiling import profile_steps
from .training.progress import History, Progress
from .training.throughput import fit_step_cost, projected_speedup, time_steps

__all__ = [
    "GPUS",
    "MODELS",
    "NETWORKS",
    "ColumnParallelLinear",
    "CommandError",
    "CommandResult",
    "History",
    "ImageFiles",
    "LaunchError",
    "Layout",
    "ModelShape",
    "Monitor",
    "PackedImages",
    "Progress",
    "RankInfo",
    "RingWidget",
    "RowParallelLinear",
    "RunResult",
    "SlurmCluster",
    "SlurmJob",
    "SmallCNN",
    "SplitCheck",
    "TarImages",
    "TensorParallelMLP",
    "TwoStageModel",
    "admin_commands",
    "allreduce_baseline",
    "async_parameter_server",
    "backend_name",
    "best_layouts",
    "binding_lines",
    "bubble_fraction",
    "build_transformer",
    "bytes_by_rank",
    "check",
    "check_split",
    "check_tensor_parallel",
    "check_zero_stage1",
    "cifar10",
    "collectives",
    "column_parallel_demo",
    "communication_kind",
    "compare",
    "compare_global_batch",
    "count_ddp_buckets",
    "count_opens",
    "count_parameters",
    "data_parallel_step",
    "ddp_timeline",
    "digits",
    "doctor",
    "document_table",
    "document_tables",
    "draw_collective",
    "draw_data_parallel_step",
    "draw_point_to_point",
    "draw_rank_layout",
    "draw_rank_timeline",
    "draw_ring_grid",
    "draw_ring_step",
    "draw_schedule",
    "draw_tensor_parallel",
    "draw_timeline",
    "estimate",
    "evaluate",
    "fake_features",
    "fake_run",
    "fit_step_cost",
    "flight_record",
    "float_format",
    "free_port",
    "gradient_bytes",
    "has_collective",
    "idle_fraction",
    "infiniband_ports",
    "job_interface",
    "launch",
    "layout_machine",
    "lesson_devices",
    "load_allreduce",
    "load_checkpoint",
    "load_samples",
    "load_scaling",
    "low_precision_loss",
    "make_loader",
    "measure_allreduce",
    "measure_fsdp_memory",
    "measure_layout",
    "measure_scaling",
    "measure_zero_memory",
    "measured_against_estimate",
    "model_shape",
    "module_load_environment",
    "module_system",
    "mpi_installation",
    "mpirun_command",
    "pack_images",
    "pack_tar",
    "parameter_server",
    "per_rank_batch",
    "pipeline_forward_backward",
    "pipeline_schedule",
    "plan",
    "plan_buckets",
    "planner",
    "plot_allreduce",
    "plot_efficiency",
    "plot_layouts",
    "plot_monitor",
    "plot_plan",
    "plot_published_busbw",
    "plot_published_mfu",
    "plot_scaling",
    "plot_speedup",
    "plot_throughput",
    "process_group",
    "profile_steps",
    "projected_speedup",
    "published_scaling",
    "published_sources",
    "purge_dry_run",
    "quiet_profiler",
    "quiz",
    "quota_commands",
    "rank_device",
    "rank_info",
    "recorded_steps",
    "resnet",
    "ring_all_reduce",
    "ring_allreduce_steps",
    "ring_allreduce_time",
    "ring_widget",
    "run_command",
    "run_commands",
    "run_pipeline",
    "save_checkpoint",
    "saved_activation_bytes",
    "scale_sources",
    "schedule_order",
    "scontrol_time_limit",
    "server_traffic",
    "sharded_parameter_server",
    "slurm_cluster",
    "srun_command",
    "stable_trace_name",
    "storage_table",
    "submit",
    "summarize_error",
    "synthetic",
    "tensor_parallel_bytes",
    "time_epochs",
    "time_limit_minutes",
    "time_loader",
    "time_steps",
    "timed_ddp_steps",
    "torch_data_parallel",
    "torchrun_command",
    "trace_files",
    "trace_steps",
    "traffic_per_step",
    "train",
    "train_step",
    "visible_gpu_count",
    "watch_allreduce",
    "watch_buckets",
    "write_aged_files",
    "write_image_files",
    "zero_bytes",
]
