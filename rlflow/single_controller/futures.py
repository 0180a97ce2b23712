"""``DataProtoFuture``: the result of a non-blocking worker-group call, still in Ray's object store.

It holds the object refs of the per-shard outputs and how many samples each shard holds, and is re-split
**by sample index**: a consumer that shards the batch differently from the producer still receives
exactly its samples, and the data goes from worker to worker without passing through the driver (the
workers resolve their `FutureSlice` themselves).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlflow.protocol import DataProto

__all__ = ["DataProtoFuture", "FutureSlice"]


@dataclass
class FutureSlice:
    """Samples ``[start, end)`` of the concatenation of some producer shards, still in the object store.

    ``parts`` lists ``(object_ref, shard_start, shard_end)``: which rows of which shard to take, in order.
    Workers resolve it themselves (see :meth:`resolve`); the driver only moves the refs.
    """

    parts: list[tuple[Any, int, int]]
    meta_info: dict = field(default_factory=dict)

    def resolve(self) -> DataProto:
        import ray

        shards = ray.get([ref for ref, _, _ in self.parts]) if self.parts else []
        pieces = [_as_dataproto(shard).slice(s, e) for shard, (_, s, e) in zip(shards, self.parts)]
        out = DataProto.concat(pieces)
        out.meta_info.update(self.meta_info)
        return out


def _as_dataproto(obj: Any) -> DataProto:
    if isinstance(obj, DataProto):
        return obj
    raise TypeError(f"a future's shard resolved to {type(obj).__name__}, expected DataProto")


@dataclass
class DataProtoFuture:
    """The not-yet-fetched result of a non-blocking, data-parallel call.

    Args:
        refs: one object ref per producer shard, in sample order.
        shard_sizes: number of samples each shard holds (including dispatch padding).
        start / end: the global sample range this future stands for (padding excluded).
        watch: ``(ref, group name, rank)`` of the producer ranks whose output is not part of the
            future (sequence-parallel peers of the collect ranks). They return None; the driver waits on
            them next to its next blocking call, so a failing peer surfaces as its own error instead of
            leaving its collect rank (and every consumer) blocked in a collective.
        rows: when set (`take`), sample ``i`` of this future is sample ``rows[i]`` of ``[start, end)``,
            so a redrawn batch (rows repeated, left out or reordered) is routed like the plain one.
    """

    refs: list[Any]
    shard_sizes: list[int]
    start: int = 0
    end: int | None = None
    collect_fn: Callable[[list[DataProto]], DataProto] | None = None
    watch: list[tuple[Any, str, int]] = field(default_factory=list)
    rows: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.refs) != len(self.shard_sizes):
            raise ValueError(f"{len(self.refs)} refs but {len(self.shard_sizes)} shard sizes")
        if self.end is None:
            self.end = sum(self.shard_sizes)

    def __len__(self) -> int:
        return self.end - self.start if self.rows is None else len(self.rows)

    def take(self, indices: Sequence[int] | np.ndarray) -> DataProtoFuture:
        """The future of samples ``indices`` of this one, in that order (repeats allowed); nothing is
        fetched: the consumers resolve the same shards, row by row."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and not (idx.min() >= 0 and idx.max() < len(self))):
            raise IndexError(f"take: indices must be a (k,) array within [0, {len(self)})")
        rows = idx if self.rows is None else self.rows[idx]
        return DataProtoFuture(
            self.refs, self.shard_sizes, self.start, self.end, watch=list(self.watch), rows=rows
        )

    def slice_by_index(self, start: int, end: int) -> FutureSlice:
        """The refs (and rows within them) that hold samples ``[start, end)`` of this future."""
        if not 0 <= start <= end <= len(self):
            raise IndexError(f"range [{start}, {end}) outside a future of {len(self)} samples")
        if self.rows is not None:
            return self._take_parts(self.rows[start:end])
        lo, hi = self.start + start, self.start + end
        parts, offset = [], 0
        for ref, size in zip(self.refs, self.shard_sizes):
            s, e = max(lo, offset), min(hi, offset + size)
            if s < e:
                parts.append((ref, s - offset, e - offset))
            offset += size
        return FutureSlice(parts=parts)

    def _take_parts(self, rows: np.ndarray) -> FutureSlice:
        """Parts reading ``rows`` (of ``[start, end)``) in order; consecutive rows of a shard share a part."""
        offsets = np.cumsum([0, *self.shard_sizes])
        parts: list[tuple[Any, int, int]] = []
        last_shard = -1
        for row in (rows + self.start).tolist():
            shard = int(np.searchsorted(offsets, row, side="right")) - 1
            local = row - int(offsets[shard])
            if shard == last_shard and parts[-1][2] == local:
                parts[-1] = (parts[-1][0], parts[-1][1], local + 1)
            else:
                parts.append((self.refs[shard], local, local + 1))
            last_shard = shard
        return FutureSlice(parts=parts)

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """Split by sample index into ``chunks`` equal futures (length must be divisible)."""
        n = len(self)
        if chunks <= 0 or n % chunks:
            raise ValueError(f"DataProtoFuture.chunk: {n} samples not divisible into {chunks} chunks")
        step = n // chunks
        if self.rows is not None:
            return [self.take(np.arange(i * step, (i + 1) * step)) for i in range(chunks)]
        return [
            DataProtoFuture(
                self.refs,
                self.shard_sizes,
                self.start + i * step,
                self.start + (i + 1) * step,
                watch=list(self.watch),
            )
            for i in range(chunks)
        ]

    def split_sizes(self, sizes: Sequence[int]) -> list[FutureSlice]:
        """Consecutive slices of the given sizes (they must add up to ``len(self)``)."""
        if sum(sizes) != len(self):
            raise ValueError(f"split sizes {list(sizes)} do not add up to {len(self)} samples")
        bounds = np.cumsum([0, *sizes])
        return [self.slice_by_index(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    def get(self) -> DataProto:
        """Fetch into the calling process (the driver, when called there)."""
        return self.slice_by_index(0, len(self)).resolve()
