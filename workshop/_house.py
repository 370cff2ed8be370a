"""Two facts of the house that wings on every floor read, each written once here:
where the package sits, and how wide a printed line may be."""

from pathlib import Path

# The folder that holds the package: in a clone, its root (notebooks/, tests/,
# scripts/ and pyproject.toml beside workshop/); in an installed copy, site-packages.
ROOT = Path(__file__).resolve().parents[1]
# Columns of every line the workshop prints: a projector's, as the code's (STYLE.md).
WIDTH = 88
