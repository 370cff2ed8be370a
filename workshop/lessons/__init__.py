"""The helpers of one lesson each, and the two engines every notebook ends on: the
exercises (``workshop.check``) and the quizzes (``workshop.quiz``).

- One node, many devices (notebook 01): lesson_devices, data_parallel_step,
  torch_data_parallel, TwoStageModel, pipeline_forward_backward, pipeline_schedule,
  bubble_fraction, check_split.
- Many nodes (notebook 03): compare_global_batch.
- A rank that hangs (notebook 05): flight_record, summarize_error.

Imports every wing below it but ``cluster``, ``bench`` and ``machine``.
"""

from .._exports import offer

_NAMES = {
    "bubble_fraction": "pipeline",
    "check_split": "split_check",
    "compare_global_batch": "large_batch",
    "data_parallel_step": "single_node",
    "flight_record": "stuck",
    "lesson_devices": "single_node",
    "pipeline_forward_backward": "pipeline",
    "pipeline_schedule": "pipeline",
    "summarize_error": "stuck",
    "torch_data_parallel": "single_node",
    "TwoStageModel": "pipeline",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
