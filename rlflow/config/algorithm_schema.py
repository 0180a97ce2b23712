"""Typed schema of the ``algorithm`` section (advantage estimation, the in-reward KL, DAPO's dynamic
sampling, PF-PPO, rollout correction) and of the user-function sections (`CustomFunctionConfig`); part of
`rlflow.config.schema`, which re-exports every class here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AlgorithmConfig",
    "CustomFunctionConfig",
    "FilterGroupsConfig",
    "KLCtrlConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
]


@dataclass
class CustomFunctionConfig:
    """A user function in a Python file: ``path`` (a ``.py`` file) and ``name`` (the function in it)."""

    path: str | None = None
    name: str | None = None


@dataclass
class KLCtrlConfig:
    """``algorithm.kl_ctrl``: in-reward KL coefficient, fixed | adaptive (Ziegler et al. 2019)."""

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476).

    Attributes:
        enable: drop the prompts whose ``rollout.n`` responses all have the same ``metric`` (a group of
            one is kept) and generate more rounds of ``data.gen_batch_size`` prompts until
            ``data.train_batch_size`` prompts are kept; the step trains on the first of them.
        metric: a reward extra-info key of the score function (``acc``, ``score``, ...), ``seq_reward``
            (the summed token-level scores) or ``seq_final_reward`` (the summed rewards after the KL
            penalty; without ``use_kl_in_reward`` the same).
        max_num_gen_batches: rounds per step before the step fails saying the data are too hard or too
            easy; <= 0 = no limit.
    """

    enable: bool = False
    metric: str | None = None
    max_num_gen_batches: int = 0


@dataclass
class PFPPOConfig:
    """``algorithm.pf_ppo``: PF-PPO's redrawn batch (``algorithm.use_pf_ppo``; `rlflow.algos.pf_ppo`).

    Attributes:
        reweight_method: pow (``|score| ** weight_pow``), max_min (only the best- and worst-scored
            responses), max_random (the best-scored 4x as likely as the others).
        weight_pow: the exponent of ``pow`` (>= 0).
    """

    reweight_method: str = "pow"
    weight_pow: float = 2.0


@dataclass
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: the rollout/trainer policy mismatch (`rlflow.algos.rollout_correction`).

    Every setting needs ``actor_rollout_ref.rollout.calculate_log_probs=true``.

    Attributes:
        rollout_is: importance weights ``pi_old / pi_rollout`` on the policy loss: null, token, sequence.
        rollout_is_threshold: their upper truncation.
        rollout_is_batch_normalize: weights divided by their batch mean.
        rollout_rs: drop tokens / responses whose ratio leaves the bounds: null, token, sequence, geometric;
            or verl's current options, comma-separated: token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3,
            seq_max_k2/k3, binary_kl (`rlflow.algos.rejection`).
        rollout_rs_threshold: token / sequence / geometric: the ratio's upper bound (null =
            ``rollout_is_threshold``), ``rollout_rs_threshold_lower`` the lower (null = 1 / upper). verl's
            current options: one threshold or one per option, comma-separated; a k1 option's is ``"L_U"``
            (the ratio within ``[L, U]``) or ``U`` (``[1/U, U]``), the others' an upper bound on their
            divergence.
        rollout_token_veto_threshold: drop a response with any token ratio below this (null = off).
        bypass_mode: no ``compute_log_prob`` pass: the rollout's log-probs are the old policy's. null (the
            default): only where they equal the pass's to float rounding, i.e. the hf engine in fp32 with
            nothing comparing the two (`rlflow.config.resolve_bypass_mode`); verl's default is false.
        use_policy_gradient: with ``bypass_mode``, the policy loss is REINFORCE weighted by these
            settings' weights of the current policy against the rollout's, recomputed in every micro-batch
            (`rlflow.algos.reinforce_loss`) instead of ``policy_loss.loss_mode``.
    """

    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: Any = None
    rollout_rs_threshold_lower: float | None = None
    rollout_token_veto_threshold: float | None = None
    bypass_mode: bool | None = None
    use_policy_gradient: bool = False


@dataclass
class AlgorithmConfig:
    """``algorithm``: advantage estimation and the in-reward KL penalty.

    Attributes:
        adv_estimator: a name registered in `rlflow.trainer.ppo.core_algos` (gae, grpo, rloo, gpg, opo,
            grpo_passk, ...).
        kl_penalty: per-token KL estimator of the in-reward penalty (kl, abs, mse, low_var_kl, k1..k3).
        custom_advantage_function: replaces the registry estimator when ``path`` and ``name`` are set.
        use_pf_ppo: after the advantages, the step trains on a batch of the same size drawn from its
            responses by score (PF-PPO, ``pf_ppo``).
    """

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    use_pf_ppo: bool = False
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    custom_advantage_function: CustomFunctionConfig = field(default_factory=CustomFunctionConfig)
