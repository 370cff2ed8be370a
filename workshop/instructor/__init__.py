"""The instructor's and the site's tools: the node check before class
(``python -m workshop check-node``), a site's Python under ``.venv``, the Jupyter kernel
spec for a site's JupyterHub, and the private portal with its classroom rehearsal.

The top wing: it may import every wing but ``lessons``, ``parallel`` and
``planner``, and nothing imports it but the package's commands.
"""
