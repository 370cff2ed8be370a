"""Real launchers and schedulers from a cell: torchrun and mpirun command lines run
under a keeper (no rank left behind), and Slurm batch jobs, on a real cluster or on a
private one on this machine.

Imports ``env``, ``_procs`` and ``ranks`` (its output streams) from the package.
"""
