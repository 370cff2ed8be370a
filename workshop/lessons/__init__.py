"""Helpers of one lesson each (one node, many devices; the pipeline) and the exercises
that check a learner's answer.

Imports ``env``, ``comm``, ``draw``, ``ranks`` and ``training`` from the package.
"""
