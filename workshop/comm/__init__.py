"""What ranks exchange, as plain data and cost: traces of the calls, the ring all-reduce
step by step and over send/recv, the alpha-beta cost model, DDP's gradient buckets.

Imports only ``env``, ``features`` and ``_procs`` from the package: never a launcher.
"""
