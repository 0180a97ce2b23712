"""The order the driver gives a step's samples before it splits them among the actor's data-parallel
ranks (``trainer.balance_batch``, ``trainer.balance_keep_minibatch``)."""

from __future__ import annotations

from typing import Any

from rlflow.engine.seqlen_balancing import (
    balance_batch_across_dp,
    balance_mini_batches_across_dp,
    rows_by_key,
)
from rlflow.protocol import DataProto

__all__ = ["balance_order"]


def balance_order(batch: DataProto, config: Any, dp_size: int) -> list[int] | None:
    """The permutation that gives every actor rank a similar number of tokens.

    Args:
        batch: the step's samples, with ``attention_mask`` (and ``uid``: a prompt's samples stay together
            for shared-prompt packing).
        config: the trainer config.
        dp_size: the actor's data-parallel size.

    Returns:
        The rows' new order, or None with ``trainer.balance_batch=false``. With
        ``trainer.balance_keep_minibatch`` each mini-batch of ``ppo_mini_batch_size x rollout.n``
        consecutive rows is balanced on its own (`balance_mini_batches_across_dp`).
    """
    if not config.trainer.balance_batch:
        return None
    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    model = config.actor_rollout_ref.model
    shared = model.use_shared_prompts and model.use_remove_padding and "uid" in batch.non_tensor_batch
    groups = rows_by_key(batch.non_tensor_batch["uid"].tolist()) if shared else None  # a prompt's samples
    if config.trainer.balance_keep_minibatch:
        rows = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(
            config.actor_rollout_ref.rollout.n
        )
        return balance_mini_batches_across_dp(seqlens, dp_size, rows, groups).tolist()
    return balance_batch_across_dp(seqlens, dp_size, groups).tolist()
