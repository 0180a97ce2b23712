"""The registry of advantage estimators (``algorithm.adv_estimator``): names, what each needs, lookup.

The built-in estimators (`rlflow.algos.advantages`) register when that module is imported (the lookups
here import it). A user module registers its own with `register_adv_est`, verl's decorator name, and is
imported from the command line by ``actor_rollout_ref.model.external_lib``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch

__all__ = [
    "ADV_ESTIMATOR_INFO",
    "ADV_ESTIMATOR_REGISTRY",
    "AdvantageEstimator",
    "EstimatorInfo",
    "get_adv_estimator_fn",
    "get_estimator_info",
    "register_adv_est",
]


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (``algorithm.adv_estimator``)."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    GPG = "gpg"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GRPO_VECTORIZED = "grpo_vectorized"
    RLOO_VECTORIZED = "rloo_vectorized"


ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


@dataclass(frozen=True)
class EstimatorInfo:
    """What an advantage estimator needs besides rewards and the response mask.

    The one owner of the "needs a critic" rule: the trainer creates a critic group, validation refuses
    ``critic.enable=false`` and `rlflow.algos.advantages.compute_advantage` passes ``values``
    exactly for the estimators registered with ``needs_critic=True``.

    Attributes:
        needs_critic: receives ``values: (bs, response_len)`` from the critic.
        needs_baselines: receives ``reward_baselines: (bs,)`` (the reward of a greedy response, ReMax).
        per_sample: optional ``fn(token_level_rewards, values, response_mask, gamma, lam) -> (raw
            advantages, returns)`` whose rows depend only on themselves, such that the estimator equals
            it followed by whitening the advantages over the batch's valid tokens. The critic group then
            computes advantages on its shards with an all-reduce of the whitening statistics instead of
            gathering the batch (GAE).
    """

    needs_critic: bool = False
    needs_baselines: bool = False
    per_sample: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None


ADV_ESTIMATOR_INFO: dict[str, EstimatorInfo] = {}


def _name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(
    name_or_enum: str | AdvantageEstimator,
    *,
    needs_critic: bool | None = None,
    needs_baselines: bool | None = None,
    per_sample: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Callable:
    """Decorator registering an advantage estimator under ``name_or_enum``.

    Args:
        name_or_enum: the name (``str``) or ``AdvantageEstimator`` member.
        needs_critic: the estimator uses critic values (see `EstimatorInfo`); None = False for a new
            registration, unchanged when the same function is registered again.
        needs_baselines: the estimator uses greedy-response reward baselines (None as above).
        per_sample: its per-sample form (see `EstimatorInfo`); None keeps the registered one.

    Returns:
        The decorator; it raises ValueError if the name is already taken by another function.
    """

    def decorator(fn: Callable) -> Callable:
        name = _name(name_or_enum)
        if ADV_ESTIMATOR_REGISTRY.get(name, fn) is not fn:
            raise ValueError(
                f"advantage estimator {name!r} is already registered to {ADV_ESTIMATOR_REGISTRY[name]}"
            )
        old = ADV_ESTIMATOR_INFO.get(name, EstimatorInfo())
        ADV_ESTIMATOR_REGISTRY[name] = fn
        ADV_ESTIMATOR_INFO[name] = EstimatorInfo(
            needs_critic=old.needs_critic if needs_critic is None else needs_critic,
            needs_baselines=old.needs_baselines if needs_baselines is None else needs_baselines,
            per_sample=old.per_sample if per_sample is None else per_sample,
        )
        return fn

    return decorator


def get_estimator_info(name_or_enum: str | AdvantageEstimator) -> EstimatorInfo:
    """What the estimator registered as ``name_or_enum`` needs (`EstimatorInfo`).

    Args:
        name_or_enum: ``algorithm.adv_estimator``.

    Returns:
        Its info; ValueError listing the registered names if unknown.
    """
    get_adv_estimator_fn(name_or_enum)
    return ADV_ESTIMATOR_INFO.get(_name(name_or_enum), EstimatorInfo())


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable:
    """Return the advantage estimator registered as ``name_or_enum``.

    Args:
        name_or_enum: ``algorithm.adv_estimator``, a name or ``AdvantageEstimator`` member.

    Returns:
        The estimator; ValueError listing the registered names if unknown.
    """
    import rlflow.algos.advantages  # noqa: F401  (registers the built-in estimators)

    name = _name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"algorithm.adv_estimator: unknown advantage estimator {name!r}; "
            f"registered: {sorted(ADV_ESTIMATOR_REGISTRY)}"
        )
    return ADV_ESTIMATOR_REGISTRY[name]
