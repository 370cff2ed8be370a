"""Training beyond the loop (the loop itself, the data and the models are
``workshop.train``, ``workshop.digits``, ``workshop.SmallCNN``, ...).

- Throughput and profiles (notebook 01): time_steps, fit_step_cost,
  projected_speedup, profile_steps.
- Precision (notebook 01): float_format, low_precision_loss, saved_activation_bytes.
- Files on a file system (notebooks 01 and 05): write_image_files, ImageFiles,
  time_epochs, count_opens; packed: pack_images, PackedImages, pack_tar, TarImages.
- The profiler's schedule (notebook 05): quiet_profiler, recorded_steps,
  trace_steps, trace_files, stable_trace_name.

Imports ``ranks`` (the rank's device) and the base modules.
"""

from .._exports import offer

_NAMES = {
    "count_opens": "files",
    "fit_step_cost": "throughput",
    "float_format": "precision",
    "ImageFiles": "files",
    "low_precision_loss": "precision",
    "pack_images": "files",
    "pack_tar": "files",
    "PackedImages": "files",
    "profile_steps": "profiling",
    "projected_speedup": "throughput",
    "quiet_profiler": "profiling",
    "recorded_steps": "profiling",
    "saved_activation_bytes": "precision",
    "stable_trace_name": "profiling",
    "TarImages": "files",
    "time_epochs": "files",
    "time_steps": "throughput",
    "trace_files": "profiling",
    "trace_steps": "profiling",
    "write_image_files": "files",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
