"""OPO, GRPO pass@k and verl's vectorized GRPO / RLOO names (`rlflow.algos.group_advantages`) against
hand-computed values, and pass@k through the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlflow.algos.advantages import compute_grpo_outcome_advantage, compute_rloo_outcome_advantage
from rlflow.algos.estimator_registry import get_adv_estimator_fn
from rlflow.algos.group_advantages import (
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)


def _rewards(scores: list[float], lengths: list[int], width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(bs, width) rewards with each score on its response's last valid token, and the mask."""
    mask = torch.zeros(len(scores), width)
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    for i, (score, length) in enumerate(zip(scores, lengths)):
        mask[i, :length] = 1
        rewards[i, length - 1] = score
    return rewards, mask


def test_opo_subtracts_the_length_weighted_group_mean():
    # group a: scores 1, 0, 1 with 2, 4, 2 tokens -> baseline (2 + 0 + 2) / 8 = 0.5; group b: one response
    rewards, mask = _rewards([1.0, 0.0, 1.0, 0.7], [2, 4, 2, 3])
    index = np.array(["a", "a", "a", "b"], dtype=object)
    adv, ret = compute_opo_outcome_advantage(rewards, mask, index)
    want = torch.tensor([0.5, -0.5, 0.5, 0.7], dtype=torch.float64)
    torch.testing.assert_close(adv, want[:, None] * mask.double(), rtol=0, atol=1e-12)
    assert adv is ret


def test_opo_with_equal_lengths_is_the_group_mean_baseline():
    rewards, mask = _rewards([0.2, 0.9, 0.4], [3, 3, 3])
    adv, _ = compute_opo_outcome_advantage(rewards, mask, np.array([0, 0, 0]))
    torch.testing.assert_close(
        adv[:, 0], torch.tensor([0.2, 0.9, 0.4], dtype=torch.float64) - 0.5, rtol=0, atol=1e-12
    )


def test_passk_gives_the_best_response_its_margin_over_the_second():
    # group a: 1, 0, 0.5, 0.2 -> the best (row 0) gets 1 - 0.5, over the unbiased std 0.434933...
    # group b: a tie for the best -> all 0
    rewards, mask = _rewards([1.0, 0.0, 0.5, 0.2, 1.0, 1.0], [2, 3, 4, 1, 2, 2])
    index = np.array(["a", "a", "a", "a", "b", "b"], dtype=object)
    std = math.sqrt((0.575**2 + 0.425**2 + 0.075**2 + 0.225**2) / 3)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    want = torch.tensor([0.5 / (std + 1e-6), 0, 0, 0, 0, 0], dtype=torch.float64)
    torch.testing.assert_close(adv, want[:, None] * mask.double(), rtol=0, atol=1e-12)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(
        adv[:, 0], torch.tensor([0.5, 0, 0, 0, 0, 0], dtype=torch.float64), rtol=0, atol=1e-12
    )


def test_passk_refuses_a_group_of_one():
    rewards, mask = _rewards([1.0, 0.0, 0.3], [2, 2, 2])
    with pytest.raises(ValueError, match="at least 2 responses per group"):
        compute_grpo_passk_outcome_advantage(rewards, mask, np.array(["a", "a", "b"], dtype=object))


def test_verls_vectorized_names():
    rewards, mask = _rewards([1.0, 0.0, 0.7], [2, 3, 1])
    index = np.array(["a", "a", "b"], dtype=object)
    loop, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    vec, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    # a group of two: +-2 * 0.5; the group of one keeps its score under rloo and gets 0 under rloo_vectorized
    torch.testing.assert_close(
        loop[:, 0], torch.tensor([1.0, -1.0, 0.7], dtype=torch.float64), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        vec[:, 0], torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-12
    )
    assert get_adv_estimator_fn("grpo_vectorized") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("opo") is compute_opo_outcome_advantage


def test_passk_needs_several_responses_per_prompt_before_ray_starts():
    from rlflow.trainer.check_config import check_config

    check_config(["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=2"], "demo")
    with pytest.raises(
        ValueError, match=r"^algorithm\.adv_estimator=grpo_passk needs actor_rollout_ref\.rollout\.n >= 2"
    ):
        check_config(["algorithm.adv_estimator=grpo_passk"], "demo")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_passk_trains_only_on_each_prompts_best_response(tmp_path):
    from rlflow.config import load_config
    from rlflow.trainer.main_ppo import run_ppo

    result = run_ppo(
        load_config(
            [
                "algorithm.adv_estimator=grpo_passk",
                "actor_rollout_ref.rollout.n=4",
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "trainer.total_training_steps=1",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                "trainer.logger=[jsonl]",
                f"trainer.log_dir={tmp_path / 'logs'}",
                f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            ],
            "demo",
        )
    )
    (h,) = [h for h in result["history"] if h["step"] == 1]
    assert math.isfinite(h["actor/pg_loss"])
    # only best responses have an advantage, their margin: never negative
    assert h["critic/advantages/min"] >= 0.0 and h["critic/advantages/max"] >= 0.0
