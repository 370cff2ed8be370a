"""Pictures from plain data, for a cell or a projector. Each takes what a run returned
(or a saved file) and never starts a rank.

- One node (notebook 01): draw_data_parallel_step, draw_schedule, draw_timeline,
  plot_speedup, plot_throughput.
- Communication (notebook 02): draw_rank_layout, draw_point_to_point,
  draw_collective, draw_rank_timeline, draw_ring_grid, ring_widget.
- Beyond data parallelism (notebook 04): draw_tensor_parallel.

Imports only ``comm`` (for its data types) and the base modules: it never starts ranks,
never runs a command and never imports ``torch.distributed``.
"""

from .._exports import offer

_NAMES = {
    "draw_collective": "collective_diagram",
    "draw_data_parallel_step": "diagrams",
    "draw_point_to_point": "p2p_diagram",
    "draw_rank_layout": "comm_diagrams",
    "draw_rank_timeline": "timeline_diagram",
    "draw_ring_grid": "ring_diagram",
    "draw_schedule": "diagrams",
    "draw_tensor_parallel": "tensor_diagram",
    "draw_timeline": "diagrams",
    "plot_speedup": "plots",
    "plot_throughput": "plots",
    "ring_widget": "ring_diagram",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
