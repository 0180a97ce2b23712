"""Advantage estimators of the PPO family (``algorithm.adv_estimator``), registered in
`rlflow.algos.estimator_registry` (whose names this module re-exports).

Shapes: ``bs`` responses of ``response_len`` tokens; every per-token tensor is ``(bs, response_len)`` and
``response_mask`` is 1 on tokens the policy generated (up to EOS), else 0. Rewards on masked tokens are
ignored, and a recursion over time skips masked tokens without breaking the chain (tool observations in the
middle of a response, padding after EOS). Every estimator takes ``**kwargs`` so a trainer can pass the same
keyword inputs to any of them. Names follow verl's ``verl.trainer.ppo.core_algos``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlflow.algos.common import check_shapes
from rlflow.algos.estimator_registry import (
    ADV_ESTIMATOR_INFO,
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    EstimatorInfo,
    get_adv_estimator_fn,
    get_estimator_info,
    register_adv_est,
)
from rlflow.protocol import DataProto
from rlflow.utils.torch_functional import masked_mean, masked_sum, masked_whiten

__all__ = [
    "ADV_ESTIMATOR_INFO",
    "ADV_ESTIMATOR_REGISTRY",
    "AdvantageEstimator",
    "EstimatorInfo",
    "advantage_metrics",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_gae_raw_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "estimator_needs_critic",
    "get_adv_estimator_fn",
    "get_estimator_info",
    "register_adv_est",
]


# ----------------------------------------------------------------------------------------------------
# Advantage estimators
# ----------------------------------------------------------------------------------------------------


def compute_gae_raw_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-sample part of GAE: un-whitened advantages and returns (see
    `compute_gae_advantage_return`). Every row depends only on itself, so any split of the batch gives the
    same rows; the critic group computes it on its shards and whitens with all-reduced statistics.

    Args:
        token_level_rewards: ``(bs, response_len)``.
        values: ``(bs, response_len)``.
        response_mask: ``(bs, response_len)``.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        ``(raw_advantages, returns)``, both ``(bs, response_len)`` and 0 on masked tokens.
    """
    check_shapes(
        "compute_gae_advantage_return", response_mask, token_level_rewards=token_level_rewards, values=values
    )
    with torch.no_grad():
        valid = response_mask.bool()
        next_value = torch.zeros_like(values[:, 0])
        running = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            running = torch.where(valid[:, t], delta + gamma * lam * running, running)
            next_value = torch.where(valid[:, t], values[:, t], next_value)
            advantages[:, t] = running
        mask = response_mask.to(values.dtype)
    return advantages * mask, (advantages + values) * mask


@register_adv_est(AdvantageEstimator.GAE, needs_critic=True, per_sample=compute_gae_raw_advantage_return)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation, Schulman et al. 2016 (arXiv:1506.02438, Eq. 16).

    ``delta_t = r_t + gamma * V(next) - V_t``; ``A_t = delta_t + gamma * lam * A(next)``, where "next" is
    the next *valid* token: masked tokens neither contribute nor break the chain, and the value
    bootstrapped across them is the next valid token's. After the last valid token V = A = 0.

    Args:
        token_level_rewards: ``(bs, response_len)``.
        values: ``(bs, response_len)`` critic values of the rollout.
        response_mask: ``(bs, response_len)``.
        gamma: discount; defaults to ``config.gamma``.
        lam: GAE lambda; defaults to ``config.lam``.
        config: algorithm config, read only when gamma / lam are None.
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_len)``; ``returns`` = raw advantages + values;
        advantages are whitened over valid tokens (``masked_whiten``); both are 0 on masked tokens.
    """
    gamma = config.gamma if gamma is None and config is not None else gamma
    lam = config.lam if lam is None and config is not None else lam
    if gamma is None or lam is None:
        raise ValueError(
            "compute_gae_advantage_return needs gamma and lam (arguments or algorithm.gamma / .lam)"
        )
    raw, returns = compute_gae_raw_advantage_return(token_level_rewards, values, response_mask, gamma, lam)
    with torch.no_grad():
        advantages = masked_whiten(raw, response_mask) * response_mask.to(raw.dtype)
    return advantages, returns


def _scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome score per response, ``(bs,)``: the sum of the rewards on valid tokens."""
    return masked_sum(token_level_rewards, response_mask, axis=-1)


def _group_ids(index: Any, batch_size: int, fn_name: str) -> torch.Tensor:
    """Map group ids (numpy object array / list / tensor) to dense ``(bs,)`` int64 ids."""
    if index is None:
        raise ValueError(f"{fn_name} needs `index`: (bs,) group ids, e.g. non_tensor_batch['uid']")
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(keys) != batch_size:
        raise ValueError(f"{fn_name}: index has {len(keys)} entries but the batch has {batch_size} responses")
    dense: dict[Any, int] = {}
    try:
        return torch.tensor([dense.setdefault(key, len(dense)) for key in keys], dtype=torch.int64)
    except TypeError as err:
        raise ValueError(f"{fn_name}: group ids in `index` must be hashable ({err})") from err


def _group_mean_std_size(
    scores: torch.Tensor, index: Any, fn_name: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample ``(group mean, group unbiased std, group size)``, each ``(bs,)``.

    A group of one response gets mean 0 and std 1 (as verl), so its advantage is its own score.
    """
    gid = _group_ids(index, scores.shape[0], fn_name).to(scores.device)
    n_groups = int(gid.max().item()) + 1 if gid.numel() else 0
    zeros = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    size = zeros.index_add(0, gid, torch.ones_like(scores))
    mean = zeros.index_add(0, gid, scores) / size
    sq_dev = zeros.index_add(0, gid, (scores - mean[gid]) ** 2)
    std = torch.sqrt(sq_dev / (size - 1).clamp_min(1))
    single = size == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gid], std[gid], size[gid]


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage, Shao et al. 2024 (DeepSeekMath, arXiv:2402.03300, Sec. 4.1.2).

    ``A_i = (r_i - mean_g) / (std_g + epsilon)`` over the responses of the same group (unbiased std), or
    ``r_i - mean_g`` when ``norm_adv_by_std_in_grpo`` is False (Dr. GRPO, Liu et al. 2025,
    arXiv:2503.20783). A group of one response uses mean 0, std 1. ``A_i`` is broadcast over the
    response's valid tokens.

    Args:
        token_level_rewards: ``(bs, response_len)``; the score ``r_i`` is the sum over valid tokens.
        response_mask: ``(bs, response_len)``.
        index: ``(bs,)`` numpy object array of group ids (the prompt uid).
        epsilon: added to the std.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr. GRPO).
        config: algorithm config (unused; accepted for a uniform signature).
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_len)`` tensor twice, 0 on masked tokens.
    """
    fn_name = "compute_grpo_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        mean, std, _ = _group_mean_std_size(scores, index, fn_name)
        scores = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out advantage, Ahmadian et al. 2024 (arXiv:2402.14740, Eq. 4; Kool et al. 2019).

    For a group of ``n > 1`` responses, ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g)``;
    a group of one keeps ``A_i = r_i``. ``A_i`` is broadcast over the valid tokens.

    Args:
        token_level_rewards: ``(bs, response_len)``; the score is the sum over valid tokens.
        response_mask: ``(bs, response_len)``.
        index: ``(bs,)`` numpy object array of group ids.
        epsilon: unused (verl signature).
        config: unused.
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_len)`` tensor twice, 0 on masked tokens.
    """
    fn_name = "compute_rloo_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        mean, _, size = _group_mean_std_size(scores, index, fn_name)
        scores = torch.where(size > 1, (scores - mean) * size / (size - 1).clamp_min(1), scores)
        advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient advantage, Chu et al. 2025 ("GPG: a simple and strong reinforcement
    learning baseline for model reasoning"), as verl computes it.

    ``A_i = alpha * (r_i - mean_g) / f_norm`` with ``alpha = B / #{i : r_i != 0}`` over the whole batch of
    ``B`` responses (it scales the gradient up when few responses carry a reward); ``mean_g`` is the group
    mean (0 for a group of one). No division by the group std. ``A_i`` is broadcast over the valid tokens.
    Use it with ``policy_loss.loss_mode=gpg`` (no ratio, no clipping).

    Args:
        token_level_rewards: ``(bs, response_len)``; the score is the sum over valid tokens.
        response_mask: ``(bs, response_len)``.
        index: ``(bs,)`` numpy object array of group ids.
        epsilon: unused (verl signature).
        f_norm: divides the advantages (verl's default 1).
        alpha: unused: verl's signature has it, its value is always the batch ratio above.
        config: unused.
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_len)`` tensor twice, 0 on masked tokens.
    """
    fn_name = "compute_gpg_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    if not f_norm > 0:
        raise ValueError(f"{fn_name}: f_norm must be > 0, got {f_norm}")
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        mean, _, _ = _group_mean_std_size(scores, index, fn_name)
        ratio = scores.shape[0] / max(1, int(torch.count_nonzero(scores)))
        advantages = (ratio * (scores - mean) / f_norm).unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ advantage, Hu 2025 (arXiv:2501.03262, Sec. 3): discounted return, batch-whitened.

    ``G_t = r_t + gamma * G(next)`` over valid tokens, "next" being the next valid token (masked tokens
    are skipped, as in GAE; verl instead resets the return at a masked token, which differs only for
    masked tokens in the middle of a response). Advantages are ``G`` whitened over all valid tokens.

    Args:
        token_level_rewards: ``(bs, response_len)``.
        response_mask: ``(bs, response_len)``.
        config: algorithm config; ``config.gamma`` is used when ``gamma`` is None.
        gamma: discount (overrides ``config.gamma``).
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``, ``(bs, response_len)``, 0 on masked tokens.
    """
    fn_name = "compute_reinforce_plus_plus_outcome_advantage"
    gamma = config.gamma if gamma is None and config is not None else gamma
    if gamma is None:
        raise ValueError(f"{fn_name} needs gamma (argument or algorithm.gamma)")
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    with torch.no_grad():
        valid = response_mask.bool()
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            running = torch.where(valid[:, t], token_level_rewards[:, t] + gamma * running, running)
            returns[:, t] = running
        mask = response_mask.to(returns.dtype)
        returns = returns * mask
        advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline, Hu 2025 (arXiv:2501.03262, "REINFORCE++-baseline").

    ``A_i = r_i - mean_g`` (mean 0 for a group of one), broadcast over valid tokens, then whitened over
    all valid tokens of the batch.

    Args:
        token_level_rewards: ``(bs, response_len)``; the score is the sum over valid tokens.
        response_mask: ``(bs, response_len)``.
        index: ``(bs,)`` numpy object array of group ids.
        epsilon: unused (verl signature).
        config: unused.
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_len)`` tensor twice, 0 on masked tokens.
    """
    fn_name = "compute_reinforce_plus_plus_baseline_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    with torch.no_grad():
        scores = _scores(token_level_rewards, response_mask)
        mean, _, _ = _group_mean_std_size(scores, index, fn_name)
        mask = response_mask.to(scores.dtype)
        advantages = (scores - mean).unsqueeze(-1) * mask
        advantages = masked_whiten(advantages, response_mask) * mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REMAX, needs_baselines=True)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax advantage, Li et al. 2023 (arXiv:2310.10505, Algorithm 1): greedy-rollout reward baseline.

    ``G_t = sum_{s >= t} mask_s * r_s`` (undiscounted reward-to-go); ``A_t = G_t - b`` on valid tokens,
    where ``b`` is the reward of the greedy response to the same prompt.

    Args:
        token_level_rewards: ``(bs, response_len)``.
        reward_baselines: ``(bs,)`` greedy-response rewards.
        response_mask: ``(bs, response_len)``.
        config: unused.
        **kwargs: other advantage inputs, ignored.

    Returns:
        ``(advantages, returns)``, ``(bs, response_len)``, 0 on masked tokens.
    """
    fn_name = "compute_remax_outcome_advantage"
    check_shapes(fn_name, response_mask, token_level_rewards=token_level_rewards)
    if reward_baselines is None or tuple(reward_baselines.shape) != tuple(response_mask.shape[:1]):
        got = None if reward_baselines is None else tuple(reward_baselines.shape)
        raise ValueError(
            f"{fn_name}: reward_baselines must be (bs,)={tuple(response_mask.shape[:1])}, got {got}"
        )
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        rewards = torch.where(
            response_mask.bool(), token_level_rewards, torch.zeros_like(token_level_rewards)
        )
        returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
        advantages = returns - reward_baselines.unsqueeze(-1) * mask
    return advantages, returns


# ----------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------
# One entry point for the whole batch
# ----------------------------------------------------------------------------------------------------


def estimator_needs_critic(adv_estimator: str) -> bool:
    """Whether ``algorithm.adv_estimator`` uses critic values (its registration says so)."""
    return get_estimator_info(str(adv_estimator)).needs_critic


def compute_advantage(
    data: DataProto, algorithm: Any, custom_fn: Callable[..., Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of a whole batch: the registry estimator or the user's custom function.

    Called where the whole batch is at hand: by the driver without a critic (group estimators see whole
    groups), and by the critic group on the gathered batch for estimators without a per-sample form.
    Every estimator receives the same keyword inputs: ``token_level_rewards``, ``response_mask``,
    ``values`` (estimators registered with ``needs_critic``), ``index`` (group ids),
    ``reward_baselines`` (``needs_baselines``), ``gamma``, ``lam``, ``norm_adv_by_std_in_grpo`` and
    ``config``.

    Args:
        data: batch with ``token_level_rewards``, ``response_mask``: (bs, response_len); optional
            ``values`` (bs, response_len), ``reward_baselines`` (bs,); non-tensor ``uid`` (bs,).
        algorithm: the ``algorithm`` section (``adv_estimator``, ``gamma``, ``lam``, ...).
        custom_fn: the loaded custom advantage function (replaces the registry estimator).

    Returns:
        ``(advantages, returns)``, each (bs, response_len).
    """
    batch = data.batch
    keys = batch.keys()
    index = data.non_tensor_batch.get("uid")
    if index is None:
        index = np.arange(len(data), dtype=object)
    inputs = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"],
        "values": batch["values"] if "values" in keys else None,
        "index": index,
        "config": algorithm,
    }
    with torch.no_grad():
        if custom_fn is not None:
            return custom_fn(**inputs)
        estimator = str(algorithm.adv_estimator)
        info = get_estimator_info(estimator)
        if info.needs_critic and inputs["values"] is None:
            raise ValueError(
                f"algorithm.adv_estimator={estimator} needs critic values but the batch has none"
            )
        if not info.needs_critic:
            inputs.pop("values")
        extra = {
            "gamma": algorithm.gamma,
            "lam": algorithm.lam,
            "norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std_in_grpo,
        }
        if info.needs_baselines:
            if "reward_baselines" not in keys:
                raise ValueError(
                    f"algorithm.adv_estimator={estimator} needs reward_baselines (greedy-response rewards)"
                )
            extra["reward_baselines"] = batch["reward_baselines"]
        return get_adv_estimator_fn(estimator)(**inputs, **extra)


def advantage_metrics(data: DataProto, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """``critic/{advantages,returns,values}/{mean,max,min}`` over valid tokens of the whole batch."""
    mask = data.batch["response_mask"].bool()
    out: dict[str, float] = {}
    series = {"advantages": advantages, "returns": returns}
    if "values" in data.batch.keys():
        series["values"] = data.batch["values"]
    for name, t in series.items():
        valid = t[mask]
        if valid.numel() == 0:
            continue
        out[f"critic/{name}/mean"] = float(masked_mean(t, mask.to(t.dtype)))
        out[f"critic/{name}/max"] = float(valid.max())
        out[f"critic/{name}/min"] = float(valid.min())
    return out


import rlflow.algos.group_advantages  # noqa: E402, F401  (registers OPO, pass@k and verl's vectorized names)
