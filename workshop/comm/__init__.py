"""What ranks exchange (notebook 02), as plain data and cost: the calls a run made
(collectives, communication_kind) and their bytes per step (bytes_per_step), the
ring all-reduce (ring_all_reduce_steps, ring_all_reduce, ring_all_reduce_time) and
DDP's gradient buckets (gradient_bytes, plan_buckets, count_ddp_buckets,
timed_ddp_steps, ddp_timeline). Imports only the base modules from the package:
never a launcher."""

from .._exports import offer

_NAMES = {
    "bytes_per_step": "traffic",
    "collectives": "trace_data",
    "communication_kind": "kinds",
    "count_ddp_buckets": "ddp_buckets",
    "ddp_timeline": "ddp_buckets",
    "gradient_bytes": "bucket_plan",
    "plan_buckets": "bucket_plan",
    "ring_all_reduce": "ring",
    "ring_all_reduce_steps": "ring",
    "ring_all_reduce_time": "costmodel",
    "timed_ddp_steps": "ddp_buckets",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
