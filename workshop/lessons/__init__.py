"""The lessons, by notebook, on the two engines every notebook ends on: the exercises
(``workshop.check``: ``exercises.py`` with ``judges.py``) and the quizzes
(``workshop.quiz``: ``quiz.py`` with ``questions.py``). ``notebook01.py`` to
``notebook05.py`` hold each notebook's exercises and quiz; ``notebook01_devices.py``
and its like hold the helpers of one notebook's lessons.

The learner's record of the exercises, quizzes and cells (``learner_record.py``; the
kernel's hook after each cell in ``notebook_place.py``; ``board_client.py`` posts it
to a portal's class board) and its table and raised hand (``progress.py``:
``workshop.progress``, ``raise_hand``, ``lower_hand``, ``hand``).

- One node, many devices (notebook 01): lesson_devices, data_parallel_step,
  torch_data_parallel, TwoStageModel, pipeline_forward_backward, pipeline_schedule,
  bubble_fraction, check_split; the compiled path: compile_backend, break_even,
  compile_break_even and ddp_compiled_graphs (notebook 02).
- Many nodes (notebook 03): compare_global_batch, plot_api_times.
- A rank that hangs (notebook 05): flight_record, summarize_error.
- Conclusions computed from a cell's own measured figures (notebooks 01 to 05):
  rate_ratio, fastest, bucket_trend, scaling_verdict, starved_device, batch_verdicts.

Imports every wing below it but ``cluster``, ``bench`` and ``machine``.
"""

from .._exports import offer

_NAMES = {
    "batch_verdicts": "verdicts",
    "break_even": "notebook01_compiled",
    "bubble_fraction": "notebook01_pipeline",
    "bucket_trend": "verdicts",
    "check_split": "notebook01_split",
    "compile_backend": "notebook01_compiled",
    "compile_break_even": "notebook01_compiled",
    "compare_global_batch": "notebook03_batches",
    "data_parallel_step": "notebook01_devices",
    "ddp_compiled_graphs": "notebook01_compiled",
    "fastest": "verdicts",
    "flight_record": "notebook05_stuck",
    "lesson_devices": "notebook01_devices",
    "pipeline_forward_backward": "notebook01_pipeline",
    "pipeline_schedule": "notebook01_pipeline",
    "plot_api_times": "notebook03_tables",
    "rate_ratio": "verdicts",
    "scaling_verdict": "verdicts",
    "starved_device": "verdicts",
    "summarize_error": "notebook05_stuck",
    "torch_data_parallel": "notebook01_devices",
    "TwoStageModel": "notebook01_pipeline",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
