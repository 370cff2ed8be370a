"""Train notebook 01's CNN from image files staged on a node's local disk.

    python slurm/train_staged.py pack runs/data/digits-png.tar      # once
    python slurm/train_staged.py train --data DIR --results DIR     # in the job
    sbatch slurm/stage_data.sbatch                                  # both, staged

`pack` writes the digits as PNG files (train/<label>/*.png, test/<label>/*.png) and
packs them into one tar archive: the form in which a dataset should sit on a shared,
parallel file system. `train` reads the unpacked files (one open per image, which a
node's local disk serves fast), decodes them and crops each at random in DataLoader
workers, trains a few epochs and writes the results to --results.
"""

from __future__ import annotations

import argparse
import os
import tarfile
import tempfile
import time
from pathlib import Path

import torch

import workshop


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help="write the dataset as one tar archive")
    pack.add_argument("archive", type=Path)
    pack.add_argument("--size", type=int, default=16, help="image side in pixels")
    train = commands.add_parser("train", help="train from an unpacked dataset")
    train.add_argument("--data", type=Path, required=True,
                       help="the folder holding train/ and test/")  # fmt: skip
    train.add_argument("--results", type=Path, required=True)
    train.add_argument("--epochs", type=int, default=2)
    train.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    if args.command == "train" and (args.epochs < 1 or args.batch < 1):
        parser.error(
            f"--epochs and --batch must be >= 1, not {args.epochs}, {args.batch}"
        )
    return args


def pack(archive: Path, size: int) -> None:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for split in ("train", "test"):
            workshop.training.write_image_files(Path(folder) / split, split, size=size)
        workshop.training.pack_tar(folder, archive)
    with tarfile.open(archive) as tar:
        files = sum(member.isfile() for member in tar)
    print(f"packed {files} PNG files into {archive} "
          f"({archive.stat().st_size / 1e6:.1f} MB) in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to floats, with the digits' mean and standard deviation."""
    return (pixels.float() / 255 - 0.3) / 0.38


def augment(pixels: torch.Tensor) -> torch.Tensor:
    """A random window of the image padded by 2 pixels, the size of the image: each
    epoch sees every digit shifted a little (a new shift at every epoch)."""
    size = pixels.shape[-1]
    padded = torch.nn.functional.pad(pixels, (2, 2, 2, 2))
    top, left = torch.randint(0, 5, (2,)).tolist()
    return normalise(padded[:, top : top + size, left : left + size])


def train(data: Path, results: Path, epochs: int, batch: int) -> None:
    # Leave one of the job's cores to the training process, the rest load data, and
    # keep torch's threads to the cores left to it: threads that outnumber the cores
    # wait on each other.
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
    workers = max(cpus - 1, 0)
    torch.set_num_threads(max(cpus - workers, 1))
    train_set = workshop.training.ImageFiles(data / "train", transform=augment)
    test_set = workshop.training.ImageFiles(data / "test", transform=normalise)
    loader = workshop.make_loader(
        train_set, batch, shuffle=True, num_workers=workers,
        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
    )  # fmt: skip
    test_loader = workshop.make_loader(test_set, 256, shuffle=False)
    print(f"training on {len(train_set)} files from {data}")
    print(f"DataLoader workers: {workers}, torch threads: {torch.get_num_threads()}")
    torch.manual_seed(0)
    model = workshop.SmallCNN(in_channels=1, num_classes=10)
    quiet = workshop.Progress(every=None, show_speed=False)  # one line per epoch
    history = workshop.train(model, loader, epochs=epochs, eval_loader=test_loader,
                             seed=0, progress=quiet)  # fmt: skip
    results.mkdir(parents=True, exist_ok=True)
    (results / "history.txt").write_text(history.table(times=True) + "\n")
    torch.save(model.state_dict(), results / "model.pt")
    print(f"wrote history.txt and model.pt to {results}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "pack":
        pack(args.archive, args.size)
    else:
        train(args.data, args.results, args.epochs, args.batch)


if __name__ == "__main__":
    main()
