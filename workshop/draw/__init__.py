"""Pictures from plain data: data and pipeline parallel steps, the ranks' layout,
point-to-point and collective calls, per-rank timelines, the ring, and simple plots.

Imports only ``comm`` (for its data types) from the package: it never starts ranks,
never runs a command and never imports ``torch.distributed``.
"""
