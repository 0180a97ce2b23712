"""Checks of the actor's policy loss, ``actor_rollout_ref.actor.policy_loss.*`` and the keys its losses
read (part of `rlflow.config.validate.validate_config`)."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from rlflow.algos.losses import POLICY_LOSS_REGISTRY
from rlflow.config.checks import at_least, choice, number, positive, value_at

__all__ = ["check_policy_loss"]

logger = logging.getLogger(__name__)

ACTOR = "actor_rollout_ref.actor"
SEQUENCE_LEVEL = ("gspo", "sapo")
"""Losses verl always aggregates ``seq-mean-token-mean``, whatever ``loss_agg_mode`` says."""


def check_policy_loss(cfg: DictConfig) -> None:
    """A registered loss; the KL-Cov / Clip-Cov and SAPO settings, all of them whatever the mode (verl's
    defaults are valid)."""
    pl = f"{ACTOR}.policy_loss"
    mode = choice(cfg, f"{pl}.loss_mode", tuple(POLICY_LOSS_REGISTRY))
    for key in ("clip_cov_ratio", "kl_cov_ratio"):
        ratio = positive(cfg, f"{pl}.{key}")
        if ratio > 1:
            raise ValueError(f"{pl}.{key}={ratio!r} must be in (0, 1]: a share of the mini-batch's tokens")
    low, high = number(cfg, f"{pl}.clip_cov_lb"), number(cfg, f"{pl}.clip_cov_ub")
    if not low < high:
        raise ValueError(
            f"{pl}.clip_cov_lb={low!r} must be < {pl}.clip_cov_ub={high!r} (a covariance interval)"
        )
    at_least(cfg, f"{pl}.ppo_kl_coef", 0.0, integer=False)
    positive(cfg, f"{ACTOR}.loss_scale_factor", allow_none=True)
    positive(cfg, f"{ACTOR}.tau_pos")
    positive(cfg, f"{ACTOR}.tau_neg")
    agg = value_at(cfg, f"{ACTOR}.loss_agg_mode")
    if mode in SEQUENCE_LEVEL and agg != "seq-mean-token-mean":
        logger.warning(
            "%s.loss_mode=%s with %s.loss_agg_mode=%s: rlflow aggregates the loss as loss_agg_mode says, "
            "while verl always aggregates %s as seq-mean-token-mean (its paper's objective); set "
            "%s.loss_agg_mode=seq-mean-token-mean to train as verl does",
            pl,
            mode,
            ACTOR,
            agg,
            mode,
            ACTOR,
        )
