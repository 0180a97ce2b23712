"""Advantages and returns computed once per step, in the critic group, on its data-parallel shards.

The dispatcher gives DP rank ``r`` rows ``[r*s, (r+1)*s)`` of the batch padded (by wrapping around) to a
multiple of the DP size; ``global_batch_size`` is the unpadded size, so the rows at index ``>= n`` are
padding and never count in a statistic.

* An estimator with a per-sample form (`rlflow.algos.advantages.EstimatorInfo.per_sample`, GAE) runs on
  each shard; whitening needs only the batch's mean and variance over valid tokens, which two
  all-reduces of float64 sums give (no gather).
* Any other estimator (a group estimator with a critic, the user's custom function) sees the whole batch:
  the shards are gathered over the DP group, the estimator runs on the exact batch, and each rank keeps
  its own rows.

`shard_advantage_metrics` reports ``critic/{advantages,returns,values}/{mean,max,min}`` and
``critic/vf_explained_var`` of the whole batch from the shards, again with all-reduces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rlflow.algos.advantages import compute_advantage, get_estimator_info
from rlflow.algos.stats import explained_variance_from_stats, explained_variance_stats
from rlflow.protocol import DataProto

__all__ = [
    "compute_advantage_on_shard",
    "distributed_masked_whiten",
    "real_rows",
    "shard_advantage_metrics",
]

ADVANTAGE_INPUTS = ("token_level_rewards", "response_mask", "values", "reward_baselines")


def _group_size(group: Any) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _all_reduce(t: torch.Tensor, group: Any, op: Any = None) -> torch.Tensor:
    if _group_size(group) > 1:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=group)
    return t


def real_rows(shard_len: int, dp_rank: int, global_batch_size: int) -> torch.Tensor:
    """``(shard_len,)`` bool: which rows of DP rank ``dp_rank``'s shard are samples, not dispatch padding.

    Args:
        shard_len: rows of this shard (equal on every rank).
        dp_rank: index of the shard.
        global_batch_size: samples of the unpadded batch.
    """
    return torch.arange(dp_rank * shard_len, (dp_rank + 1) * shard_len) < global_batch_size


def distributed_masked_whiten(values: torch.Tensor, mask: torch.Tensor, group: Any) -> torch.Tensor:
    """`rlflow.utils.torch_functional.masked_whiten` of the batch split over ``group``, shard by shard.

    Mean and unbiased variance over the valid entries of every rank's shard: one all-reduce of
    ``(count, sum)``, then one of ``sum((x - mean)^2)``, both in float64.

    Args:
        values: ``(s, response_len)`` this rank's entries.
        mask: ``(s, response_len)`` 1 where an entry counts (valid tokens of real rows).
        group: the data-parallel group (one rank per shard).

    Returns:
        ``(values - mean) / sqrt(var + 1e-8)`` on this rank's entries.
    """
    m = mask.to(torch.float64)
    x = values.to(torch.float64)
    first = _all_reduce(torch.stack([m.sum(), (x * m).sum()]), group)
    count = float(first[0])
    if count < 2:
        raise ValueError(
            f"whitening advantages needs at least 2 valid response tokens in the batch, got {count:g}"
        )
    mean = first[1] / first[0]
    sq = _all_reduce((((x - mean) ** 2) * m).sum().reshape(1), group)
    var = sq[0] / (count - 1)
    return ((x - mean) * torch.rsqrt(var + 1e-8)).to(values.dtype)


def _gathered(data: DataProto, group: Any, global_batch_size: int) -> DataProto:
    """The whole batch's advantage inputs, rebuilt on every rank from the shards (padding stripped)."""
    keys = [k for k in ADVANTAGE_INPUTS if k in data.batch.keys()]
    local = data.select(
        batch_keys=keys, non_tensor_batch_keys=[k for k in ("uid",) if k in data.non_tensor_batch]
    )
    world = _group_size(group)
    if world == 1:
        return local[:global_batch_size]
    device = local.batch["response_mask"].device
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, local.to("cpu"), group=group)  # objects travel as CPU tensors
    return DataProto.concat(parts)[:global_batch_size].to(device)


def compute_advantage_on_shard(
    data: DataProto,
    algorithm: Any,
    custom_fn: Callable[..., Any] | None,
    dp_group: Any,
    dp_rank: int,
    global_batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of this rank's rows, equal to the whole-batch computation.

    Args:
        data: this shard: ``token_level_rewards``, ``response_mask``, ``values``: (s, response_len); optional
            ``reward_baselines`` (s,) and non-tensor ``uid``.
        algorithm: the ``algorithm`` section.
        custom_fn: the user's advantage function (always computed on the gathered batch), or None.
        dp_group: the data-parallel group of the role.
        dp_rank: this rank's shard index.
        global_batch_size: samples of the unpadded batch.

    Returns:
        ``(advantages, returns)``, each ``(s, response_len)``.
    """
    info = None if custom_fn is not None else get_estimator_info(str(algorithm.adv_estimator))
    if info is not None and info.per_sample is not None:
        batch = data.batch
        mask = batch["response_mask"]
        raw, returns = info.per_sample(
            batch["token_level_rewards"], batch["values"], mask, algorithm.gamma, algorithm.lam
        )
        counted = mask * real_rows(len(data), dp_rank, global_batch_size).to(mask.device, mask.dtype)[:, None]
        advantages = distributed_masked_whiten(raw, counted, dp_group) * mask.to(raw.dtype)
        return advantages, returns
    full = _gathered(data, dp_group, global_batch_size)
    advantages, returns = compute_advantage(full, algorithm, custom_fn)
    rows = [(dp_rank * len(data) + i) % global_batch_size for i in range(len(data))]
    rows = torch.tensor(rows, device=advantages.device)
    return advantages[rows], returns[rows]


def shard_advantage_metrics(
    data: DataProto, dp_group: Any, dp_rank: int, global_batch_size: int
) -> dict[str, float]:
    """Whole-batch statistics of this role's shards (collective over ``dp_group``).

    Args:
        data: this shard with ``response_mask``, ``advantages``, ``returns`` and ``values``.
        dp_group: the data-parallel group.
        dp_rank: this rank's shard index.
        global_batch_size: samples of the unpadded batch.

    Returns:
        ``critic/{advantages,returns,values}/{mean,max,min}`` and ``critic/vf_explained_var``.
    """
    batch = data.batch
    rows = real_rows(len(data), dp_rank, global_batch_size).to(batch["response_mask"].device)
    mask = batch["response_mask"].bool() & rows[:, None]
    names = [n for n in ("advantages", "returns", "values") if n in batch.keys()]
    inf = torch.tensor(torch.inf, dtype=torch.float64, device=mask.device)
    rows_of_stats = [
        torch.stack([(x * mask).sum(), torch.where(mask, x, -inf).max(), torch.where(mask, x, inf).min()])
        for x in (batch[name].to(torch.float64) for name in names)
    ]
    count = mask.sum().to(torch.float64)
    table = torch.stack([*rows_of_stats, torch.stack([count, count, count])]).cpu()  # one host sync
    sums, highs, lows = table[:, 0].clone(), table[:-1, 1].clone(), table[:-1, 2].clone()
    _all_reduce(sums, dp_group)
    _all_reduce(highs, dp_group, dist.ReduceOp.MAX)
    _all_reduce(lows, dp_group, dist.ReduceOp.MIN)
    out: dict[str, float] = {}
    if sums[-1] > 0:
        for i, name in enumerate(names):
            out[f"critic/{name}/mean"] = float(sums[i] / sums[-1])
            out[f"critic/{name}/max"] = float(highs[i])
            out[f"critic/{name}/min"] = float(lows[i])
    if {"returns", "values"} <= set(names):
        ev = explained_variance_stats(batch["returns"], batch["values"], mask.to(torch.int64)).cpu()
        out["critic/vf_explained_var"] = explained_variance_from_stats(_all_reduce(ev, dp_group))
    return out
