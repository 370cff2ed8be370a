"""python -m workshop.sources index FOLDER: remake numbers.json from the documents."""

import sys

from .documents import write_index

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "index":
        sys.exit("usage: python -m workshop.sources index FOLDER (shared/sources)")
    print(write_index(sys.argv[2]))
