"""What this machine and allocation have (``python -m workshop doctor``) and the
instructor's check of a node before class (``python -m workshop check``).

The top wing: it may import every other wing, and nothing imports it but the package.
"""
