"""A seeded, epoch-aware sampler and a data loader whose position goes into checkpoints.

``StatefulSampler`` orders an epoch by ``numpy.random.default_rng([seed, epoch]).permutation(n)`` (or in
order without shuffling) and remembers ``(epoch, offset)``: how far the current epoch has been consumed.
``StatefulDataLoader`` advances that offset by one batch each time it hands a batch out (prefetching workers
do not move it); handing out the last batch of an epoch moves the position to the start of the next epoch,
so ``epoch`` in the state is the epoch a resumed run is in. Saving ``state_dict()`` after step ``k``
and loading it into a fresh loader continues with exactly the batch an uninterrupted run would get, also
across epoch boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = ["StatefulDataLoader", "StatefulSampler"]


class StatefulSampler(Sampler[int]):
    """Seeded per-epoch order with a resumable position.

    Args:
        num_samples: dataset length ``n``.
        shuffle: permute each epoch; else ``0..n-1``.
        seed: base seed; epoch ``e`` uses ``default_rng([seed, e])``.
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0):
        if num_samples <= 0:
            raise ValueError(f"StatefulSampler: num_samples={num_samples} must be positive (empty dataset?)")
        self.num_samples = int(num_samples)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.offset = 0

    def epoch_order(self, epoch: int) -> list[int]:
        """The sample order of ``epoch`` (all ``n`` indices)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples).tolist()

    def __iter__(self) -> Iterator[int]:
        """The rest of the current epoch, from ``offset`` (does not move the position)."""
        return iter(self.epoch_order(self.epoch)[self.offset :])

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict[str, Any]:
        """``epoch``, ``offset`` (samples of the epoch consumed) and the settings they depend on."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position; the settings must match (else ``ValueError`` naming the key)."""
        for key in ("seed", "shuffle", "num_samples"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"sampler state {key}={state.get(key)!r} does not match this sampler's {getattr(self, key)!r}"
                )
        if not 0 <= int(state["offset"]) <= self.num_samples:
            raise ValueError(f"sampler state offset={state['offset']} outside [0, {self.num_samples}]")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


class _FixedBatches(Sampler[list[int]]):
    """A batch sampler over precomputed batches."""

    def __init__(self, batches: Sequence[list[int]]):
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class StatefulDataLoader:
    """Batches of a dataset in :class:`StatefulSampler` order, resumable mid-epoch.

    Iterating yields the remaining batches of the current epoch, then moves the sampler to the next epoch.
    ``len()`` is the number of batches in a full epoch.

    Args:
        dataset: map-style dataset.
        batch_size: samples per batch.
        sampler: the order and position.
        collate_fn: list of items -> batch.
        drop_last: drop the last incomplete batch of each epoch.
        num_workers: ``torch.utils.data.DataLoader`` worker processes.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        sampler: StatefulSampler,
        collate_fn: Callable[[list[Any]], Any],
        drop_last: bool = True,
        num_workers: int = 0,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        if drop_last and batch_size > sampler.num_samples:
            raise ValueError(
                f"batch_size={batch_size} exceeds the dataset size {sampler.num_samples} with drop_last=True: "
                "every epoch would be empty"
            )
        self.dataset, self.batch_size, self.sampler = dataset, int(batch_size), sampler
        self.collate_fn, self.drop_last, self.num_workers = collate_fn, drop_last, num_workers

    def __len__(self) -> int:
        n = self.sampler.num_samples
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _remaining_batches(self) -> list[list[int]]:
        rest = list(iter(self.sampler))
        batches = [rest[i : i + self.batch_size] for i in range(0, len(rest), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[Any]:
        batches = self._remaining_batches()
        loader = DataLoader(
            self.dataset,
            batch_sampler=_FixedBatches(batches),
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
        )
        if not batches:
            self._next_epoch()
            return
        for k, (indices, batch) in enumerate(zip(batches, loader)):
            # Move the position before handing the batch out, so a checkpoint taken after consuming it
            # resumes after it; the last batch of an epoch moves to the next epoch.
            if k == len(batches) - 1:
                self._next_epoch()
            else:
                self.sampler.offset += len(indices)
            yield batch

    def _next_epoch(self) -> None:
        self.sampler.epoch += 1
        self.sampler.offset = 0

    def state_dict(self) -> dict[str, Any]:
        """The sampler state plus ``batch_size`` (goes into checkpoints)."""
        return {"sampler": self.sampler.state_dict(), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was taken (batch size must match)."""
        if state.get("batch_size") != self.batch_size:
            raise ValueError(f"dataloader state batch_size={state.get('batch_size')} != {self.batch_size}")
        self.sampler.load_state_dict(state["sampler"])
