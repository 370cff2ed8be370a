"""Ranks from a notebook cell: start them (fork server or spawn), join them into a
process group, stream their output, collect each rank's result or error, and stop every
process they started. ``worker`` is what every rank runs, under any launcher;
``session`` owns one launch from its first process to its last.

Imports ``env``, ``allocation``, ``checks``, ``features``, ``_procs`` and ``comm``
(tracing) from the package.
"""
