"""Benchmarks that print figures: ``python -m workshop.bench SUBCOMMAND``.

* ``launch``: how fast ``workshop.launch`` starts ranks on each start path, beside
  ``torchrun --standalone`` running the same no-op.
"""
