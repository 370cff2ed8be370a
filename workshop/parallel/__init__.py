"""Beyond data parallelism, on real ranks (notebook 04), each checked against the
unsplit computation.

- Tensor parallelism: TensorParallelMLP, check_tensor_parallel,
  column_parallel_demo, tensor_parallel_bytes.
- A pipeline whose stages are ranks: run_pipeline, schedule_order, idle_fraction.
- Sharded data parallelism: measure_zero_memory, measure_fsdp_memory, and
  check_sharded (ZeRO 1-3 and FSDP2 against the unsplit model).
- The parameter server: parameter_server, async_parameter_server,
  allreduce_baseline, sharded_parameter_server.

Each runs inside ranks that a notebook cell starts with ``workshop.launch``; none
starts ranks itself. Imports ``comm``, ``training``, ``planner`` (the ZeRO formula)
and the base modules: nothing from ``ranks``.
"""

from .._exports import offer

_NAMES = {
    "allreduce_baseline": "param_server",
    "async_parameter_server": "param_server",
    "check_tensor_parallel": "tensor_check",
    "check_sharded": "sharded",
    "column_parallel_demo": "tensor_check",
    "idle_fraction": "pipeline_schedules",
    "measure_fsdp_memory": "zero_memory",
    "measure_zero_memory": "sharded",
    "parameter_server": "param_server",
    "run_pipeline": "pipeline_ranks",
    "schedule_order": "pipeline_schedules",
    "sharded_parameter_server": "param_shards",
    "tensor_parallel_bytes": "tensor_check",
    "TensorParallelMLP": "tensor",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
