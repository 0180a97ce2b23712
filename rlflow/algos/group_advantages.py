"""More group-relative outcome estimators under verl's names: OPO, GRPO pass@k, and verl's vectorized
spellings of GRPO and RLOO.

Registered when `rlflow.algos.advantages` is imported (it imports this module last). Each takes the
``(bs, response_len)`` rewards and mask and the ``(bs,)`` group ids (the prompt's ``uid``) and returns
the same ``(bs, response_len)`` advantages twice (no critic: returns = advantages), 0 on masked tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlflow.algos.advantages import (
    _group_ids,
    _group_mean_std_size,
    _scores,
    compute_grpo_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from rlflow.algos.common import check_shapes
from rlflow.algos.estimator_registry import AdvantageEstimator, register_adv_est

__all__ = [
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
]


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy RL with the optimal reward baseline (OPO), Hao et al. 2025 (arXiv:2505.23585).

    ``A_i = r_i - b_g`` with the length-weighted baseline ``b_g = sum_j l_j r_j / sum_j l_j`` over the
    group's responses (``l_j`` its valid tokens: the baseline that minimises the variance of a
    sequence-level gradient whose token terms add up); a group of one has ``b_g = 0``.

    Args:
        token_level_rewards: ``(bs, response_len)``; the score ``r_i`` is the sum over valid tokens.
        response_mask: ``(bs, response_len)``.
        index: ``(bs,)`` group ids.
        epsilon / config: unused (verl's signature).
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_len)`` tensor twice.
    """
    fn_name = "compute_opo_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        lengths = response_mask.to(scores.dtype).sum(-1)
        gid = _group_ids(index, scores.shape[0], fn_name).to(scores.device)
        zeros = torch.zeros(
            int(gid.max()) + 1 if gid.numel() else 0, dtype=scores.dtype, device=scores.device
        )
        size = zeros.index_add(0, gid, torch.ones_like(scores))
        weighted = zeros.index_add(0, gid, lengths * scores)
        total = zeros.index_add(0, gid, lengths)
        baseline = torch.where((size > 1) & (total > 0), weighted / total.clamp_min(1), 0.0)
        advantages = (scores - baseline[gid]).unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO for pass@k, Chen et al. 2025 (arXiv:2503.19595): only each group's best response learns.

    The best response of a group gets ``A = r_max - r_second`` (the gain of the best over the rest,
    divided by the group's unbiased std + ``epsilon`` with ``norm_adv_by_std_in_grpo``); every other
    response 0. A tie for the best gives 0 to all.

    Args:
        token_level_rewards: ``(bs, response_len)``; the score is the sum over valid tokens.
        response_mask: ``(bs, response_len)``.
        index: ``(bs,)`` group ids; every group needs at least 2 responses.
        epsilon: added to the std.
        norm_adv_by_std_in_grpo: divide by the group std. ``config.norm_adv_by_std_in_grpo`` wins when
            a config is given (verl reads it there).
        config: the algorithm config, or None.
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_len)`` tensor twice.

    Raises:
        ValueError: a group of one response.
    """
    fn_name = "compute_grpo_passk_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    if config is not None:
        norm_adv_by_std_in_grpo = bool(getattr(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo))
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        _, std, size = _group_mean_std_size(scores, index, fn_name)
        if bool((size < 2).any()):
            raise ValueError(
                f"{fn_name}: pass@k needs at least 2 responses per group; a group has "
                f"{int(size.min())} (set actor_rollout_ref.rollout.n >= 2)"
            )
        gid = _group_ids(index, scores.shape[0], fn_name).to(scores.device)
        advantage = torch.zeros_like(scores)
        for g in torch.unique(gid).tolist():
            rows = torch.nonzero(gid == g).flatten()
            top = torch.topk(scores[rows], 2)
            gain = top.values[0] - top.values[1]
            if norm_adv_by_std_in_grpo:
                gain = gain / (std[rows[0]] + epsilon)
            advantage[rows[top.indices[0]]] = gain
        advantages = advantage.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``rloo_vectorized``: `compute_rloo_outcome_advantage` except that a group of one response
    gets advantage 0 (``rloo`` keeps its score), as verl's vectorized form computes it.

    Args / Returns: as `compute_rloo_outcome_advantage`.
    """
    advantages, _ = compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon, config)
    gid = _group_ids(index, advantages.shape[0], "compute_rloo_vectorized_outcome_advantage")
    shared = torch.bincount(gid)[gid] > 1  # the responses of groups of two or more
    advantages = advantages * shared.to(advantages.device, advantages.dtype).unsqueeze(-1)
    return advantages, advantages


# verl's vectorized GRPO is the same estimator (its variance floor of ``epsilon`` aside, which only
# moves groups whose std is below 1e-3): one function, two names.
register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)(compute_grpo_outcome_advantage)
