"""Policy-gradient loss variants registered next to PPO's: GPG (no ratio), GMPO (geometric mean), SAPO
(a smooth gate instead of the clip) and CISPO (a clipped, detached importance weight).

Each takes the same arguments as `rlflow.algos.losses.compute_policy_loss_vanilla`, including the
mini-batch's global counts, and return verl's 4-tuple ``(pg_loss, pg_clipfrac, ppo_kl,
pg_clipfrac_lower)``. Importing `rlflow.algos.losses` registers them (``policy_loss.loss_mode=gpg`` /
``geo_mean`` / ``sapo`` / ``cispo``).
"""

from __future__ import annotations

from typing import Any

import torch

from rlflow.algos.common import Count, check_shapes, clamped_log_ratio
from rlflow.algos.losses import (
    _apply_is_weights,
    _clip_ratios,
    _positive_or_one,
    agg_loss,
    register_policy_loss,
)
from rlflow.utils.torch_functional import masked_mean

__all__ = [
    "compute_policy_loss_cispo",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_sapo",
]

SAPO_TAUS = (1.0, 1.05)
"""verl's defaults of ``actor.tau_pos`` / ``actor.tau_neg`` (the SAPO paper's, for Qwen3-30B-A3B)."""


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPG's policy gradient, Chu et al. 2025: ``L_t = -A_t * log_prob_t``, no ratio and no clipping
    (pair it with ``adv_estimator=gpg``), aggregated by ``agg_loss``.

    Args:
        old_log_prob: ``(bs, response_len)``; only for the ``ppo_kl`` metric.
        log_prob: ``(bs, response_len)`` current log-probs (carries the gradient).
        advantages: ``(bs, response_len)``.
        response_mask: ``(bs, response_len)``.
        loss_agg_mode / global_token_num / global_seq_num / dp_size / loss_scale_factor: see ``agg_loss``.
        config: unused.
        rollout_is_weights: ``(bs, response_len)`` weights multiplied into the per-token loss, or None.

    Returns:
        ``(pg_loss, 0, ppo_kl, 0)``: ``ppo_kl`` is the masked mean of ``old_log_prob - log_prob``.
    """
    fn_name = "compute_policy_loss_gpg"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    pg_losses = _apply_is_weights(-advantages * log_prob, rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    ppo_kl = masked_mean((old_log_prob - log_prob).detach(), response_mask)
    return pg_loss, zero, ppo_kl, zero


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GMPO, Zhao et al. 2025 (arXiv:2507.20673): PPO on the geometric mean of a sequence's token ratios.

    With ``d_t = log_prob_t - old_log_prob_t`` and ``s = sign(A_t)``, each token's log-ratio is clipped
    pessimistically in log space, ``d'_t = s * min(s * d_t, s * clip(d_t, -clip_ratio_low,
    clip_ratio_high))`` (PPO's rule, applied to ``log rho``); the sequence ratio is
    ``rho_i = exp(mean_t d'_t)`` and the sequence advantage ``A_i = mean_t A_t`` over valid tokens;
    ``L_i = -A_i * rho_i``. The loss is the mean of ``L_i`` over sequences (``loss_agg_mode`` is not used:
    the objective is per sequence) — over the whole mini-batch when ``global_seq_num`` is given, as
    ``agg_loss`` does. GMPO's paper clips wider than PPO (``clip_ratio`` 0.4 in log space).

    Args:
        old_log_prob / log_prob / advantages / response_mask: ``(bs, response_len)``.
        loss_agg_mode / global_token_num / loss_scale_factor: unused (sequence-level objective).
        config: actor config with ``clip_ratio`` (or ``clip_ratio_low`` / ``clip_ratio_high``).
        rollout_is_weights: ``(bs, response_len)`` token weights; their geometric mean per sequence
            multiplies ``L_i``. None for none.
        global_seq_num / dp_size: see ``agg_loss``.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the clip fractions count valid tokens whose
        log-ratio was clipped with a positive / negative advantage; ``ppo_kl`` is the masked mean of
        ``-d_t``.
    """
    fn_name = "compute_policy_loss_geo_mean"
    check_shapes(
        fn_name,
        response_mask,
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        rollout_is_weights=rollout_is_weights,
    )
    low, high = _clip_ratios(config, fn_name)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    clipped = torch.clamp(log_ratio, -low, high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    n_tokens = mask.sum(-1)
    valid = n_tokens > 0
    denom = n_tokens.clamp(min=1)
    seq_ratio = torch.exp((pessimistic * mask).sum(-1) / denom)
    seq_adv = (advantages * mask).sum(-1) / denom
    seq_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach().clamp(min=1e-10))
        seq_losses = seq_losses * torch.exp((log_w * mask).sum(-1) / denom)
    seq_losses = seq_losses * valid.to(seq_losses.dtype)
    if global_seq_num is None:
        pg_loss = seq_losses.sum() / valid.sum().clamp(min=1)
    else:
        pg_loss = seq_losses.sum() * dp_size / _positive_or_one(global_seq_num, seq_losses)
    was_clipped = (log_ratio != clipped).to(mask.dtype)
    pg_clipfrac = masked_mean((was_clipped * (advantages > 0)).detach(), response_mask)
    pg_clipfrac_lower = masked_mean((was_clipped * (advantages < 0)).detach(), response_mask)
    ppo_kl = masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAPO, Gao et al. 2025 (arXiv:2511.20347): a smooth trust region instead of PPO's clip.

    ``L_t = -f(r_t, tau_t) * A_t`` with the token ratio ``r_t = exp(log_prob_t - old_log_prob_t)`` and the
    gate ``f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau``, whose slope is 1 at ``r = 1`` (PPO's gradient
    there) and decays smoothly as ``r`` leaves 1 instead of dropping to 0 at a clip bound;
    ``tau_t = tau_pos`` where ``A_t > 0``, ``tau_neg`` elsewhere. Aggregated by ``agg_loss`` with
    ``loss_agg_mode`` (the paper's objective is ``seq-mean-token-mean``; verl always uses it for SAPO).

    Args:
        old_log_prob / log_prob / advantages / response_mask: ``(bs, response_len)``.
        loss_agg_mode / global_token_num / global_seq_num / dp_size / loss_scale_factor: see ``agg_loss``.
        config: actor config with ``tau_pos`` and ``tau_neg`` (verl's keys; `SAPO_TAUS` when absent).
        rollout_is_weights: ``(bs, response_len)`` weights multiplied into the per-token loss, or None.

    Returns:
        ``(pg_loss, 0, ppo_kl, 0)``: nothing is clipped; ``ppo_kl`` is the masked mean of
        ``old_log_prob - log_prob``.
    """
    fn_name = "compute_policy_loss_sapo"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    tau_pos = float(getattr(config, "tau_pos", SAPO_TAUS[0]))
    tau_neg = float(getattr(config, "tau_neg", SAPO_TAUS[1]))
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"{fn_name}: actor.tau_pos={tau_pos} and actor.tau_neg={tau_neg} must be > 0")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    tau = torch.full_like(log_ratio, tau_neg).masked_fill(advantages > 0, tau_pos)
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    pg_losses = _apply_is_weights(-gate * advantages, rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return pg_loss, zero, masked_mean(-log_ratio.detach(), response_mask), zero


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO, MiniMax 2025 (MiniMax-M1, arXiv:2506.13585, Eq. 4-5): REINFORCE weighted by the clipped
    importance ratio, which carries no gradient.

    ``L_t = -sg(clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A_t * log_prob_t``: unlike PPO's
    clip, a token whose ratio left the bounds keeps its gradient (with the bound as its weight).
    ``clip_ratio_low >= 1`` leaves the weight without a lower bound (the paper's setting: only large
    weights are cut). Aggregated by ``agg_loss``.

    Args:
        old_log_prob / log_prob / advantages / response_mask: ``(bs, response_len)``.
        loss_agg_mode / global_token_num / global_seq_num / dp_size / loss_scale_factor: see ``agg_loss``.
        config: actor config with ``clip_ratio`` (or ``clip_ratio_low`` / ``clip_ratio_high``).
        rollout_is_weights: ``(bs, response_len)`` weights multiplied into the per-token loss, or None.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the valid tokens whose weight was cut at
        either bound (verl's ``pg_clipfrac``) and at the lower bound; ``ppo_kl`` as in PPO.
    """
    fn_name = "compute_policy_loss_cispo"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    low, high = _clip_ratios(config, fn_name)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob).detach()
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = _apply_is_weights(-weight * advantages * log_prob, rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    cut = (ratio != weight).to(log_prob.dtype)
    below = (ratio < 1.0 - low).to(log_prob.dtype)
    return (
        pg_loss,
        masked_mean(cut, response_mask),
        masked_mean(-log_ratio, response_mask),
        masked_mean(below, response_mask),
    )
