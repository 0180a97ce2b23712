"""Rejection of tokens and responses by a divergence between the rollout's and the trainer's policy
(verl's current ``algorithm.rollout_correction.rollout_rs`` options).

Per response token, ``log r = log pi_old - log pi_rollout`` (clamped to ``[-20, 20]``). Each option is a
statistic and a bound; a token (``token_*``, ``binary_kl``) or a whole response (``seq_*``) whose
statistic leaves the bound is dropped from the policy loss:

=================  =================================================  =========================================
option             statistic                                          kept when
=================  =================================================  =========================================
``token_k1``       ``log r`` of the token                             ``log L <= stat <= log U``
``seq_sum_k1``     ``sum_t log r_t`` (the log of the product of       (``L_U``: the ratio, its product or its
                   ratios)                                            geometric mean within ``[L, U]``; one
``seq_mean_k1``    ``mean_t log r_t`` (the log of their geometric     number ``U``: ``[1/U, U]``)
                   mean)
``token_k2``       ``(log r)^2 / 2``                                  ``stat <= U``
``token_k3``       ``r - 1 - log r``                                  ``stat <= U``
``seq_{sum,mean,   the sum, mean or maximum over the response's       ``stat <= U``
max}_k{2,3}``      tokens of the token's k2 / k3
``binary_kl``      ``max(KL(p_old || p_rollout), KL(p_rollout ||     ``stat <= U``
                   p_old))`` of the Bernoulli distributions of the
                   sampled token (each probability clamped to
                   ``[1e-6, 1 - 1e-6]``)
=================  =================================================  =========================================

Options combine: ``rollout_rs="token_k1,seq_max_k2"`` keeps a token only where every option keeps it, with
one threshold for all or one per option (``"0.5_2.0,0.01"``). The k1 bounds are on the ratio
``pi_old / pi_rollout`` as verl documents them (verl's code compares ``-log r`` to ``[log L, log U]``,
i.e. keeps ``r`` in ``[1/U, 1/L]``; the two agree for reciprocal bounds, e.g. one number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlflow.algos.common import clamped_log_ratio

__all__ = ["RS_OPTIONS", "RejectionRule", "is_rs_option_list", "parse_rejection", "reject"]

RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
    "binary_kl",
)
"""verl's current rejection options (``algorithm.rollout_correction.rollout_rs``, comma-separated)."""
_P_EPS = 1e-6


@dataclass(frozen=True)
class RejectionRule:
    """One rejection option with its bounds.

    Attributes:
        option: one of `RS_OPTIONS`.
        lower: the k1 options' lower bound on the ratio (None for the others).
        upper: the k1 options' upper bound on the ratio; the others' bound on their statistic.
    """

    option: str
    lower: float | None
    upper: float


def is_rs_option_list(rollout_rs: str) -> bool:
    """Whether ``rollout_rs`` names verl's current options (``token_k1``, ``seq_max_k2,binary_kl``...)."""
    return all(part.strip() in RS_OPTIONS for part in str(rollout_rs).split(","))


def parse_rejection(
    rollout_rs: str, threshold: float | str | None, key: str = "rollout_rs"
) -> list[RejectionRule]:
    """The rules of a comma-separated ``rollout_rs`` and its ``rollout_rs_threshold``.

    Args:
        rollout_rs: option names of `RS_OPTIONS`, comma-separated (duplicates kept once).
        threshold: a number, or a string of one entry or one per option, comma-separated; a k1 option's
            entry is ``"L_U"`` or one number ``U`` (``L = 1/U``), the others' one number.
        key: the config key, for the errors.

    Raises:
        ValueError: an unknown option, a missing or malformed threshold, or a bound that is not > 0 or
            (k1) a lower bound above the upper, naming ``key``.
    """
    options = list(dict.fromkeys(part.strip() for part in str(rollout_rs).split(",")))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if unknown:
        raise ValueError(
            f"{key}={rollout_rs!r}: {unknown} not among verl's rejection options {list(RS_OPTIONS)}"
        )
    if threshold is None:
        raise ValueError(
            f"{key}_threshold: {key}={rollout_rs!r} needs a threshold (e.g. 0.5_2.0 for a k1 option)"
        )
    entries = [str(threshold)] if isinstance(threshold, (int, float)) else str(threshold).split(",")
    entries = [e.strip() for e in entries]
    if len(entries) not in (1, len(options)):
        raise ValueError(
            f"{key}_threshold={threshold!r}: give one threshold for all of {options} or one per option "
            f"({len(options)}), comma-separated"
        )
    rules = []
    for option, entry in zip(options, entries * len(options) if len(entries) == 1 else entries, strict=False):
        rules.append(_rule(option, entry, f"{key}_threshold"))
    return rules


def _rule(option: str, entry: str, key: str) -> RejectionRule:
    def positive(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{key}: {text!r} (for {option}) is not a number") from None
        if not value > 0 or not math.isfinite(value):
            raise ValueError(f"{key}: {text!r} (for {option}) must be a number > 0")
        return value

    if option.endswith("k1"):
        low_text, sep, up_text = entry.partition("_")
        upper = positive(up_text if sep else low_text)
        lower = positive(low_text) if sep else 1.0 / upper
        if not lower <= upper:
            raise ValueError(
                f"{key}: {option}'s bounds [{lower}, {upper}] are reversed (a number U means [1/U, U]; write "
                "'L_U' with both bounds and a decimal point in each, e.g. 0.5_2.0, or quote it: Hydra reads "
                "0.5_2 as the number 0.52)"
            )
        return RejectionRule(option, lower, upper)
    if "_" in entry:
        raise ValueError(f"{key}: {option} takes one upper bound on its divergence, not {entry!r}")
    return RejectionRule(option, None, positive(entry))


def _statistic(
    option: str, log_ratio: torch.Tensor, old: torch.Tensor, rollout: torch.Tensor
) -> torch.Tensor:
    """The per-token statistic of ``option`` (before a sequence aggregation)."""
    if option == "binary_kl":
        p = old.exp().clamp(_P_EPS, 1 - _P_EPS)
        q = rollout.exp().clamp(_P_EPS, 1 - _P_EPS)

        def bernoulli_kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a * (a / b).log() + (1 - a) * ((1 - a) / (1 - b)).log()

        return torch.maximum(bernoulli_kl(p, q), bernoulli_kl(q, p))
    kind = option[-2:]
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    return log_ratio.exp() - 1 - log_ratio


def reject(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    rules: list[RejectionRule],
) -> tuple[torch.Tensor, dict[str, float]]:
    """Keep mask of ``rules`` (all must keep a token) and per-option metrics.

    Args:
        old_log_prob: ``(bs, response_len)`` the trainer's log-probs of the sampled tokens.
        rollout_log_probs: ``(bs, response_len)`` the rollout engine's.
        mask: ``(bs, response_len)`` float64, 1 on response tokens.
        rules: from `parse_rejection`.

    Returns:
        ``(keep, metrics)``: ``keep`` ``(bs, response_len)`` float64, 0 on dropped and padding tokens;
        ``rollout_corr/rollout_rs_<option>_{masked_fraction, seq_masked_fraction, mean, min, max}`` (the
        statistic over valid tokens, or over responses with a token for a ``seq_*`` option).
    """
    old = old_log_prob.detach().to(torch.float64)
    rollout = rollout_log_probs.to(torch.float64)
    log_ratio = clamped_log_ratio(old, rollout) * mask
    valid = mask.bool()
    has_tokens = valid.any(-1)
    n_tokens, n_seq = mask.sum().clamp(min=1), max(int(has_tokens.sum()), 1)
    keep = mask.clone()
    metrics: dict[str, float] = {}
    for rule in rules:
        token = _statistic(rule.option, log_ratio, old, rollout) * mask
        if rule.option.startswith("seq_"):
            agg = rule.option.split("_")[1]
            if agg == "sum":
                stat = token.sum(-1)
            elif agg == "mean":
                stat = token.sum(-1) / mask.sum(-1).clamp(min=1)
            else:
                stat = token.masked_fill(~valid, -math.inf).amax(-1).masked_fill(~has_tokens, 0.0)
            selected = stat[has_tokens]
        else:
            stat, selected = token, token[valid]
        if rule.lower is not None:
            ok = (stat >= math.log(rule.lower)) & (stat <= math.log(rule.upper))
        else:
            ok = stat <= rule.upper
        ok = ok.to(mask.dtype)
        ok_tokens = ok.unsqueeze(-1) * mask if ok.dim() == 1 else ok * mask
        dropped = mask - ok_tokens
        keep = keep * ok_tokens
        name = f"rollout_corr/rollout_rs_{rule.option}"
        metrics[f"{name}_masked_fraction"] = float(dropped.sum() / n_tokens)
        metrics[f"{name}_seq_masked_fraction"] = float(((dropped.sum(-1) > 0) & has_tokens).sum()) / n_seq
        if selected.numel():
            metrics[f"{name}_mean"] = float(selected.mean())
            metrics[f"{name}_min"] = float(selected.min())
            metrics[f"{name}_max"] = float(selected.max())
    return keep, metrics
