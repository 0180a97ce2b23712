"""The REINFORCE loss of verl's bypass mode (``algorithm.rollout_correction.use_policy_gradient=true``).

In bypass mode there is no old-policy pass: the rollout engine's log-probs stand for the old policy.
PPO's clipped ratio is then replaced by a plain policy gradient, importance-weighted towards the
policy being trained:

``L_t = -A_t * log pi(y_t) * w_t``, ``w`` recomputed in every micro-batch from the current log-probs
(detached: the weight carries no gradient) against the rollout's, with the levels, truncation,
rejection and veto of `rlflow.algos.rollout_correction` (``log_ratio = log pi - log pi_rollout``);
``w = 1`` without ``rollout_is``. Rejected tokens and vetoed responses leave the loss's numerator;
the denominators stay the mini-batch's global counts of the response tokens (the rejection depends on
the policy being trained, so it is known only inside the loss), which keeps the loss the same however
the mini-batch is split (DESIGN invariant 1). The gradient is ``-A_t * w_t * grad log pi(y_t)``: with
``w = pi / pi_rollout`` untruncated, the unbiased policy gradient of the rollout's samples.

Batch normalisation of the weights is not offered: a micro-batch's mean would make the loss depend on
the split.
"""

from __future__ import annotations

import torch

from rlflow.algos.common import Count, check_shapes
from rlflow.algos.losses import agg_loss
from rlflow.algos.rollout_correction import compute_rollout_correction

__all__ = ["compute_policy_loss_reinforce"]

_TOKEN_MEANS = (
    "rollout_corr/kl",
    "rollout_corr/rollout_rs_masked_fraction",
    "rollout_corr/rollout_is_catastrophic_token_fraction",
)
_RESPONSE_MEANS = (
    "rollout_corr/log_ppl_diff",
    "rollout_corr/rollout_rs_seq_masked_fraction",
    "rollout_corr/rollout_is_veto_fraction",
)
_WEIGHT_MEANS = (
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_ratio_fraction_high",
    "rollout_corr/rollout_is_ratio_fraction_low",
)


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    rollout_rs_threshold_lower: float | None = None,
    rollout_token_veto_threshold: float | None = None,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
    """Importance-weighted REINFORCE loss of one micro-batch (see the module docstring).

    Args:
        rollout_log_prob: ``(bs, response_len)`` the rollout engine's log-probs of the sampled tokens.
        log_prob: ``(bs, response_len)`` the current policy's (carries the gradient).
        advantages: ``(bs, response_len)``.
        response_mask: ``(bs, response_len)`` 1 on response tokens.
        loss_agg_mode: see `rlflow.algos.losses.agg_loss`.
        rollout_is: None, ``token`` or ``sequence`` (the weights' level).
        rollout_is_threshold: the weights' upper truncation; the rejection's upper bound by default.
        rollout_rs / rollout_rs_threshold / rollout_rs_threshold_lower / rollout_token_veto_threshold:
            rejection and veto, as in `rlflow.algos.rollout_correction.compute_rollout_correction`.
        global_token_num / global_seq_num / dp_size / loss_scale_factor: the mini-batch's counts
            (`rlflow.algos.losses.agg_loss`), from ``response_mask`` before any rejection.

    Returns:
        ``(pg_loss, metrics)``; each metric is ``(value, weight)``, a mean over this micro-batch and the
        number of tokens or responses it averages, so weighted sums over micro-batches give the
        mini-batch's value exactly: ``actor/ppo_kl`` (mean of ``log pi_rollout - log pi`` over the tokens
        left in the loss) and the means among ``rollout_corr/*`` (``kl``, ``log_ppl_diff``,
        ``rollout_is_mean``, ``rollout_is_ratio_fraction_high / low``, ``rollout_rs_masked_fraction``,
        ``rollout_rs_seq_masked_fraction``, ``rollout_is_veto_fraction``,
        ``rollout_is_catastrophic_token_fraction``; those the settings produce).
    """
    check_shapes(
        "compute_policy_loss_reinforce",
        response_mask,
        rollout_log_prob=rollout_log_prob,
        log_prob=log_prob,
        advantages=advantages,
    )
    corr = compute_rollout_correction(
        log_prob.detach(),
        rollout_log_prob,
        response_mask,
        rollout_is=rollout_is,
        rollout_is_threshold=rollout_is_threshold,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
        rollout_rs_threshold_lower=rollout_rs_threshold_lower,
        rollout_token_veto_threshold=rollout_token_veto_threshold,
    )
    pg_losses = -advantages * log_prob
    if corr.weights is not None:
        pg_losses = pg_losses * corr.weights
    keep = response_mask if corr.keep_mask is None else corr.keep_mask
    pg_loss = agg_loss(
        pg_losses,
        keep,
        loss_agg_mode,
        global_token_num=global_token_num,
        global_seq_num=global_seq_num,
        dp_size=dp_size,
        loss_scale_factor=loss_scale_factor,
    )

    mask = response_mask.to(torch.float64)
    n_tok = float(mask.sum())
    n_seq = float((mask.sum(-1) > 0).sum())
    n_keep = float(keep.sum())
    diff = (rollout_log_prob.to(torch.float64) - log_prob.detach().to(torch.float64)) * keep
    metrics = {"actor/ppo_kl": (float(diff.sum()) / max(n_keep, 1.0), n_keep)}
    weight_count = n_tok if rollout_is == "token" else n_seq
    for key, value in corr.metrics.items():
        if key in _TOKEN_MEANS:
            metrics[key] = (value, n_tok)
        elif key in _RESPONSE_MEANS:
            metrics[key] = (value, n_seq)
        elif key in _WEIGHT_MEANS:
            metrics[key] = (value, weight_count)
        elif key.startswith("rollout_corr/rollout_rs_") and key.endswith("_seq_masked_fraction"):
            metrics[key] = (value, n_seq)  # one of verl's current options (rlflow.algos.rejection)
        elif key.startswith("rollout_corr/rollout_rs_") and key.endswith("_masked_fraction"):
            metrics[key] = (value, n_tok)
    return pg_loss, metrics
