"""Core PPO-family algorithms as small pure torch functions: the verl-compatible facade.

Advantage estimators, policy / value / entropy / KL losses, loss aggregation and KL controllers. Function
and keyword names follow verl's ``verl.trainer.ppo.core_algos`` so research code written against verl runs
unchanged: every name is importable from here. The code lives in

* ``rlflow.algos.advantages``: advantage estimators and their registry (``register_adv_est``,
  ``get_adv_estimator_fn``, ``AdvantageEstimator``);
* ``rlflow.algos.losses``: ``agg_loss``, policy losses and their registry, value, entropy losses
  and rollout importance-sampling weights;
* ``rlflow.algos.kl``: KL estimators (``kl_penalty``), ``compute_kl_loss``, ``apply_kl_penalty``
  and the KL controllers.

Shapes: ``bs`` responses of ``response_len`` tokens; every per-token tensor is ``(bs, response_len)`` and
``response_mask`` is 1 on tokens the policy generated (up to EOS), else 0.

Conventions shared by every estimator: rewards on masked tokens are ignored, and a recursion over time
skips masked tokens without breaking the chain (tool observations in the middle of a response, padding
after EOS). Every estimator takes ``**kwargs`` so a trainer can pass the same keyword inputs to any of
them. Every loss takes the keyword-only ``global_token_num``, ``global_seq_num``, ``dp_size`` and
``loss_scale_factor`` and hands them to ``agg_loss`` (see its docstring for the contract).
"""

from __future__ import annotations

from rlflow.algos.advantages import (
    ADV_ESTIMATOR_INFO,
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    EstimatorInfo,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    get_estimator_info,
    register_adv_est,
)
from rlflow.algos.common import Count
from rlflow.algos.group_advantages import (
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from rlflow.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
)
from rlflow.algos.losses import (
    AGG_LOSS_MODES,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_rollout_is_weights,
    compute_value_loss,
    get_policy_loss_fn,
    register_policy_loss,
)
from rlflow.algos.pg_variants import (
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_sapo,
)

__all__ = [
    "ADV_ESTIMATOR_INFO",
    "ADV_ESTIMATOR_REGISTRY",
    "AGG_LOSS_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "Count",
    "EstimatorInfo",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_kl_loss",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_is_weights",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_estimator_info",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "register_adv_est",
    "register_policy_loss",
]

compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage
"""verl's vectorized GRPO: the same estimator (``algorithm.adv_estimator=grpo_vectorized``)."""
