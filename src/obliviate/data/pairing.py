"""Seeded index plans: which forget and retain examples form each global micro-batch.

Every rank builds the same plan from the seed (no global RNG, no per-rank draws), then takes its
own shard, so 1 process × batch 8 and 2 processes × batch 4 see the same examples.
"""
from __future__ import annotations

from typing import Iterator

import torch


def _perm(n: int, seed: int, stream: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + stream * 7919 + epoch)
    return torch.randperm(n, generator=g).tolist()


def cycled(n: int, *, seed: int, stream: int = 0) -> Iterator[int]:
    """Endless stream of range(n) indices: seeded permutations, one after another."""
    epoch = 0
    while True:
        yield from _perm(n, seed, stream, epoch)
        epoch += 1


def batches(n: int, batch: int, *, seed: int, stream: int = 0) -> Iterator[list[int]]:
    """Endless full batches cut from `cycled`: every example once per epoch of ceil(n/batch) batches."""
    if n < 1 or batch < 1:
        raise ValueError(f"need at least one example and batch >= 1 (n={n}, batch={batch})")
    stream_it = cycled(n, seed=seed, stream=stream)
    while True:
        yield [next(stream_it) for _ in range(batch)]


def paired_batches(n_forget: int, n_retain: int, batch: int, *, seed: int) -> Iterator[tuple[list[int], list[int]]]:
    """Endless (forget indices, retain indices) pairs of equal size; retain drawn from its own seeded stream."""
    retain = cycled(n_retain, seed=seed, stream=1) if n_retain else None
    for f in batches(n_forget, batch, seed=seed, stream=0):
        yield f, ([next(retain) for _ in f] if retain is not None else [])


def shard(indices: list[int], rank: int, world: int) -> list[int]:
    """This rank's share of a global micro-batch (strided, so sizes differ by at most one)."""
    return indices[rank::world]
