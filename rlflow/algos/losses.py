"""Loss aggregation and the PPO-family losses: policy losses (and their registry), value loss, entropy
loss and rollout importance-sampling weights.

Every per-token tensor is ``(bs, response_len)``; ``response_mask`` is 1 on tokens the policy generated.
Every loss takes the keyword-only ``global_token_num``, ``global_seq_num``, ``dp_size`` and
``loss_scale_factor`` and hands them to ``agg_loss`` (see its docstring for the contract). Names follow
verl's ``verl.trainer.ppo.core_algos``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from rlflow.algos.common import Count, check_shapes, clamped_log_ratio
from rlflow.utils.torch_functional import clip_by_value, entropy_from_logits, masked_mean, masked_sum

__all__ = [
    "AGG_LOSS_MODES",
    "POLICY_LOSS_REGISTRY",
    "agg_loss",
    "compute_entropy_loss",
    "compute_policy_loss",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_rollout_is_weights",
    "compute_value_loss",
    "get_policy_loss_fn",
    "register_policy_loss",
]

AGG_LOSS_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------------------------------
# Policy-loss registry
# ----------------------------------------------------------------------------------------------------


POLICY_LOSS_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {}


def register_policy_loss(name: str) -> Callable:
    """Decorator registering a policy loss under ``name`` (``actor.policy_loss.loss_mode``).

    Args:
        name: the loss mode name.

    Returns:
        The decorator; it raises ValueError if the name is already taken by another function.
    """

    def decorator(fn: Callable) -> Callable:
        if POLICY_LOSS_REGISTRY.get(name, fn) is not fn:
            raise ValueError(f"policy loss {name!r} is already registered to {POLICY_LOSS_REGISTRY[name]}")
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> Callable:
    """Return the policy loss registered as ``name``.

    Args:
        name: ``actor.policy_loss.loss_mode``, e.g. ``"vanilla"`` or ``"gspo"``.

    Returns:
        The loss function; ValueError listing the registered names if unknown.
    """
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"actor.policy_loss.loss_mode: unsupported policy loss {name!r}; "
            f"registered: {sorted(POLICY_LOSS_REGISTRY)}"
        )
    return POLICY_LOSS_REGISTRY[name]


# ----------------------------------------------------------------------------------------------------
# Loss aggregation
# ----------------------------------------------------------------------------------------------------


def _positive_or_one(count: Count, like: torch.Tensor) -> torch.Tensor:
    count = torch.as_tensor(count, dtype=like.dtype, device=like.device)
    return torch.where(count > 0, count, torch.ones_like(count))


def _per_seq_loss(
    token_sums: torch.Tensor,
    token_counts: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None,
    response_len: int,
) -> torch.Tensor:
    """``(bs,)`` per-sequence loss of a ``seq-*`` mode from per-row sums and valid-token counts."""
    if loss_agg_mode == "seq-mean-token-mean":
        return token_sums / _positive_or_one(token_counts, token_sums)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = response_len if loss_scale_factor is None else loss_scale_factor
        if not scale > 0:
            raise ValueError(f"agg_loss: loss_scale_factor must be > 0, got {scale!r}")
        return token_sums / scale
    return token_sums


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
    batch_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar; with global counts, exact under any batch split.

    Write ``S_i = sum_t loss_mat[i, t] * loss_mask[i, t]`` and ``n_i = sum_t loss_mask[i, t]``; a
    *sequence* is a row with ``n_i > 0`` (fully masked rows, e.g. padding rows, never count).

    **Local (no global argument).** The plain aggregate of this call:

    * ``token-mean``: ``sum_i S_i / sum_i n_i`` (masked mean over all tokens);
    * ``seq-mean-token-sum``: mean over sequences of ``S_i``;
    * ``seq-mean-token-mean``: mean over sequences of ``S_i / n_i``;
    * ``seq-mean-token-sum-norm``: mean over sequences of ``S_i / loss_scale_factor`` (Dr. GRPO,
      Liu et al. 2025, arXiv:2503.20783: a constant horizon; default ``loss_mask.shape[-1]``).

    **Global (the contract the FSDP workers rely on).** With ``global_token_num`` (``token-mean``) or
    ``global_seq_num`` (the ``seq-*`` modes) given, the denominator above is replaced by that count of
    the *whole mini-batch* — all its micro-batches on all ``dp_size`` data-parallel ranks, counted as
    above (valid tokens; rows with at least one valid token) — and the result is multiplied by
    ``dp_size``. Then, if each rank sums ``agg_loss`` over its micro-batches and the ranks average their
    gradients (what FSDP / DDP do), the gradient (and the rank-averaged loss) equals exactly that of the
    local aggregate of the whole mini-batch, whatever the split. For ``seq-mean-token-sum-norm`` pass
    the same ``loss_scale_factor`` (e.g. the configured max response length) to every micro-batch, as
    micro-batches may be padded to different lengths. The argument not used by the mode is ignored, so a
    worker may always pass both.

    Args:
        loss_mat: ``(bs, response_len)`` per-token loss.
        loss_mask: ``(bs, response_len)`` 0/1 mask.
        loss_agg_mode: one of ``AGG_LOSS_MODES``.
        global_token_num: valid tokens in the whole mini-batch (int or scalar tensor), for ``token-mean``.
        global_seq_num: sequences in the whole mini-batch, for the ``seq-*`` modes.
        dp_size: data-parallel ranks whose gradients are averaged; must be 1 unless the global count of
            the mode is given (ValueError otherwise: the scaling would be meaningless).
        loss_scale_factor: divisor of each sequence sum for ``seq-mean-token-sum-norm``.
        batch_num_tokens / global_batch_size: verl's names of ``global_token_num`` / ``global_seq_num``
            (its losses call ``agg_loss(..., **config.global_batch_info)``); give one name of each.

    Returns:
        Scalar loss tensor; 0 (with zero gradient) when the denominator is 0.
    """
    global_token_num = _one_of("global_token_num", global_token_num, "batch_num_tokens", batch_num_tokens)
    global_seq_num = _one_of("global_seq_num", global_seq_num, "global_batch_size", global_batch_size)
    if loss_agg_mode not in AGG_LOSS_MODES:
        raise ValueError(f"invalid loss_agg_mode {loss_agg_mode!r}; choose one of {AGG_LOSS_MODES}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss: loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ"
        )
    if isinstance(dp_size, bool) or not isinstance(dp_size, numbers.Integral) or dp_size < 1:
        raise ValueError(f"agg_loss: dp_size must be an int >= 1, got {dp_size!r}")
    token_sums = masked_sum(loss_mat, loss_mask, axis=-1)  # (bs,)
    token_counts = loss_mask.to(loss_mat.dtype).sum(dim=-1)  # (bs,)
    if loss_agg_mode == "token-mean":
        total, local_count = token_sums.sum(), token_counts.sum()
        global_count, key = global_token_num, "global_token_num"
    else:
        total = _per_seq_loss(
            token_sums, token_counts, loss_agg_mode, loss_scale_factor, loss_mask.shape[-1]
        ).sum()
        local_count = (token_counts > 0).sum()
        global_count, key = global_seq_num, "global_seq_num"
    if global_count is None:
        if dp_size != 1:
            raise ValueError(
                f"agg_loss({loss_agg_mode!r}): dp_size={dp_size} needs {key} (the mini-batch count over all "
                "micro-batches and ranks); without it the local aggregate is returned, which needs dp_size=1"
            )
        return total / _positive_or_one(local_count, loss_mat)
    return total / _positive_or_one(global_count, loss_mat) * dp_size


def _one_of(name: str, value: Count | None, verl_name: str, verl_value: Count | None) -> Count | None:
    if value is not None and verl_value is not None:
        raise ValueError(f"agg_loss: give {name} or verl's {verl_name}, not both")
    return value if value is not None else verl_value


# ----------------------------------------------------------------------------------------------------
# Policy, value and entropy losses
# ----------------------------------------------------------------------------------------------------


def _clip_ratios(config: Any, fn_name: str) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high)`` of the actor config, each falling back to ``clip_ratio``."""
    clip_ratio = config.clip_ratio
    low = clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    if low is None or high is None:
        raise ValueError(
            f"{fn_name} needs actor.clip_ratio (or both actor.clip_ratio_low and actor.clip_ratio_high)"
        )
    return float(low), float(high)


def _apply_is_weights(
    pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None, fn_name: str
) -> torch.Tensor:
    if rollout_is_weights is None:
        return pg_losses
    if rollout_is_weights.shape != pg_losses.shape:
        raise ValueError(
            f"{fn_name}: rollout_is_weights has shape {tuple(rollout_is_weights.shape)}, "
            f"expected (bs, response_len)={tuple(pg_losses.shape)}"
        )
    return pg_losses * rollout_is_weights.detach()


def compute_rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    imp_ratio_cap: float,
) -> torch.Tensor:
    """Truncated importance-sampling weights for the rollout/trainer mismatch (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training", TIS; Espeholt et al. 2018).

    ``w = min(exp(clamp(old_log_prob - rollout_log_probs, -20, 20)), imp_ratio_cap)``, 0 on masked tokens.

    Args:
        old_log_prob: ``(bs, response_len)`` trainer log-probs of the behaviour policy.
        rollout_log_probs: ``(bs, response_len)`` log-probs reported by the rollout engine.
        response_mask: ``(bs, response_len)``.
        imp_ratio_cap: upper bound of the weight (> 0).

    Returns:
        ``(bs, response_len)`` detached weights, the ``rollout_is_weights`` of the policy losses.
    """
    check_shapes(
        "compute_rollout_is_weights",
        response_mask,
        old_log_prob=old_log_prob,
        rollout_log_probs=rollout_log_probs,
    )
    if not imp_ratio_cap > 0:
        raise ValueError(f"compute_rollout_is_weights: imp_ratio_cap must be > 0, got {imp_ratio_cap}")
    log_w = clamped_log_ratio(old_log_prob, rollout_log_probs).detach()
    return torch.exp(log_w).clamp(max=imp_ratio_cap) * response_mask.to(log_w.dtype)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
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
    """PPO clipped surrogate, Schulman et al. 2017 (arXiv:1707.06347, Eq. 7), with dual clip (Ye et al.
    2020, arXiv:1912.09729, Eq. 5) and asymmetric clip ranges (DAPO "clip-higher", arXiv:2503.14476).

    ``rho = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``L = max(-A * rho, -A * clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high))``; where ``A < 0``,
    ``L = min(L, -A * clip_ratio_c)`` (dual clip bounds the loss of a very large ratio).

    Args:
        old_log_prob: ``(bs, response_len)`` log-probs of the policy that generated the data.
        log_prob: ``(bs, response_len)`` log-probs of the current policy (carries the gradient).
        advantages: ``(bs, response_len)``.
        response_mask: ``(bs, response_len)``.
        loss_agg_mode: see ``agg_loss``.
        config: actor config with ``clip_ratio``, optional ``clip_ratio_low`` / ``clip_ratio_high``
            (default ``clip_ratio``) and ``clip_ratio_c`` (default 3.0, must be > 1).
        rollout_is_weights: ``(bs, response_len)`` importance weights multiplied into the per-token
            loss (no gradient), e.g. ``compute_rollout_is_weights``; None for none.
        global_token_num: see ``agg_loss``.
        global_seq_num: see ``agg_loss``.
        dp_size: see ``agg_loss``.
        loss_scale_factor: see ``agg_loss``.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` scalars: the loss; the fraction of valid
        tokens where the clipped term is active; masked mean of ``old_log_prob - log_prob``; the fraction
        where the dual clip is active.
    """
    fn_name = "compute_policy_loss_vanilla"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    clip_low, clip_high = _clip_ratios(config, fn_name)
    clip_ratio_c = float(config.clip_ratio_c)
    if not clip_ratio_c > 1.0:
        raise ValueError(f"{fn_name}: actor.clip_ratio_c (dual-clip bound) must be > 1, got {clip_ratio_c}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), response_mask)

    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
    pg_clipfrac_lower = masked_mean((negative & (loss_ppo > loss_dual)).to(ratio.dtype), response_mask)

    pg_losses = _apply_is_weights(pg_losses, rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
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
    """GSPO, Zheng et al. 2025 (arXiv:2507.18071, Eq. 7 and GSPO-token Eq. 13): PPO clipping on a
    length-normalised sequence-level importance ratio.

    ``s_i = exp(mean_t (log_prob - old_log_prob))`` over the valid tokens of response ``i``. Per token
    the ratio is ``sg[s_i] * pi_t / sg[pi_t]``: its value is ``s_i`` (log clamped at 10) and its gradient
    flows through each token's own log-prob. ``L = max(-A * s, -A * clip(s, 1 - clip_ratio_low,
    1 + clip_ratio_high))``. The paper's objective is ``seq-mean-token-mean`` (the default here).

    Args:
        old_log_prob: ``(bs, response_len)``.
        log_prob: ``(bs, response_len)`` (carries the gradient).
        advantages: ``(bs, response_len)`` (constant per response for GRPO-style estimators).
        response_mask: ``(bs, response_len)``.
        loss_agg_mode: see ``agg_loss``.
        config: actor config with ``clip_ratio`` / ``clip_ratio_low`` / ``clip_ratio_high``.
        rollout_is_weights: ``(bs, response_len)`` importance weights (see vanilla), or None.
        global_token_num: see ``agg_loss``.
        global_seq_num: see ``agg_loss``.
        dp_size: see ``agg_loss``.
        loss_scale_factor: see ``agg_loss``.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``; ``pg_clipfrac_lower`` is always 0.
    """
    fn_name = "compute_policy_loss_gspo"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    clip_low, clip_high = _clip_ratios(config, fn_name)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio, response_mask, axis=-1)  # (bs,)
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))

    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = _apply_is_weights(torch.maximum(loss_unclipped, loss_clipped), rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(seq_ratio.dtype), response_mask)
    ppo_kl = masked_mean(-log_ratio.detach(), response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's older (pre-registry) PPO loss signature; ``compute_policy_loss_vanilla`` with a config built
    from the clip arguments (Schulman et al. 2017, arXiv:1707.06347).

    Args:
        old_log_prob: ``(bs, response_len)``.
        log_prob: ``(bs, response_len)``.
        advantages: ``(bs, response_len)``.
        response_mask: ``(bs, response_len)``.
        cliprange: symmetric clip range.
        cliprange_low: lower clip range (default ``cliprange``).
        cliprange_high: upper clip range (default ``cliprange``).
        clip_ratio_c: dual-clip bound (> 1).
        loss_agg_mode: see ``agg_loss``.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` as ``compute_policy_loss_vanilla``.
    """
    config = SimpleNamespace(
        clip_ratio=cliprange,
        clip_ratio_low=cliprange_low,
        clip_ratio_high=cliprange_high,
        clip_ratio_c=clip_ratio_c,
    )
    return compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config
    )


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss of PPO (OpenAI baselines ppo2; Engstrom et al. 2020, arXiv:2005.12729, Sec. 3).

    ``0.5 * max((vpreds - returns)^2, (clip(vpreds, values - c, values + c) - returns)^2)``, aggregated;
    with ``cliprange_value=None`` the plain ``0.5 * (vpreds - returns)^2``.

    Args:
        vpreds: ``(bs, response_len)`` current critic predictions (carry the gradient).
        returns: ``(bs, response_len)`` targets.
        values: ``(bs, response_len)`` critic values at rollout time.
        response_mask: ``(bs, response_len)``.
        cliprange_value: ``c`` (> 0), or None for no clipping.
        loss_agg_mode: see ``agg_loss``.
        global_token_num: see ``agg_loss``.
        global_seq_num: see ``agg_loss``.
        dp_size: see ``agg_loss``.
        loss_scale_factor: see ``agg_loss``.

    Returns:
        ``(vf_loss, vf_clipfrac)`` scalars; clipfrac is the fraction of valid tokens where the clipped
        term is the larger one (0 without clipping).
    """
    check_shapes("compute_value_loss", response_mask, vpreds=vpreds, returns=returns, values=values)
    vf_losses = (vpreds - returns) ** 2
    vf_clipfrac = torch.zeros((), dtype=vpreds.dtype, device=vpreds.device)
    if cliprange_value is not None:
        if not cliprange_value > 0:
            raise ValueError(
                f"critic.cliprange_value must be > 0 (or None for no clipping), got {cliprange_value}"
            )
        vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
        loss_clipped = (vpred_clipped - returns) ** 2
        vf_clipfrac = masked_mean((loss_clipped > vf_losses).to(vpreds.dtype), response_mask)
        vf_losses = torch.maximum(vf_losses, loss_clipped)
    vf_loss = 0.5 * agg_loss(
        vf_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregated categorical entropy of the policy (the actor subtracts ``entropy_coeff`` times it;
    entropy bonus of Mnih et al. 2016, arXiv:1602.01783).

    Args:
        logits: ``(bs, response_len, vocab)``.
        response_mask: ``(bs, response_len)``.
        loss_agg_mode: see ``agg_loss``.
        global_token_num: see ``agg_loss``.
        global_seq_num: see ``agg_loss``.
        dp_size: see ``agg_loss``.
        loss_scale_factor: see ``agg_loss``.

    Returns:
        Scalar entropy (nats).
    """
    token_entropy = entropy_from_logits(logits)  # (bs, response_len)
    return agg_loss(
        token_entropy,
        response_mask,
        loss_agg_mode,
        global_token_num,
        global_seq_num,
        dp_size,
        loss_scale_factor,
    )


# GPG, GMPO, KL-Cov and Clip-Cov live in their own modules; importing them registers them next to the
# losses above.
from rlflow.algos import cov_losses as _cov_losses  # noqa: E402, F401
from rlflow.algos import pg_variants as _pg_variants  # noqa: E402, F401
