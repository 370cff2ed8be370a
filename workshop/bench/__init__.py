"""Benchmarks that print figures, from a cell or as ``python -m workshop.bench
SUBCOMMAND`` (``launch``, ``train``, ``allreduce``, ``scaling``, ``concurrent``):
all-reduce (measure_allreduce, load_allreduce, plot_allreduce; notebook 02), scaling
(measure_scaling, load_scaling, plot_scaling, plot_efficiency; notebooks 02 and 03),
and published figures to compare with (published_scaling, published_sources,
scale_sources, plot_published_busbw, plot_published_mfu). Imports ``sources``,
``comm``, ``draw``, ``ranks``, ``training`` and the base modules."""

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
