"""``algorithm.rollout_correction`` in whole PPO runs (critic, GAE, 2 mini-batches per step).

The hf rollout and the trainer compute the same log-probs up to float noise, so in the decoupled mode the
importance weights are 1 and nothing is rejected (within noise); in bypass mode the ``compute_log_prob``
pass is skipped, the rollout's log-probs are the old policy's (weights exactly 1, KL exactly 0) and the
step's losses equal the decoupled run's up to that noise.
"""

from __future__ import annotations

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

from .test_e2e import _overrides

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

RC = "algorithm.rollout_correction"
COMMON = [
    "trainer.total_training_steps=1",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    f"{RC}.rollout_is=token",
    f"{RC}.rollout_rs=token",
    f"{RC}.rollout_token_veto_threshold=1e-4",
]


def test_decoupled_and_bypass_modes(tmp_path):
    decoupled = run_ppo(load_config(_overrides(tmp_path / "d", *COMMON), config_name="demo"))["history"][-1]
    bypass = run_ppo(
        load_config(_overrides(tmp_path / "b", *COMMON, f"{RC}.bypass_mode=true"), config_name="demo")
    )["history"][-1]

    assert decoupled["timing_s/old_log_prob"] > 0
    assert decoupled["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert abs(decoupled["rollout_corr/kl"]) < 1e-5
    assert decoupled["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert decoupled["rollout_corr/rollout_is_veto_fraction"] == 0.0

    assert "timing_s/old_log_prob" not in bypass
    assert bypass["rollout_corr/rollout_is_mean"] == 1.0 and bypass["rollout_corr/kl"] == 0.0
    assert bypass["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    # same responses (seeded sampling), old log-probs that differ by float noise: same update
    assert bypass["response_length/mean"] == decoupled["response_length/mean"]
    assert bypass["critic/score/mean"] == decoupled["critic/score/mean"]
    scale = abs(decoupled["actor/pg_loss"]) + 1e-3
    assert bypass["actor/pg_loss"] == pytest.approx(decoupled["actor/pg_loss"], abs=1e-4 * scale)
    assert bypass["actor/ppo_kl"] == pytest.approx(decoupled["actor/ppo_kl"], abs=1e-5)
