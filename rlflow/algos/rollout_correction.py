"""Rollout correction: importance weights and rejection between the rollout engine's policy and the
trainer's (verl's ``algorithm.rollout_correction``).

The rollout engine samples from ``pi_rollout`` (its own kernels, precision, maybe stale weights); the
trainer's old policy ``pi_old`` is the same weights under the trainer's numerics. Per response token
``log_ratio = log pi_old - log pi_rollout``. Three independent mechanisms act on it:

* **importance weights** (``rollout_is``): ``token`` — ``w_t = exp(log_ratio_t)``; ``sequence`` — one
  weight per response, ``exp(sum_t log_ratio_t)``, on all its tokens. Every log-weight is clamped to
  ``[-20, 20]`` first (overflow), then the weight is truncated at ``rollout_is_threshold``, optionally
  divided by its batch mean (``rollout_is_batch_normalize``: token weights over valid tokens, sequence
  weights over responses), and 0 on padding. The weights multiply the per-token policy loss.
* **rejection** (``rollout_rs``): a ratio outside ``[lower, upper]`` drops the token (``token``) or the
  whole response (``sequence``: the product of ratios; ``geometric``: their geometric mean
  ``exp(mean_t log_ratio_t)``) from the policy loss and from its token counts. verl's current options
  (``token_k1``, ``seq_max_k2``, ``binary_kl``, ... comma-separated, with ``"L_U"`` thresholds) are
  `rlflow.algos.rejection`'s.
* **veto** (``rollout_token_veto_threshold``): a response with any token whose unclamped ratio is below
  the threshold is dropped.

Weights and rejection never change advantages; they act on the actor's loss only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rlflow.algos.common import LOG_RATIO_BOUND
from rlflow.algos.rejection import is_rs_option_list, parse_rejection, reject
from rlflow.protocol import DataProto

__all__ = [
    "IS_LEVELS",
    "RS_LEVELS",
    "RolloutCorrection",
    "compute_rollout_correction",
    "correct_rollout_batch",
    "correction_settings",
]

IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")


@dataclass
class RolloutCorrection:
    """What `compute_rollout_correction` returns.

    Attributes:
        weights: ``(bs, response_len)`` detached importance weights, 0 on padding; None without ``rollout_is``.
        keep_mask: ``(bs, response_len)`` 1 where the token stays in the policy loss (the response mask
            with rejected tokens and responses zeroed); None when nothing can be rejected.
        metrics: ``rollout_corr/*`` scalars.
    """

    weights: torch.Tensor | None
    keep_mask: torch.Tensor | None
    metrics: dict[str, float]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _bounds(
    rs_threshold: float | None, rs_threshold_lower: float | None, is_threshold: float
) -> tuple[float, float]:
    upper = float(is_threshold if rs_threshold is None else rs_threshold)
    lower = 1.0 / upper if rs_threshold_lower is None else float(rs_threshold_lower)
    return lower, upper


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    rollout_rs_threshold_lower: float | None = None,
    rollout_token_veto_threshold: float | None = None,
) -> RolloutCorrection:
    """Importance weights, rejection mask and off-policy metrics of one batch (see the module docstring).

    Args:
        old_log_prob: ``(bs, response_len)`` the trainer's log-probs of the sampled tokens.
        rollout_log_probs: ``(bs, response_len)`` the rollout engine's log-probs of the same tokens.
        response_mask: ``(bs, response_len)`` 1 on response tokens.
        rollout_is: None, ``token`` or ``sequence``.
        rollout_is_threshold: the weights' upper truncation (> 0); also the rejection's upper bound
            when ``rollout_rs_threshold`` is None.
        rollout_is_batch_normalize: divide the truncated weights by their batch mean.
        rollout_rs: None, ``token``, ``sequence`` or ``geometric``; or verl's current options
            (`rlflow.algos.rejection.RS_OPTIONS`, comma-separated).
        rollout_rs_threshold: the rejection's upper bound on the ratio; with verl's current options their
            thresholds (`rlflow.algos.rejection.parse_rejection`).
        rollout_rs_threshold_lower: its lower bound; None = ``1 / upper`` (not with the current options).
        rollout_token_veto_threshold: drop a response with a token ratio below this; None = off.

    Returns:
        `RolloutCorrection`. Metrics (valid tokens / responses only): ``rollout_corr/kl`` (mean of
        ``log pi_rollout - log pi_old``, the k1 estimate of KL(rollout || old)), ``rollout_corr/log_ppl_diff``
        (mean over responses of the per-token mean of ``log_ratio``), with ``rollout_is``:
        ``rollout_is_mean / std / min / max`` (before truncation), ``rollout_is_eff_sample_size``
        (``1 / mean(w_n^2)`` of the truncated weights normalised to mean 1, as a fraction),
        ``rollout_is_ratio_fraction_high / low`` (share above the threshold / below its reciprocal);
        with rejection or veto: ``rollout_rs_masked_fraction`` (valid tokens dropped),
        ``rollout_rs_seq_masked_fraction`` (responses losing any token), and with veto
        ``rollout_is_veto_fraction`` and ``rollout_is_catastrophic_token_fraction``.
    """
    if rollout_is is not None and rollout_is not in IS_LEVELS:
        raise ValueError(f"rollout_is={rollout_is!r} is not one of {list(IS_LEVELS)} or null")
    rules = None
    if rollout_rs is not None and rollout_rs not in RS_LEVELS:
        if not is_rs_option_list(rollout_rs):
            raise ValueError(
                f"rollout_rs={rollout_rs!r} is not one of {list(RS_LEVELS)}, verl's options or null"
            )
        if rollout_rs_threshold_lower is not None:
            raise ValueError("rollout_rs_threshold_lower goes with token / sequence / geometric: write 'L_U'")
        rules = parse_rejection(rollout_rs, rollout_rs_threshold)
    if old_log_prob.shape != rollout_log_probs.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"compute_rollout_correction: shapes differ: old_log_prob {tuple(old_log_prob.shape)}, "
            f"rollout_log_probs {tuple(rollout_log_probs.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.to(torch.float64)
    log_ratio = (old_log_prob.detach().to(torch.float64) - rollout_log_probs.to(torch.float64)) * mask
    seq_sum = log_ratio.sum(-1)
    seq_len = mask.sum(-1)
    has_tokens = seq_len > 0
    n_seq = max(int(has_tokens.sum()), 1)
    metrics: dict[str, float] = {
        "rollout_corr/kl": float(_masked_mean(-log_ratio, mask)),
        "rollout_corr/log_ppl_diff": float(
            (torch.where(has_tokens, seq_sum / seq_len.clamp(min=1), 0.0)).sum() / n_seq
        ),
    }

    weights = None
    if rollout_is is not None:
        if rollout_is == "token":
            raw = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
            valid = mask
        else:
            raw = torch.exp(seq_sum.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).unsqueeze(-1).expand_as(mask)
            valid = torch.zeros_like(mask)  # each response's weight counted once (its first column)
            valid[:, 0] = has_tokens.to(mask.dtype)
        sel = raw[valid.bool()]
        threshold = float(rollout_is_threshold)
        weights = raw.clamp(max=threshold)
        if rollout_is_batch_normalize and sel.numel():
            weights = weights / _masked_mean(weights, valid)
        truncated = weights[valid.bool()]
        if sel.numel():
            normed = truncated / truncated.mean()
            metrics.update(
                {
                    "rollout_corr/rollout_is_mean": float(sel.mean()),
                    "rollout_corr/rollout_is_std": float(sel.std(unbiased=False)),
                    "rollout_corr/rollout_is_min": float(sel.min()),
                    "rollout_corr/rollout_is_max": float(sel.max()),
                    "rollout_corr/rollout_is_eff_sample_size": float(1.0 / (normed**2).mean()),
                    "rollout_corr/rollout_is_ratio_fraction_high": float((sel > threshold).double().mean()),
                    "rollout_corr/rollout_is_ratio_fraction_low": float(
                        (sel < 1.0 / threshold).double().mean()
                    ),
                }
            )
        weights = (weights * mask).to(old_log_prob.dtype)

    keep = None
    if rollout_rs is not None or rollout_token_veto_threshold is not None:
        keep = mask.clone()
        if rules is not None:
            kept, rule_metrics = reject(old_log_prob, rollout_log_probs, mask, rules)
            keep = keep * kept
            metrics.update(rule_metrics)
        elif rollout_rs is not None:
            lower, upper = _bounds(rollout_rs_threshold, rollout_rs_threshold_lower, rollout_is_threshold)
            if rollout_rs == "token":
                ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
                keep = keep * ((ratio >= lower) & (ratio <= upper)).to(keep.dtype)
            else:
                log_seq = seq_sum if rollout_rs == "sequence" else seq_sum / seq_len.clamp(min=1)
                ratio = torch.exp(log_seq.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
                keep = keep * ((ratio >= lower) & (ratio <= upper)).to(keep.dtype).unsqueeze(-1)
        if rollout_token_veto_threshold is not None:
            catastrophic = (log_ratio < math.log(float(rollout_token_veto_threshold))) & mask.bool()
            vetoed = catastrophic.any(-1)
            keep = keep * (~vetoed).to(keep.dtype).unsqueeze(-1)
            metrics["rollout_corr/rollout_is_veto_fraction"] = float(vetoed.sum()) / n_seq
            metrics["rollout_corr/rollout_is_catastrophic_token_fraction"] = float(
                catastrophic.sum() / mask.sum().clamp(min=1)
            )
        dropped = (mask - keep).clamp(min=0)
        metrics["rollout_corr/rollout_rs_masked_fraction"] = float(dropped.sum() / mask.sum().clamp(min=1))
        metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = float((dropped.sum(-1) > 0).sum()) / n_seq
        keep = keep.to(response_mask.dtype)
    return RolloutCorrection(weights=weights, keep_mask=keep, metrics=metrics)


def correction_settings(config: Any) -> dict[str, Any]:
    """The weight / rejection / veto keyword arguments of `compute_rollout_correction` (and of
    `rlflow.algos.reinforce_loss.compute_policy_loss_reinforce`) from ``algorithm.rollout_correction``."""
    return {
        "rollout_is": config.rollout_is,
        "rollout_is_threshold": float(config.rollout_is_threshold),
        "rollout_rs": config.rollout_rs,
        "rollout_rs_threshold": _threshold(config.rollout_rs_threshold),
        "rollout_rs_threshold_lower": config.rollout_rs_threshold_lower,
        "rollout_token_veto_threshold": config.rollout_token_veto_threshold,
    }


def _threshold(value: Any) -> float | str | None:
    """A number as a float (the legacy levels' bound), a string (verl's current thresholds) as it is."""
    if value is None or isinstance(value, str):
        return value
    return float(value)


def correct_rollout_batch(batch: DataProto, config: Any) -> dict[str, float]:
    """`compute_rollout_correction` on a step's batch: adds ``rollout_is_weights`` and ``rollout_rs_mask``
    (read by the actor's update only) and returns the ``rollout_corr/*`` metrics.

    Args:
        batch: with ``old_log_probs``, ``rollout_log_probs`` and ``response_mask`` (the rollout's outputs
            carry both), each ``(bs, response_len)``.
        config: ``algorithm.rollout_correction`` (`rlflow.config.schema.RolloutCorrectionConfig`).
    """
    tensors = batch.batch
    out = compute_rollout_correction(
        tensors["old_log_probs"],
        tensors["rollout_log_probs"],
        tensors["response_mask"],
        rollout_is_batch_normalize=bool(config.rollout_is_batch_normalize),
        **correction_settings(config),
    )
    if out.weights is not None:
        tensors["rollout_is_weights"] = out.weights
    if out.keep_mask is not None:
        tensors["rollout_rs_mask"] = out.keep_mask
    return out.metrics
