"""Sequence-length balancing: dynamic micro-batching and token-balanced data-parallel chunks.

* :func:`karmarkar_karp` splits items into ``k`` sets of near-equal total length with the largest
  differencing method (Karmarkar & Karp, "The differencing method of set partitioning", 1982; the k-way
  form follows Korf, "Multi-way number partitioning", IJCAI 2009). It is a heuristic: for ``[8, 7, 6, 5, 4]``
  into 2 it gives sums 16/14 while 15/15 exists.
* :func:`rearrange_micro_batches` cuts a batch into micro-batches of at most ``max_token_len`` valid tokens
  each (dynamic batch size), with the same number of micro-batches on every data-parallel rank.
* :func:`balance_batch_across_dp` reorders a batch so that each DP rank's contiguous chunk holds about the
  same number of tokens.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDictBase

__all__ = [
    "balance_batch_across_dp",
    "balance_mini_batches_across_dp",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "karmarkar_karp",
    "rearrange_micro_batches",
    "restore_order",
    "rows_by_key",
]


def _sorted_state(parts: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """Order a state's ``(sum, items)`` partitions by decreasing sum (ties: first item index)."""
    return sorted(parts, key=lambda p: (-p[0], p[1][:1]))


def _initial_states(
    seqlen_list: Sequence[int], k: int, equal_size: bool
) -> list[list[tuple[int, list[int]]]]:
    """One state per item (free sizes), or one state per group of ``k`` consecutive sorted items (equal sizes)."""
    if not equal_size:
        return [
            _sorted_state([(int(s), [i])] + [(0, []) for _ in range(k - 1)])
            for i, s in enumerate(seqlen_list)
        ]
    order = sorted(range(len(seqlen_list)), key=lambda i: (seqlen_list[i], i))
    groups = [order[j : j + k] for j in range(0, len(order), k)]
    return [_sorted_state([(int(seqlen_list[i]), [i]) for i in group]) for group in groups]


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Largest differencing method for k-way partitioning.

    Each state holds ``k`` partitions. Repeatedly take the two states with the largest spread (max - min
    partition sum) and merge them, pairing the heaviest partition of one with the lightest of the other.
    With ``equal_size`` the initial states put one item in each partition, so every merge keeps the
    partition sizes equal.

    Args:
        seqlen_list: (n,) non-negative item sizes (e.g. valid tokens per sequence).
        k_partitions: number of partitions ``k >= 1``.
        equal_size: if True every partition gets ``n / k`` items (``n`` must be divisible by ``k``).

    Returns:
        ``k`` lists of item indices (unsorted; a partition can be empty when ``n < k``).
    """
    if equal_size and len(seqlen_list) % k_partitions != 0:
        raise ValueError(
            f"equal_size needs len(seqlen_list)={len(seqlen_list)} divisible by k_partitions={k_partitions}"
        )
    counter = itertools.count()
    heap = [
        (-(st[0][0] - st[-1][0]), next(counter), st)
        for st in _initial_states(seqlen_list, k_partitions, equal_size)
    ]
    heapq.heapify(heap)
    if not heap:
        return [[] for _ in range(k_partitions)]
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second))]
        merged = _sorted_state(merged)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(counter), merged))
    return [items for _, items in heap[0][2]]


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """Validated :func:`karmarkar_karp`: every index exactly once, no empty partition, each list sorted.

    Args:
        seqlen_list: (n,) non-negative sequence lengths.
        k_partitions: number of partitions, ``1 <= k <= n``.
        equal_size: every partition gets ``n / k`` indices.

    Returns:
        ``k`` sorted lists of indices into ``seqlen_list``.
    """
    if isinstance(k_partitions, bool) or not isinstance(k_partitions, int) or k_partitions < 1:
        raise ValueError(f"k_partitions must be a positive int, got {k_partitions!r}")
    if len(seqlen_list) < k_partitions:
        raise ValueError(
            f"cannot split {len(seqlen_list)} sequences into {k_partitions} non-empty partitions"
        )
    negative = [i for i, s in enumerate(seqlen_list) if s < 0]
    if negative:
        raise ValueError(f"seqlen_list[{negative[0]}]={seqlen_list[negative[0]]} is negative")
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    seen = sorted(i for part in partitions for i in part)
    if seen != list(range(len(seqlen_list))) or any(not part for part in partitions):
        raise RuntimeError(f"karmarkar_karp returned an invalid partition: {partitions}")
    return [sorted(part) for part in partitions]


def _group_device(group: Any) -> torch.device:
    """CPU for gloo groups, the current CUDA device for NCCL ones."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce_max(values: list[int], group: Any) -> list[int]:
    """Element-wise MAX of a small int vector over ``group``."""
    tensor = torch.tensor(values, dtype=torch.int64, device=_group_device(group))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in tensor.tolist()]


@dataclass
class _Units:
    """What micro-batching balances: single rows, or groups of rows that stay together (sized by
    ``group_tokens``) as long as there are at least as many groups as micro-batches; beyond that, rows."""

    row_tokens: list[int]
    groups: list[list[int]] | None = None
    group_tokens: list[int] | None = None

    def at(self, num: int) -> tuple[list[list[int]], list[int]]:
        """The units (row lists) and their sizes for ``num`` micro-batches."""
        if self.groups is not None and num <= len(self.groups):
            return self.groups, self.group_tokens
        return [[i] for i in range(len(self.row_tokens))], self.row_tokens

    def partition(self, num: int, max_token_len: int) -> tuple[list[list[int]], bool]:
        """Sorted row lists of ``num`` balanced micro-batches, and whether each fits ``max_token_len``."""
        units, sizes = self.at(num)
        parts = _partition(sizes, num)
        fits = _fits(sizes, parts, max_token_len)
        return [sorted(i for u in part for i in units[u]) for part in parts], fits


def _partition(seqlens: list[int], num: int) -> list[list[int]]:
    """KK partition into ``num`` micro-batches (one sequence each when ``num`` equals the batch size)."""
    if num == len(seqlens):
        return [[i] for i in range(num)]
    return get_seqlen_balanced_partitions(seqlens, num, equal_size=False)


def _fits(seqlens: list[int], partitions: list[list[int]], max_token_len: int) -> bool:
    return all(sum(seqlens[i] for i in part) <= max_token_len for part in partitions)


def _local_num_micro_batches(units: _Units, max_token_len: int, min_num: int) -> int:
    """Smallest ``num >= max(ceil(total / max_token_len), min_num)`` whose KK partition fits the budget."""
    num = max(math.ceil(sum(units.at(1)[1]) / max_token_len), min_num, 1)
    while num < len(units.row_tokens) and not units.partition(num, max_token_len)[1]:
        num += 1
    return num


def _index_batch(batch: Any, idx: list[int]) -> Any:
    """Rows ``idx`` of a TensorDict or of a dict of tensors / numpy arrays / lists."""
    if isinstance(batch, TensorDictBase):
        return batch[torch.tensor(idx, dtype=torch.long, device=batch.device)]
    if not isinstance(batch, dict):
        raise TypeError(f"batch must be a dict or TensorDict, got {type(batch).__name__}")
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value[torch.tensor(idx, dtype=torch.long, device=value.device)]
        elif isinstance(value, np.ndarray):
            out[key] = value[np.asarray(idx, dtype=np.int64)]
        elif isinstance(value, list):
            out[key] = [value[i] for i in idx]
        else:
            raise TypeError(f"batch[{key!r}] has unsupported type {type(value).__name__}")
    return out


def _check_budget(seqlens: list[int], max_token_len: int, global_max_len: int) -> None:
    """Raise on every rank when some DP rank holds a sequence longer than the token budget."""
    if global_max_len <= max_token_len:
        return
    local = [i for i, n in enumerate(seqlens) if n > max_token_len]
    where = (
        f"sample {local[0]} has {seqlens[local[0]]} tokens"
        if local
        else f"another DP rank has {global_max_len}"
    )
    raise ValueError(
        f"{where}, more than max_token_len={max_token_len} (ppo_max_token_len_per_gpu, times the Ulysses size); "
        f"raise ppo_max_token_len_per_gpu to at least the longest sequence"
    )


def _check_enough_samples(num: int, global_min_samples: int) -> None:
    if num > global_min_samples:
        raise ValueError(
            f"{num} micro-batches are needed but a DP rank has only {global_min_samples} samples "
            f"(min_num_micro_batch or the token budget ppo_max_token_len_per_gpu); give every DP rank at least "
            f"{num} samples"
        )


def _synced_partitions(units: _Units, max_token_len: int, min_num: int, dp_group: Any) -> list[list[int]]:
    """Find a micro-batch count that fits the budget on every DP rank; every rank raises or none does."""
    seqlens = units.row_tokens
    local_num = (
        _local_num_micro_batches(units, max_token_len, min_num) if max(seqlens) <= max_token_len else 1
    )
    num, neg_min_samples, global_max_len = _all_reduce_max([local_num, -len(seqlens), max(seqlens)], dp_group)
    _check_budget(seqlens, max_token_len, global_max_len)
    while True:
        _check_enough_samples(num, -neg_min_samples)
        partitions, fits = units.partition(num, max_token_len)
        (agreed,) = _all_reduce_max([num if fits else num + 1], dp_group)
        if agreed == num:
            return partitions
        num = agreed


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    items: tuple[list[list[int]], list[int]] | None = None,
) -> tuple[list[Any], list[list[int]]]:
    """Split a batch into token-balanced micro-batches of at most ``max_token_len`` valid tokens each.

    The count starts at ``max(ceil(total_tokens / max_token_len), min_num_micro_batch)`` and grows until the
    Karmarkar–Karp partition fits the budget. With ``dp_group`` (and ``same_micro_num_in_dp``) the count is
    all-reduced with MAX so every DP rank runs the same number of forward/backward passes, which FSDP's
    collectives require; the ranks then agree that the common count fits everywhere (one more tiny
    all-reduce per try). Validation errors are decided from all-reduced values, so every rank raises
    together instead of leaving the others waiting in a collective. With Ulysses SP the caller passes
    ``ppo_max_token_len_per_gpu * ulysses_sequence_parallel_size`` and the DP group (not the SP group).

    Args:
        batch: dict or TensorDict with ``attention_mask: (bs, seqlen)``; other entries are indexed by row.
        max_token_len: token budget per micro-batch (``ppo_max_token_len_per_gpu``).
        dp_group: process group of the data-parallel ranks, or None for no synchronization.
        same_micro_num_in_dp: synchronize the micro-batch count over ``dp_group``.
        min_num_micro_batch: lower bound on the number of micro-batches.
        items: ``(row groups, their token counts)`` to balance instead of single rows: each group stays in
            one micro-batch (`rlflow.models.padding.shared_prompt_items`: the samples of a prompt, counted
            as the shared packing feeds them). When the micro-batch count (the most any DP rank needs)
            exceeds the groups of a rank, that rank balances single rows. None = every row on its own,
            counted by its valid tokens.

    Returns:
        micro_batches: the row subsets of ``batch``, one per micro-batch.
        indices: for each micro-batch, the sorted row indices it holds (use :func:`restore_order`).
    """
    if max_token_len <= 0:
        raise ValueError(f"max_token_len (ppo_max_token_len_per_gpu) must be positive, got {max_token_len}")
    attention_mask = batch["attention_mask"]
    if attention_mask.dim() != 2 or attention_mask.shape[0] == 0:
        raise ValueError(
            f"batch['attention_mask'] must be a non-empty (bs, seqlen), got {tuple(attention_mask.shape)}"
        )
    seqlens = [int(n) for n in attention_mask.sum(dim=-1).tolist()]
    units = _Units(seqlens)
    if items is not None:
        groups, tokens = items[0], [int(n) for n in items[1]]
        if sorted(i for g in groups for i in g) != list(range(len(seqlens))) or len(groups) != len(tokens):
            raise ValueError("items must hold every row of the batch once, with one token count per group")
        units = _Units(seqlens, groups, tokens)
    min_num = min_num_micro_batch or 1
    if dp_group is not None and same_micro_num_in_dp:
        partitions = _synced_partitions(units, max_token_len, min_num, dp_group)
    else:
        _check_budget(seqlens, max_token_len, max(seqlens))
        num = _local_num_micro_batches(units, max_token_len, min_num)
        _check_enough_samples(num, len(seqlens))
        partitions = units.partition(num, max_token_len)[0]
    return [_index_batch(batch, part) for part in partitions], partitions


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: ``out[idx_map[i]] = i``.

    Args:
        idx_map: (n,) a permutation of ``range(n)``.

    Returns:
        (n,) the inverse permutation.
    """
    if sorted(idx_map) != list(range(len(idx_map))):
        raise ValueError(f"idx_map is not a permutation of range({len(idx_map)})")
    reverse = [0] * len(idx_map)
    for i, j in enumerate(idx_map):
        reverse[j] = i
    return reverse


def restore_order(outputs_concat: torch.Tensor, indices: Sequence[Sequence[int]]) -> torch.Tensor:
    """Put micro-batch outputs, concatenated in micro-batch order, back into the original row order.

    Args:
        outputs_concat: (bs, ...) ``torch.cat`` of the per-micro-batch outputs.
        indices: the index lists returned by :func:`rearrange_micro_batches`.

    Returns:
        (bs, ...) outputs where row ``i`` belongs to original sample ``i``.
    """
    flat = [i for part in indices for i in part]
    if len(flat) != outputs_concat.shape[0]:
        raise ValueError(f"indices cover {len(flat)} rows but outputs_concat has {outputs_concat.shape[0]}")
    reverse = torch.tensor(get_reverse_idx(flat), dtype=torch.long, device=outputs_concat.device)
    return outputs_concat[reverse]


def balance_batch_across_dp(
    seqlens: Sequence[int], world_size: int, groups: Sequence[Sequence[int]] | None = None
) -> torch.Tensor:
    """Permutation that gives each DP rank's contiguous chunk the same count and near-equal total tokens.

    Args:
        seqlens: (bs,) valid tokens per sample; ``bs`` divisible by ``world_size``.
        world_size: data-parallel size.
        groups: rows to keep on one rank and next to each other (the samples of a prompt, for shared-prompt
            packing), balanced by their summed tokens. Used when every group has the same size and their
            number is divisible by ``world_size``; otherwise the rows are balanced one by one.

    Returns:
        (bs,) long permutation; reorder the batch with it, then rank ``r`` takes rows
        ``[r * bs / world_size, (r + 1) * bs / world_size)``.
    """
    if len(seqlens) % world_size != 0:
        raise ValueError(f"batch size {len(seqlens)} is not divisible by the DP world size {world_size}")
    if groups and len(groups) % world_size == 0 and len({len(g) for g in groups}) == 1:
        weights = [sum(int(seqlens[i]) for i in g) for g in groups]
        partitions = get_seqlen_balanced_partitions(weights, world_size, equal_size=True)
        return torch.tensor([i for part in partitions for g in part for i in groups[g]], dtype=torch.long)
    partitions = get_seqlen_balanced_partitions(list(seqlens), world_size, equal_size=True)
    return torch.tensor([i for part in partitions for i in part], dtype=torch.long)


def balance_mini_batches_across_dp(
    seqlens: Sequence[int],
    world_size: int,
    mini_batch_rows: int,
    groups: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """`balance_batch_across_dp` within each mini-batch: every optimizer step trains on the rows it would
    train on unbalanced (verl's ``trainer.balance_keep_minibatch``).

    The rows ``[k * mini_batch_rows, (k + 1) * mini_batch_rows)`` form mini-batch ``k``. Each is balanced
    over the ranks on its own, and rank ``r``'s contiguous chunk holds its share of mini-batch 0, then of
    mini-batch 1, ..., which is how each rank cuts its chunk into mini-batches (consecutive slices).

    Args:
        seqlens: (bs,) valid tokens per sample.
        world_size: data-parallel size.
        mini_batch_rows: rows per mini-batch over all ranks (``ppo_mini_batch_size * rollout.n``); divides
            ``bs`` and is divisible by ``world_size``.
        groups: as in `balance_batch_across_dp`; a group must lie within one mini-batch.

    Returns:
        (bs,) long permutation; rank ``r`` takes rows ``[r * bs / world_size, (r + 1) * bs / world_size)``.
    """
    bs = len(seqlens)
    if mini_batch_rows <= 0 or bs % mini_batch_rows or mini_batch_rows % world_size:
        raise ValueError(
            f"a mini-batch of {mini_batch_rows} rows must divide the batch ({bs} rows) and be divisible by the "
            f"DP world size {world_size}"
        )
    per_rank = mini_batch_rows // world_size
    shares: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
    for start in range(0, bs, mini_batch_rows):
        stop = start + mini_batch_rows
        local = None
        if groups:
            local = [[i - start for i in g] for g in groups if start <= g[0] < stop]
            if any(not 0 <= i < mini_batch_rows for g in local for i in g):
                raise ValueError("a group of rows (a prompt's samples) straddles two mini-batches")
        order = balance_batch_across_dp(seqlens[start:stop], world_size, local) + start
        for r in range(world_size):
            shares[r].append(order[r * per_rank : (r + 1) * per_rank])
    return torch.cat([part for rank in shares for part in rank])


def rows_by_key(keys: Sequence[Any]) -> list[list[int]]:
    """Row indices grouped by equal key (e.g. the ``uid`` of a prompt's samples), in order of first appearance.

    Args:
        keys: (bs,) one hashable key per row.

    Returns:
        The groups of row indices, each in increasing order.
    """
    rows: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        rows.setdefault(key, []).append(i)
    return list(rows.values())
