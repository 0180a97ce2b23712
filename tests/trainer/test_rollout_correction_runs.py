"""``algorithm.rollout_correction`` in whole PPO runs (critic, GAE, 2 mini-batches per step), and the step
profiler (rlflow's keys and verl's later ``global_profiler`` layout together) in the same decoupled run.

The hf rollout and the trainer compute the same log-probs up to float noise, so in the decoupled mode the
importance weights are 1 and nothing is rejected (within noise); in bypass mode the ``compute_log_prob``
pass is skipped, the rollout's log-probs are the old policy's (weights exactly 1, KL exactly 0) and the
step's losses equal the decoupled run's up to that noise. With ``use_policy_gradient`` the actor's loss is
REINFORCE, weighted by the current policy against the rollout's in each micro-batch. The profiled step 2 leaves the traces of the
selected ranks of each role, per call or per step as asked, and step 1 none.
"""

from __future__ import annotations

import json

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

from .test_e2e import _overrides

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

RC = "algorithm.rollout_correction"
COMMON = [
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    f"{RC}.rollout_is=token",
    f"{RC}.rollout_rs=token",
    f"{RC}.rollout_token_veto_threshold=1e-4",
]
PROFILE = [  # the actor's and rollout's in rlflow's keys, the steps and the critic's in verl's later layout
    "global_profiler.tool=torch",
    "global_profiler.steps=[2]",
    "actor_rollout_ref.actor.profile_ranks=[0]",
    "actor_rollout_ref.actor.profile_discrete=true",
    "actor_rollout_ref.rollout.profile_ranks=[1]",
    "actor_rollout_ref.rollout.profile_discrete=true",
    "critic.profiler.enable=true",
    "critic.profiler.all_ranks=true",  # continuous: one trace per rank for the whole step
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("rollout_correction")
    traces = tmp / "traces"  # global_profiler.save_path, i.e. trainer.profile_dir
    decoupled = run_ppo(
        load_config(
            _overrides(tmp / "d", *COMMON, *PROFILE, f"global_profiler.save_path={traces}"),
            config_name="demo_two_ranks",
        )
    )["history"]
    bypass = run_ppo(
        load_config(
            _overrides(tmp / "b", *COMMON, "trainer.total_training_steps=1", f"{RC}.bypass_mode=true"),
            config_name="demo_two_ranks",
        )
    )["history"]
    reinforce = run_ppo(
        load_config(
            _overrides(
                tmp / "r",
                *COMMON,
                "trainer.total_training_steps=1",
                f"{RC}.bypass_mode=true",
                f"{RC}.use_policy_gradient=true",
                f"{RC}.rollout_rs=token_k1",  # verl's current spelling of token, with its 'L_U' bounds
                f"{RC}.rollout_rs_threshold=0.5_2.0",
            ),
            config_name="demo_two_ranks",
        )
    )["history"]
    auto = run_ppo(  # bypass_mode null (the default) and nothing comparing the two: the pass is skipped
        load_config(_overrides(tmp / "a", "trainer.total_training_steps=1"), config_name="demo_two_ranks")
    )["history"]
    return {
        "decoupled": decoupled[0],
        "bypass": bypass[0],
        "reinforce": reinforce[0],
        "auto": auto[0],
        "profile": traces,
    }


def test_decoupled_mode_weights_are_one_and_nothing_is_rejected(runs):
    decoupled = runs["decoupled"]
    assert decoupled["timing_s/old_log_prob"] > 0
    assert decoupled["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert abs(decoupled["rollout_corr/kl"]) < 1e-5
    assert decoupled["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert decoupled["rollout_corr/rollout_is_veto_fraction"] == 0.0


def test_bypass_mode_skips_the_old_log_prob_pass_and_matches_the_decoupled_step(runs):
    decoupled, bypass = runs["decoupled"], runs["bypass"]
    assert "timing_s/old_log_prob" not in bypass
    assert bypass["rollout_corr/rollout_is_mean"] == 1.0 and bypass["rollout_corr/kl"] == 0.0
    assert bypass["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    # same responses (seeded sampling), old log-probs that differ by float noise: same update
    assert bypass["response_length/mean"] == decoupled["response_length/mean"]
    assert bypass["critic/score/mean"] == decoupled["critic/score/mean"]
    scale = abs(decoupled["actor/pg_loss"]) + 1e-3
    assert bypass["actor/pg_loss"] == pytest.approx(decoupled["actor/pg_loss"], abs=1e-4 * scale)
    assert bypass["actor/ppo_kl"] == pytest.approx(decoupled["actor/ppo_kl"], abs=1e-5)


def test_default_skips_the_pass_and_logs_the_rollouts_entropy(runs):
    """``bypass_mode: null`` with the hf engine in fp32: no ``compute_log_prob`` pass, and ``actor/entropy``
    (the old policy's, whole batch) from the rollout's distributions equals the decoupled run's pass."""
    decoupled, auto = runs["decoupled"], runs["auto"]
    assert "timing_s/old_log_prob" not in auto
    assert not any(k.startswith(("rollout_corr/", "training/rollout_probs_diff")) for k in auto)
    assert auto["response_length/mean"] == decoupled["response_length/mean"]
    assert auto["actor/entropy"] == pytest.approx(decoupled["actor/entropy"], rel=1e-5)
    scale = abs(decoupled["actor/pg_loss"]) + 1e-3
    assert auto["actor/pg_loss"] == pytest.approx(decoupled["actor/pg_loss"], abs=1e-4 * scale)
    assert auto["actor/ppo_kl"] == pytest.approx(decoupled["actor/ppo_kl"], abs=1e-5)


def test_policy_gradient_mode_weights_the_reinforce_loss_in_the_update(runs):
    """``use_policy_gradient``: no old-log-prob pass, and the ``rollout_corr/*`` metrics come from the
    actor's loss (weights of the policy being trained against the rollout's), not from the batch."""
    decoupled, reinforce = runs["decoupled"], runs["reinforce"]
    assert "timing_s/old_log_prob" not in reinforce
    assert "actor/pg_clipfrac" not in reinforce  # REINFORCE: nothing is clipped
    assert reinforce["response_length/mean"] == decoupled["response_length/mean"]
    # The first of the 2 mini-batches sees the rollout's policy (weights 1 up to float noise), the second
    # the policy after one optimizer step, which the demo's learning rate moves far: weights leave 1, and
    # tokens whose ratio leaves [1/2, 2] (rollout_rs=token_k1 with bounds 0.5_2.0) are rejected.
    assert reinforce["rollout_corr/rollout_is_mean"] != pytest.approx(1.0, abs=1e-3)
    assert 0 < abs(reinforce["actor/ppo_kl"]) < 1.0 and 0 < abs(reinforce["rollout_corr/kl"]) < 1.0
    # the rejection's bounds are the weights' truncation bounds: a token is rejected exactly when its ratio
    # is above the threshold or below its reciprocal (the veto at 1e-4 drops nothing here)
    assert reinforce["rollout_corr/rollout_is_veto_fraction"] == 0.0
    assert reinforce["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
        reinforce["rollout_corr/rollout_is_ratio_fraction_high"]
        + reinforce["rollout_corr/rollout_is_ratio_fraction_low"],
        abs=1e-9,
    )
    assert reinforce["rollout_corr/rollout_rs_masked_fraction"] > 0
    assert reinforce["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(
        reinforce["rollout_corr/rollout_rs_masked_fraction"], abs=1e-12
    )


def test_the_profiled_step_writes_the_selected_traces(runs):
    root = runs["profile"]
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]
    files = sorted(p.name for p in (root / "step_2").iterdir())
    assert files == [
        "actor_rollout_rank0_compute_log_prob.json",
        "actor_rollout_rank0_update_actor.json",
        "actor_rollout_rank1_generate_sequences.json",
        "critic_rank0.json",
        "critic_rank1.json",
    ]
    update = json.loads((root / "step_2" / "actor_rollout_rank0_update_actor.json").read_text())
    names = {e.get("name", "") for e in update["traceEvents"]}
    # matrix products (aten's mm / addmm, or oneDNN's linear: trainer.cpu_linear_kernel) and a backward
    products = ("mm", "_linear_pointwise")
    assert any(p in n for n in names for p in products) and any("backward" in n.lower() for n in names)
