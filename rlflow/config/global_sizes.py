"""verl's deprecated global micro-batch sizes, converted to the per-rank keys rlflow reads.

Older verl scripts size micro-batches for the whole world (``actor_rollout_ref.actor.ppo_micro_batch_size=64``
on 8 GPUs); verl divides them by the role's data-parallel size and keeps the ``*_per_gpu`` forms since.
rlflow accepts the global keys with that meaning: `convert_global_micro_batch_sizes` (run by
``prepare_config`` before validation) sets each ``*_per_gpu`` key to ``global / dp`` and logs it. The global
value must be a multiple of the data-parallel size, which is where a ported script learns its world size
changed.

* ``actor_rollout_ref.actor.ppo_micro_batch_size`` -> ``actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu``
  (the actor's dp size);
* ``actor_rollout_ref.rollout.log_prob_micro_batch_size`` -> ``..._per_gpu`` (the actor's);
* ``actor_rollout_ref.ref.log_prob_micro_batch_size`` -> ``..._per_gpu`` (the reference's);
* ``critic.ppo_micro_batch_size``, ``critic.forward_micro_batch_size`` -> ``..._per_gpu`` (the critic's);
* ``reward_model.micro_batch_size`` -> ``reward_model.micro_batch_size_per_gpu`` (the world size).

``data.gen_batch_size`` without dynamic sampling: verl's loader hands out batches of
``data.gen_batch_size`` prompts and, with ``algorithm.filter_groups`` off, every step trains on all of them
(``data.train_batch_size`` then sizes nothing). `step_size_from_gen_batch_size` (also run by
``prepare_config``) gives such a config that meaning explicitly: the step's size becomes
``data.gen_batch_size``, with a warning naming both values.

The data-parallel size of a role is its world size divided by its Ulysses size; the critic's world is
``critic.world_size`` (the actor's when null); the reward model runs on every rank without SP.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "GLOBAL_MICRO_BATCH_KEYS",
    "convert_global_micro_batch_sizes",
    "role_world_size",
    "step_size_from_gen_batch_size",
]

logger = logging.getLogger(__name__)

GLOBAL_MICRO_BATCH_KEYS: dict[str, tuple[str, str]] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor",
    ),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor",
    ),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": (
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref",
    ),
    "critic.ppo_micro_batch_size": ("critic.ppo_micro_batch_size_per_gpu", "critic"),
    "critic.forward_micro_batch_size": ("critic.forward_micro_batch_size_per_gpu", "critic"),
    "reward_model.micro_batch_size": ("reward_model.micro_batch_size_per_gpu", "reward_model"),
}
"""global key -> (per-rank key, the section whose ``ulysses_sequence_parallel_size`` divides the world)."""


def _int(cfg: DictConfig, key: str) -> int:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r} must be an integer >= 1")
    return value


def role_world_size(cfg: DictConfig, section: str) -> int:
    """Ranks of the group that runs ``section``: ``nnodes × n_gpus_per_node``, or ``critic.world_size``
    for the critic when it is set."""
    if section == "critic" and OmegaConf.select(cfg, "critic.world_size") is not None:
        return _int(cfg, "critic.world_size")
    return _int(cfg, "trainer.nnodes") * _int(cfg, "trainer.n_gpus_per_node")


def _dp_size(cfg: DictConfig, section: str) -> int:
    world = role_world_size(cfg, section)
    if section == "reward_model":
        return world
    sp = _int(cfg, f"{section}.ulysses_sequence_parallel_size")
    return max(world // sp, 1)


def convert_global_micro_batch_sizes(cfg: DictConfig) -> DictConfig:
    """Set every ``*_per_gpu`` key whose global form is set (see the module docstring); in place.

    Raises:
        ValueError: a global size that is not a positive multiple of the role's data-parallel size.
    """
    for key, (per_gpu_key, section) in GLOBAL_MICRO_BATCH_KEYS.items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        value = _int(cfg, key)
        dp = _dp_size(cfg, section)
        if value % dp:
            raise ValueError(
                f"{key}={value} (verl's deprecated global micro-batch size) must be a multiple of the "
                f"data-parallel size {dp} it is divided by; or set {per_gpu_key} instead"
            )
        OmegaConf.update(cfg, per_gpu_key, value // dp, merge=False)
        logger.info(
            "%s=%d (global) -> %s=%d (%d data-parallel ranks)", key, value, per_gpu_key, value // dp, dp
        )
    return cfg


def step_size_from_gen_batch_size(cfg: DictConfig) -> DictConfig:
    """With ``algorithm.filter_groups.enable=false`` and ``data.gen_batch_size != data.train_batch_size``,
    set ``data.train_batch_size`` to ``data.gen_batch_size`` (verl trains on every prompt of a generation
    round when it does not filter) and log a warning; in place. Values of the wrong type are left to
    validation.
    """
    gen = OmegaConf.select(cfg, "data.gen_batch_size")
    train = OmegaConf.select(cfg, "data.train_batch_size")
    if OmegaConf.select(cfg, "algorithm.filter_groups.enable") is not False:
        return cfg
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (gen, train)) or gen == train:
        return cfg
    logger.warning(
        "data.gen_batch_size=%d with algorithm.filter_groups.enable=false: every step trains on all %d prompts "
        "of its generation round, as verl does, so data.train_batch_size=%d becomes %d (for a step of %d "
        "prompts drawn from rounds of %d, turn algorithm.filter_groups on)",
        gen,
        gen,
        train,
        gen,
        train,
        gen,
    )
    OmegaConf.update(cfg, "data.train_batch_size", gen, merge=False)
    return cfg
