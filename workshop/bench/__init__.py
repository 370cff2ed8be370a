"""Benchmarks that print figures: ``python -m workshop.bench SUBCOMMAND``.

* ``launch``: how fast ``workshop.launch`` starts ranks on each start path, beside
  ``torchrun --standalone`` running the same no-op.
* ``train``: training samples per second of a model on one device (ResNet-50 with
  bf16 and channels_last by default), to compare with published figures.
* ``allreduce``: all-reduce time, algbw and busbw per message size, as nccl-tests
  defines them, the ring model (alpha, beta) fitted to them, and a reference memory
  copy's bandwidth.
* ``scaling``: weak and strong scaling of DDP training across world sizes, each step
  split into compute and communication, explained by the ring model.

The plots of these results (``allreduce_plots``, ``scaling_plots``,
``efficiency_plots``) live here, beside the files they read, with the published
figures they are compared with (``published``). Imports ``env``, ``comm``, ``draw``,
``ranks``, ``training`` and ``sources`` (the source documents and their tables).
"""
