"""What ranks exchange (notebook 02), as plain data and cost.

- The calls a run made (``launch(..., trace=True)``): collectives, communication_kind.
- The ring all-reduce: ring_all_reduce_steps (step by step, as data),
  ring_all_reduce (over send and recv, inside a rank), ring_all_reduce_time (the
  alpha-beta cost model).
- DDP's gradient buckets: gradient_bytes, plan_buckets (the plan), count_ddp_buckets
  and timed_ddp_steps (inside a rank: DDP's own), ddp_timeline (their picture's data).

Imports only the base modules from the package: never a launcher.
"""

from .._exports import offer

_NAMES = {
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
