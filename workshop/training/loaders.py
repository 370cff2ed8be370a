"""Data loaders for the training lessons: :func:`make_loader` wraps any dataset of
:mod:`workshop.training.data` in a seeded ``DataLoader``, and :func:`time_loader`
measures how fast a loader delivers samples (notebook 01's data-loading lesson)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..checks import whole

__all__ = ["make_loader", "time_loader"]


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    seed: int = 0,
    sampler: Sampler | None = None,
    drop_last: bool = False,
) -> DataLoader:
    """A ``DataLoader`` whose shuffling is seeded, so every run sees the same order.

    Args:
        dataset: any map-style dataset.
        batch_size: samples per batch (per rank, under DDP).
        shuffle: reshuffle at every pass; False with a ``sampler``.
        num_workers: background processes that load batches; 0: this process.
        pin_memory: page-locked batches, so copies to a GPU overlap its compute.
        persistent_workers: keep the workers from one pass to the next.
        seed: seeds the shuffling (and, through it, the workers' random seeds).
        sampler: chooses the indices instead of ``shuffle`` (a
            ``DistributedSampler`` gives each rank its own share).
        drop_last: drop a last batch smaller than ``batch_size``.

    Returns:
        A ``DataLoader``.

    Raises:
        ValueError: a count out of range, ``persistent_workers`` without workers,
            ``shuffle`` with a sampler, or a seed that is not a whole number.
        TypeError: a dataset that is not map-style, or a switch not True or False.

    Example:
        >>> from workshop.training.data import digits
        >>> loader = make_loader(digits("train"), 64, shuffle=True)
        >>> images, labels = next(iter(loader))
        >>> tuple(images.shape)
        (64, 1, 16, 16)
    """
    whole("batch_size", batch_size, fix="e.g. batch_size=64")
    if not hasattr(dataset, "__getitem__"):  # None, a generator, an iterable
        raise TypeError(
            "dataset must be a map-style dataset (samples by index), got "
            f"{type(dataset).__name__}; e.g. make_loader(digits(), 64, shuffle=True)"
        )
    for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} must be a whole number, e.g. seed=0")
    fix = "pass 0 to load in this process or a number of worker processes"
    whole("num_workers", num_workers, least=0, fix=fix)
    if persistent_workers and num_workers == 0:
        raise ValueError(
            "persistent_workers=True keeps worker processes alive between epochs, "
            "but num_workers=0 starts none; pass num_workers=2 (or more), or "
            "persistent_workers=False"
        )
    if shuffle and sampler is not None:
        raise ValueError(
            f"shuffle=True with sampler={type(sampler).__name__}: the sampler "
            "chooses the order; pass shuffle=False (a DistributedSampler shuffles "
            "by itself, reseeded by sampler.set_epoch, which workshop's train calls)"
        )
    # A generator of the loader's own: the order depends on `seed` only, not on how
    # much of torch's global random stream the model's initialisation used.
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        drop_last=drop_last,
        generator=generator,
    )


def _batch_samples(batch: Any) -> int:
    """Number of samples in a batch: (inputs, targets), a dict, or a tensor."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    if isinstance(batch, dict):
        batch = list(batch.values())
    return len(batch[0])


def time_loader(loader: Iterable, batches: int) -> float:
    """Samples per second delivered by iterating ``loader``, doing nothing else,
    starting its workers included (``persistent_workers=True`` pays that once).

    Args:
        loader: a ``DataLoader`` (or any iterable of batches).
        batches: how many batches to time; stops earlier at the end of the data.

    Returns:
        Samples per second.

    Raises:
        ValueError: ``batches`` below 1, or the loader yielded no batch.

    Example:
        >>> from workshop.training.data import synthetic
        >>> loader = make_loader(synthetic(256, image_size=32), 32, shuffle=False)
        >>> time_loader(loader, batches=8) > 0
        True
    """
    whole("batches", batches)
    samples = 0
    start = time.perf_counter()
    for seen, batch in enumerate(loader, start=1):
        samples += _batch_samples(batch)
        if seen == batches:
            break
    seconds = time.perf_counter() - start
    if samples == 0:
        raise ValueError("the loader yielded no batch: is its dataset empty?")
    return samples / seconds
