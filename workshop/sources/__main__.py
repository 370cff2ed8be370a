"""python -m workshop.sources index FOLDER: remake numbers.json from the documents."""

import sys

from .documents import write_index

if __name__ == "__main__":
    usage = "usage: python -m workshop.sources index FOLDER (shared/sources)"
    if len(sys.argv) != 3 or sys.argv[1] != "index":
        sys.exit(usage)
    try:
        print(write_index(sys.argv[2]))
    except (OSError, ValueError) as exc:  # a folder without the documents: one line
        sys.exit(f"python -m workshop.sources index: error: {exc}")
