"""Training: data (digits, CIFAR-10, synthetic) and loaders, models, the loop and one
step, mixed precision, checkpoints, progress, profiling and throughput.

Imports ``env`` and ``ranks`` (the rank's device) from the package.
"""
