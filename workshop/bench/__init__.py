"""Benchmarks that print figures, from a cell or as ``python -m workshop.bench
SUBCOMMAND`` (``launch``, ``train``, ``allreduce``, ``scaling``,
``concurrent``).

- All-reduce (notebook 02): measure_allreduce sweeps message sizes and fits the ring
  model; load_allreduce reads a batch job's result; plot_allreduce draws it.
- Scaling (notebooks 02 and 03): measure_scaling (weak and strong), load_scaling,
  plot_scaling, plot_efficiency (speed-up and efficiency beside a document's table).
- Published figures to compare with: published_scaling, published_sources,
  scale_sources, plot_published_busbw, plot_published_mfu.

Imports ``sources``, ``comm``, ``draw``, ``ranks``, ``training`` and the base modules.
"""

from .._exports import offer

_NAMES = {
    "load_allreduce": "allreduce_result",
    "load_scaling": "scaling_plots",
    "measure_allreduce": "allreduce_worker",
    "measure_scaling": "scaling_measure",
    "plot_allreduce": "allreduce_result",
    "plot_efficiency": "scaling_plots",
    "plot_published_busbw": "published_scale",
    "plot_published_mfu": "published_scale",
    "plot_scaling": "scaling_plots",
    "published_scaling": "published",
    "published_sources": "published",
    "scale_sources": "published_scale",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
