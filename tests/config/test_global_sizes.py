"""verl's deprecated global micro-batch sizes become the per-rank keys, divided by each role's dp size."""

from __future__ import annotations

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import prepare_config

ACTOR, ROLLOUT, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


def _prepared(*overrides: str):
    return prepare_config(load_config(list(overrides), config_name="demo_two_ranks"), build_warm_start=False)


def test_global_sizes_are_divided_by_each_roles_data_parallel_size():
    # 2 ranks (the demo): actor dp 2; the reference and the critic with Ulysses 2 have dp 1.
    cfg = _prepared(
        "algorithm.use_kl_in_reward=true",
        f"{REF}.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=2",
        f"{ACTOR}.ppo_micro_batch_size=8",
        f"{ROLLOUT}.log_prob_micro_batch_size=6",
        f"{REF}.log_prob_micro_batch_size=4",
        "critic.ppo_micro_batch_size=2",
        "reward_model.micro_batch_size=4",
    )
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 3
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 4
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2
    assert cfg.critic.forward_micro_batch_size_per_gpu == 2  # follows the update's size, as before
    assert cfg.reward_model.micro_batch_size_per_gpu == 2
    untouched = _prepared()
    assert untouched.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8  # the per-rank default


def test_a_global_size_that_the_ranks_cannot_share_is_refused():
    with pytest.raises(
        ValueError, match=r"critic\.forward_micro_batch_size=3 .* multiple of the data-parallel size 2"
    ):
        _prepared("critic.forward_micro_batch_size=3")
