"""PF-PPO in the trainer (``algorithm.use_pf_ppo``): after the advantages, the step's batch is redrawn
from its responses by score (`rlflow.algos.pf_ppo`), and both updates train on the redrawn rows.

With a critic the values, advantages and returns stay on the critic's workers: their future is redrawn
with the same rows (`DataProtoFuture.take`), so each update worker still reads its rows from the
critic's shards and nothing passes through the driver.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rlflow.algos.pf_ppo import pf_ppo_indices
from rlflow.config.schema import PFPPOConfig
from rlflow.protocol import DataProto
from rlflow.single_controller.futures import DataProtoFuture

__all__ = ["redraw_batch"]


def redraw_batch(
    batch: DataProto,
    adv: DataProtoFuture | None,
    config: PFPPOConfig,
    seed: int,
    step: int,
    balance_order: Callable[[DataProto], list[int] | None],
) -> tuple[DataProto, DataProtoFuture | None, dict[str, float]]:
    """The step's batch redrawn by PF-PPO.

    Args:
        batch: the scored responses, ``token_level_scores: (bs, response_len)``; without a critic also
            ``advantages`` and ``returns`` (they are redrawn with the rows).
        adv: the critic group's future of values, advantages and returns (None without a critic).
        config: ``algorithm.pf_ppo``.
        seed / step: ``trainer.seed`` and the global step: the key of the draw.
        balance_order: the trainer's reordering of a batch across the actor's DP ranks (None: keep the
            order); the redrawn rows are balanced again, since the draw undoes the step's balancing.

    Returns:
        ``(batch, adv, metrics)``: the redrawn batch (same size and meta info), its future, and
        ``pf_ppo/unique_fraction`` (distinct responses among the rows), ``pf_ppo/max_repeats`` (draws of
        the most drawn response) and ``pf_ppo/score/mean`` (the redrawn rows' mean score; ``critic/score/*``
        stay those of the generated responses).
    """
    scores = batch.batch["token_level_scores"].to(torch.float64).sum(-1).numpy()
    rows = pf_ppo_indices(scores, config.reweight_method, float(config.weight_pow), seed, step)
    order = balance_order(batch.select_idxs(rows))
    if order is not None:
        rows = rows[np.asarray(order)]
    drawn = batch.select_idxs(rows)
    metrics = {
        "pf_ppo/unique_fraction": float(np.unique(rows).size / rows.size),
        "pf_ppo/max_repeats": float(np.bincount(rows).max()),
        "pf_ppo/score/mean": float(scores[rows].mean()),
    }
    return drawn, (adv.take(rows) if adv is not None else None), metrics
