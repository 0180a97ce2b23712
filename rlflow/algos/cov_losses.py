"""KL-Cov and Clip-Cov: PPO variants that act on the tokens driving entropy collapse.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv:2505.22617): a token's contribution to the change of the policy's entropy is proportional to the
covariance between its log-probability and its advantage, estimated per token as

    cov_t = (A_t - mean(A)) * (log_prob_t - mean(log_prob))

(means over the valid tokens). Instead of PPO's ratio clipping,

* **KL-Cov** (``policy_loss.loss_mode=kl_cov``) adds ``ppo_kl_coef * |log_prob_t - old_log_prob_t|`` to the
  unclipped surrogate ``-A_t * ratio_t`` of the ``max(1, int(kl_cov_ratio * N))`` tokens with the largest
  covariance (``N`` valid tokens);
* **Clip-Cov** (``loss_mode=clip_cov``) keeps PPO's clipped surrogate and cuts the gradient of
  ``max(1, int(clip_cov_ratio * N))`` tokens drawn at random among those whose covariance lies in
  ``(clip_cov_lb, clip_cov_ub)`` and that PPO's clip leaves active.

**Where the selection is made.** verl selects within each micro-batch, so the tokens a step acts on (and
its gradient) change with the micro-batch size and the number of ranks. rlflow selects over the whole
mini-batch: the actor (`rlflow.engine.actor`) computes the mini-batch's current log-probs with a forward
pass before its micro-batches (the weights do not change within a mini-batch), takes the means, the
top-k and the random draw over all data-parallel ranks (`select_cov_tokens`), and hands each micro-batch
its part of the selection (``cov_selected``). Clip-Cov's draw uses per-token random keys derived from
each sequence's token ids, the seed and the mini-batch (`token_keys`), so the same tokens are drawn
whatever the split. Tokens tied with the k-th covariance (or key) are all selected: identical sequences
(common within a GRPO group) carry identical keys and are cut together. Called without ``cov_selected``
(as verl's functions are), a loss selects over its own tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlflow.algos.common import Count, check_shapes, clamped_log_ratio
from rlflow.algos.losses import _apply_is_weights, _clip_ratios, agg_loss, register_policy_loss
from rlflow.utils.torch_functional import masked_mean

__all__ = [
    "COV_LOSS_MODES",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "select_cov_tokens",
    "token_covariance",
    "token_keys",
]

COV_LOSS_MODES = ("clip_cov", "kl_cov")
"""``policy_loss.loss_mode`` values whose tokens are selected over the mini-batch before its micro-batches."""

_HASH_PRIME = 2_147_483_629  # < 2**31: products of two residues fit in int64


def _group_size(group: Any) -> int:
    """Ranks of ``group``; 1 for None, which here means "this call's tokens only" (not the default group,
    as in `rlflow.engine.ppo_loop.group_size`): a loss called without a selection selects locally."""
    return dist.get_world_size(group) if group is not None and dist.is_initialized() else 1


def _global_sum(values: list[torch.Tensor], group: Any) -> torch.Tensor:
    """``(len(values),)`` float64 sums of scalars over the ranks of ``group``."""
    out = torch.stack([v.to(torch.float64) for v in values])
    if _group_size(group) > 1:
        dist.all_reduce(out, group=group)
    return out


def token_covariance(
    advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor, group: Any = None
) -> torch.Tensor:
    """Per-token covariance estimate of log-probability and advantage over all ranks' valid tokens.

    Args:
        advantages / log_prob / response_mask: ``(bs, response_len)``; ``log_prob`` is read detached.
        group: the data-parallel ranks holding the rest of the mini-batch (None: this call's tokens only).

    Returns:
        ``(bs, response_len)`` float64 ``(A_t - mean(A)) * (log_prob_t - mean(log_prob))``, 0 on masked tokens.
    """
    return _covariance_and_count(advantages, log_prob, response_mask, group)[0]


def _covariance_and_count(
    advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor, group: Any
) -> tuple[torch.Tensor, int]:
    """`token_covariance` and the number of valid tokens over ``group`` (one all-reduce for both)."""
    mask = response_mask.to(torch.float64)
    adv, logp = advantages.detach().to(torch.float64), log_prob.detach().to(torch.float64)
    sums = _global_sum([(adv * mask).sum(), (logp * mask).sum(), mask.sum()], group)
    n = sums[2].clamp(min=1.0)
    return (adv - sums[0] / n) * (logp - sums[1] / n) * mask, int(sums[2])


def _global_kth(values: torch.Tensor, k: int, largest: bool, group: Any) -> torch.Tensor:
    """The k-th largest (smallest) of ``values`` (1-D) over all ranks of ``group``; -inf (+inf) when the
    ranks hold fewer than ``k`` values."""
    fill = float("-inf") if largest else float("inf")
    local = torch.full((k,), fill, dtype=torch.float64, device=values.device)
    m = min(k, values.numel())
    if m:
        local[:m] = torch.topk(values.to(torch.float64), m, largest=largest).values
    world = _group_size(group)
    if world > 1:
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local, group=group)
        local = torch.cat(gathered)
    return torch.topk(local, k, largest=largest).values[-1]


def token_keys(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, seed: int
) -> torch.Tensor:
    """Uniform random keys in [0, 1) for the response tokens, a function of each sequence's token ids, the
    token's position and ``seed`` only (not of the batch it sits in).

    Args:
        input_ids / attention_mask: ``(bs, seqlen)`` prompt + response, the batch's fixed width.
        response_len: the response columns at the end.
        seed: e.g. the run's seed, the training step and the mini-batch.

    Returns:
        ``(bs, response_len)`` float32 keys on ``input_ids``' device.
    """
    seqlen = input_ids.shape[-1]
    weights = torch.randint(
        1, _HASH_PRIME, (seqlen,), generator=torch.Generator().manual_seed(20250528), dtype=torch.int64
    ).to(input_ids.device)
    tokens = (input_ids.to(torch.int64) + 1) * attention_mask.to(torch.int64)
    digests = ((tokens % _HASH_PRIME) * weights % _HASH_PRIME).sum(-1) % _HASH_PRIME
    keys = torch.empty(input_ids.shape[0], response_len, dtype=torch.float32)
    for row, digest in enumerate(digests.tolist()):
        gen = torch.Generator().manual_seed((int(digest) * 1_000_003 + int(seed)) % (2**63 - 1))
        keys[row] = torch.rand(response_len, generator=gen)
    return keys.to(input_ids.device)


def select_cov_tokens(
    loss_mode: str,
    advantages: torch.Tensor,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    keys: torch.Tensor | None = None,
    group: Any = None,
) -> torch.Tensor:
    """The tokens KL-Cov penalises or Clip-Cov cuts, chosen over all ranks of ``group``.

    Args:
        loss_mode: ``kl_cov`` or ``clip_cov``.
        advantages / log_prob / old_log_prob / response_mask: ``(bs, response_len)``; ``log_prob`` is the
            current policy's (read detached).
        config: the actor config: ``policy_loss.kl_cov_ratio`` | ``clip_cov_ratio``, ``clip_cov_lb``,
            ``clip_cov_ub``, and the clip ratios (Clip-Cov skips tokens PPO's clip already holds).
        keys: ``(bs, response_len)`` Clip-Cov's random keys (`token_keys`); None draws them from a
            generator seeded 0, which needs a single rank.
        group: the data-parallel ranks holding the rest of the mini-batch.

    Returns:
        ``(bs, response_len)`` bool.
    """
    if loss_mode not in COV_LOSS_MODES:
        raise ValueError(f"select_cov_tokens: loss_mode must be one of {COV_LOSS_MODES}, got {loss_mode!r}")
    check_shapes("select_cov_tokens", response_mask, advantages=advantages, log_prob=log_prob)
    valid = response_mask.bool()
    cov, n_valid = _covariance_and_count(advantages, log_prob, response_mask, group)
    if n_valid == 0:
        return torch.zeros_like(valid)
    pl = config.policy_loss
    if loss_mode == "kl_cov":
        k = max(1, int(n_valid * float(pl.kl_cov_ratio)))
        threshold = _global_kth(cov[valid], k, largest=True, group=group)
        return valid & (cov >= threshold)
    low, high = _clip_ratios(config, "select_cov_tokens")
    ratio = torch.exp(clamped_log_ratio(log_prob.detach(), old_log_prob))
    held_by_clip = -advantages * torch.clamp(ratio, 1 - low, 1 + high) > -advantages * ratio
    candidates = valid & ~held_by_clip & (cov > float(pl.clip_cov_lb)) & (cov < float(pl.clip_cov_ub))
    if keys is None:
        if _group_size(group) > 1:
            raise ValueError("select_cov_tokens: clip_cov over several ranks needs keys (token_keys)")
        keys = torch.rand(valid.shape, generator=torch.Generator().manual_seed(0)).to(valid.device)
    k = max(1, int(n_valid * float(pl.clip_cov_ratio)))
    threshold = _global_kth(keys[candidates], k, largest=False, group=group)
    return candidates & (keys <= threshold)


def _local_selection(
    loss_mode: str, cov_selected: torch.Tensor | None, args: tuple[torch.Tensor, ...], config: Any
) -> torch.Tensor:
    old_log_prob, log_prob, advantages, response_mask = args
    if cov_selected is None:
        return select_cov_tokens(loss_mode, advantages, log_prob, old_log_prob, response_mask, config)
    if cov_selected.shape != response_mask.shape:
        raise ValueError(
            f"compute_policy_loss_{loss_mode}: cov_selected has shape {tuple(cov_selected.shape)}, "
            f"expected (bs, response_len)={tuple(response_mask.shape)}"
        )
    return cov_selected.bool() & response_mask.bool()


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
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
    cov_selected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL-Cov (Cui et al. 2025): ``L_t = -A_t * rho_t``, plus ``ppo_kl_coef * |log rho_t|`` on the selected
    tokens, no clipping; ``rho_t = exp(clamp(log_prob_t - old_log_prob_t, -20, 20))``.

    Args:
        old_log_prob / log_prob / advantages / response_mask: ``(bs, response_len)``.
        loss_agg_mode / global_token_num / global_seq_num / dp_size / loss_scale_factor: see ``agg_loss``.
        config: actor config with ``policy_loss.kl_cov_ratio`` and ``policy_loss.ppo_kl_coef``.
        rollout_is_weights: ``(bs, response_len)`` weights multiplied into the per-token loss, or None.
        cov_selected: ``(bs, response_len)`` the penalised tokens, chosen over the mini-batch
            (`select_cov_tokens`); None selects the ``kl_cov_ratio`` share of this call's tokens.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, 0)``: ``pg_clipfrac`` is the share of valid tokens penalised;
        ``ppo_kl`` the masked mean of ``old_log_prob - log_prob``.
    """
    fn_name = "compute_policy_loss_kl_cov"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    selected = _local_selection(
        "kl_cov", cov_selected, (old_log_prob, log_prob, advantages, response_mask), config
    )
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    penalty = float(config.policy_loss.ppo_kl_coef) * log_ratio.abs() * selected.to(log_ratio.dtype)
    pg_losses = _apply_is_weights(-advantages * torch.exp(log_ratio) + penalty, rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return (
        pg_loss,
        masked_mean(selected.to(log_ratio.dtype), response_mask),
        masked_mean(-log_ratio.detach(), response_mask),
        zero,
    )


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
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
    cov_selected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip-Cov (Cui et al. 2025): PPO's clipped surrogate ``max(-A_t * rho_t, -A_t * clip(rho_t, 1 -
    clip_ratio_low, 1 + clip_ratio_high))`` with the selected tokens' loss (and gradient) set to 0; they
    stay in the token and sequence counts. No dual clip.

    Args:
        old_log_prob / log_prob / advantages / response_mask: ``(bs, response_len)``.
        loss_agg_mode / global_token_num / global_seq_num / dp_size / loss_scale_factor: see ``agg_loss``.
        config: actor config with the clip ratios and ``policy_loss.clip_cov_ratio`` / ``clip_cov_lb`` /
            ``clip_cov_ub``.
        rollout_is_weights: ``(bs, response_len)`` weights multiplied into the per-token loss, or None.
        cov_selected: ``(bs, response_len)`` the cut tokens, chosen over the mini-batch
            (`select_cov_tokens`); None draws the ``clip_cov_ratio`` share of this call's tokens.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, 0)``: ``pg_clipfrac`` is the share of valid tokens cut (verl's
        meaning in this mode); ``ppo_kl`` the masked mean of ``old_log_prob - log_prob``.
    """
    fn_name = "compute_policy_loss_clip_cov"
    check_shapes(fn_name, response_mask, old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages)
    selected = _local_selection(
        "clip_cov", cov_selected, (old_log_prob, log_prob, advantages, response_mask), config
    )
    low, high = _clip_ratios(config, fn_name)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    surrogate = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - low, 1 + high))
    pg_losses = _apply_is_weights(surrogate * (~selected).to(ratio.dtype), rollout_is_weights, fn_name)
    pg_loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )
    zero = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return (
        pg_loss,
        masked_mean(selected.to(ratio.dtype), response_mask),
        masked_mean(-log_ratio.detach(), response_mask),
        zero,
    )
