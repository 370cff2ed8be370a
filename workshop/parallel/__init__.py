"""Beyond data parallelism, on real ranks: tensor parallelism of a linear layer and an
MLP block, a pipeline whose stages are ranks, sharded data parallelism (ZeRO, FSDP)
and the parameter server. Each is checked against the unsplit computation.

Imports ``env``, ``features``, ``comm``, ``ranks`` and ``training`` from the package.
"""
