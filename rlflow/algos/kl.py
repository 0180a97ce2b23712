"""KL to the reference policy: per-token estimators, the actor's KL loss, the in-reward KL penalty and
the KL coefficient controllers (``algorithm.kl_ctrl``). Names follow verl's ``verl.trainer.ppo.core_algos``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlflow.algos.common import Count
from rlflow.algos.losses import agg_loss
from rlflow.utils.torch_functional import masked_mean

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "compute_kl_loss",
    "get_kl_controller",
    "kl_penalty",
]


# ----------------------------------------------------------------------------------------------------
# KL controllers
# ----------------------------------------------------------------------------------------------------


class FixedKLController:
    """Constant KL coefficient ``value`` (``algorithm.kl_ctrl.type: fixed``).

    Args:
        kl_coef: the coefficient.
    """

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers share one interface)."""


class AdaptiveKLController:
    """Adaptive KL coefficient, Ziegler et al. 2019 (arXiv:1909.08593, Sec. 2.2, proportional control).

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``.

    Args:
        init_kl_coef: starting coefficient.
        target_kl: KL the controller steers towards (> 0).
        horizon: number of samples over which the error is corrected (> 0).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if not target_kl > 0:
            raise ValueError(
                f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}"
            )
        if not horizon > 0:
            raise ValueError(
                f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}"
            )
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards the target after ``n_steps`` samples whose mean KL is ``current_kl``."""
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller described by ``kl_ctrl`` (``algorithm.kl_ctrl``).

    Args:
        kl_ctrl: the ``algorithm.kl_ctrl`` section: ``type`` ("fixed" | "adaptive"), ``kl_coef`` and, for
            adaptive, ``target_kl`` and ``horizon``.

    Returns:
        A ``FixedKLController`` or ``AdaptiveKLController``.
    """
    kind, kl_coef = kl_ctrl.type, kl_ctrl.kl_coef
    if kl_coef is None:
        raise ValueError("algorithm.kl_ctrl.kl_coef is not set")
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon
        )
    raise ValueError(f"algorithm.kl_ctrl.type must be 'fixed' or 'adaptive', got {kind!r}")


# ----------------------------------------------------------------------------------------------------
# KL estimators and losses
# ----------------------------------------------------------------------------------------------------


_KL_ALIASES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


def _kl_value(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    log_ratio = logprob - ref_logprob
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio.square()
    ref_log_ratio = torch.clamp(-log_ratio, min=-20, max=20)  # k3 = exp(ref - lp) - (ref - lp) - 1 >= 0
    return torch.clamp(torch.exp(ref_log_ratio) - ref_log_ratio - 1, min=-10, max=10)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs (J. Schulman, "Approximating
    KL divergence", 2020, http://joschu.net/blog/kl-approx.html).

    * ``"kl"`` / ``"k1"``: ``lp - ref``; ``"abs"``: ``|lp - ref|``;
      ``"mse"`` / ``"k2"``: ``0.5 (lp - ref)^2``;
    * ``"low_var_kl"`` / ``"k3"``: ``exp(ref - lp) - (ref - lp) - 1`` (``ref - lp`` clamped to [-20, 20],
      the result to [-10, 10]);
    * any of these with a ``"+"`` suffix (e.g. ``"k3+"``) is straight-through: the *value* of the named
      estimator with the *gradient* of k2, ``k2 - sg[k2] + sg[est]``. The k2 gradient, ``(lp - ref) *
      grad lp``, is an unbiased estimate of the gradient of KL(pi || pi_ref) for tokens sampled from pi,
      whereas the gradients of k1 / k3 used as losses are not.

    Args:
        logprob: ``(bs, response_len)`` policy log-probs of the sampled tokens.
        ref_logprob: ``(bs, response_len)`` reference-policy log-probs of the same tokens.
        kl_penalty: estimator name (above). ``"full"`` (needs full-vocab logits) is not supported.

    Returns:
        ``(bs, response_len)`` per-token KL estimate.
    """
    return _kl_penalty(logprob, ref_logprob, kl_penalty)


def _kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, name: str) -> torch.Tensor:
    straight_through = name.endswith("+")
    kind = _KL_ALIASES.get(name[:-1] if straight_through else name)
    if kind is None:
        if name.rstrip("+") == "full":
            raise ValueError(
                "kl_penalty 'full' needs full-vocabulary logits and is not supported; use k1/k2/k3"
            )
        raise ValueError(
            f"unknown kl_penalty {name!r}; choose one of {sorted(_KL_ALIASES)} (optionally with '+')"
        )
    if logprob.shape != ref_logprob.shape:
        raise ValueError(
            f"kl_penalty: logprob {tuple(logprob.shape)} and ref_logprob {tuple(ref_logprob.shape)} differ"
        )
    value = _kl_value(logprob, ref_logprob, kind)
    if not straight_through:
        return value
    k2 = _kl_value(logprob, ref_logprob, "k2")
    return k2 - k2.detach() + value.detach()


def compute_kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    *,
    global_token_num: Count | None = None,
    global_seq_num: Count | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """KL-to-reference loss of the actor (``actor.use_kl_loss``; GRPO, arXiv:2402.03300, Eq. 4):
    ``agg_loss(kl_penalty(logprob, ref_logprob, kl_loss_type))``.

    Args:
        logprob: ``(bs, response_len)`` current policy log-probs (carry the gradient).
        ref_logprob: ``(bs, response_len)`` reference log-probs.
        response_mask: ``(bs, response_len)``.
        kl_loss_type: estimator name (``actor.kl_loss_type``), see ``kl_penalty``.
        loss_agg_mode: see ``agg_loss``.
        global_token_num: see ``agg_loss``.
        global_seq_num: see ``agg_loss``.
        dp_size: see ``agg_loss``.
        loss_scale_factor: see ``agg_loss``.

    Returns:
        Scalar KL loss.
    """
    kld = _kl_penalty(logprob, ref_logprob, kl_loss_type)
    return agg_loss(
        kld, response_mask, loss_agg_mode, global_token_num, global_seq_num, dp_size, loss_scale_factor
    )


def apply_kl_penalty(data: Any, kl_ctrl: Any, kl_penalty: str = "kl") -> tuple[Any, dict[str, float]]:
    """In-reward KL penalty (Ziegler et al. 2019, arXiv:1909.08593, Eq. 2): ``r = score - beta * KL``.

    Reads ``data.batch["token_level_scores" | "old_log_probs" | "ref_log_prob" | "response_mask"]`` (all
    ``(bs, response_len)``), writes ``data.batch["token_level_rewards"]``, then updates ``kl_ctrl`` with
    the batch KL (per-sequence masked mean, then mean over sequences) and ``n_steps = bs``.

    Args:
        data: a ``DataProto`` (only ``data.batch``, a mapping of tensors, is read and written).
        kl_ctrl: a ``FixedKLController`` / ``AdaptiveKLController``; ``beta = kl_ctrl.value``.
        kl_penalty: estimator name (``algorithm.kl_penalty``), see ``kl_penalty``.

    Returns:
        ``(data, metrics)`` with ``metrics = {"actor/reward_kl_penalty": batch KL,
        "actor/reward_kl_penalty_coeff": beta used for this batch}``.
    """
    batch = data.batch
    keys = set(batch.keys())
    for key in ("token_level_scores", "old_log_probs", "ref_log_prob", "response_mask"):
        if key not in keys:
            raise ValueError(f"apply_kl_penalty: data.batch has no {key!r} (has {sorted(keys)})")
    response_mask = batch["response_mask"]
    scores = batch["token_level_scores"]
    with torch.no_grad():
        kld = _kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty)
        kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))
    beta = float(kl_ctrl.value)
    batch["token_level_rewards"] = scores - beta * kld.to(scores.dtype)
    current_kl = float(masked_mean(kld, response_mask, axis=-1).mean().item())
    kl_ctrl.update(current_kl=current_kl, n_steps=response_mask.shape[0])
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
