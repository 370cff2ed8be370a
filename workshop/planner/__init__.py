"""The layout planner (notebook 04, section 8): what one GPU of a model split over many
holds and how long its step takes, each term a formula with its source.

- The question: ModelShape, model_shape, MODELS, Layout, GPUS, NETWORKS,
  build_transformer (the very module the formulas count).
- The formula sheet: stage_record, every operation one GPU of a stage runs, each at
  its own shape; memory and time both read it.
- The answer: estimate (memory and step time per GPU), best_layouts (every layout of
  N GPUs that fits, ranked), zero_bytes (ZeRO's table); plan and explore show them.
- Checked against the world: PUBLISHED_RUNS, against_published, published_table and
  plot_against_published set fourteen published training runs beside the
  estimate; step_breakdown splits one run's step into its parts.
- The machine at hand: calibrate (``python -m workshop.planner calibrate``) measures
  it as a Calibration (load_calibration reads one back), and
  job_time_against_estimate sets a job's measured step beside the estimate.
- Run for real: write_job writes a torchrun batch script and the plan its ranks
  build with PyTorch's own pieces; job_figures and job_against_estimate read what
  the ranks measured and set it beside the estimate.
- Checked against PyTorch: fake_run runs one rank of a world of thousands on the fake
  backend with the real FSDP2 and DTensor (fake_features: what this torch has), and
  compare sets it beside the estimate; measure_layout and measured_against_estimate
  train the same model on real ranks.

Imports ``comm`` (DDP's buckets), ``draw``, ``ranks`` (inside a rank, for the
measured run), ``training`` (the models) and the base modules. The estimate itself
imports no launching code.
"""

from .._exports import offer

_NAMES = {
    "against_published": "published_runs",
    "best_layouts": "estimator",
    "build_transformer": "transformer",
    "calibrate": "calibrating",
    "Calibration": "calibration",
    "job_time_against_estimate": "job_time",
    "load_calibration": "calibration",
    "stage_record": "operations",
    "compare": "fake_compare",
    "estimate": "estimator",
    "explore": "report",
    "fake_features": "fake_world",
    "fake_run": "fake_world",
    "GPUS": "hardware",
    "job_against_estimate": "job",
    "job_figures": "job",
    "Layout": "layout",
    "measure_layout": "measured",
    "measured_against_estimate": "measured",
    "model_shape": "layout",
    "MODELS": "layout",
    "ModelShape": "layout",
    "NETWORKS": "hardware",
    "plan": "report",
    "plot_against_published": "published_runs",
    "PUBLISHED_RUNS": "published_runs",
    "step_breakdown": "published_runs",
    "published_table": "published_runs",
    "write_job": "job",
    "zero_bytes": "memory",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
