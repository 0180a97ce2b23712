"""``actor_rollout_ref.ref.sync_ref_model``: the reference follows the actor, and a resume restores it.

GRPO with a KL loss, one optimizer step per training step (``ppo_mini_batch_size = train_batch_size``),
so the update's KL term is computed on the weights that generated the step's responses. With
``ref_model_mixup_alpha=1`` and a sync every 2 steps: step 1's KL is 0 (actor = reference at the start),
step 2's is > 0 (the actor moved), and after the sync at the end of step 2 the reference *is* the actor,
so step 3's KL is 0 again. Resuming from step 2's checkpoint must restore the synced reference: step 3
then has KL 0 too, and equals the uninterrupted run's step 3; a resume that started from the initial
reference would see the KL of two steps of drift.
"""

from __future__ import annotations

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

from .test_e2e import _overrides, _small_train_file

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_synced_reference_follows_the_actor_and_is_checkpointed(tmp_path):
    common = [
        f"data.train_files={_small_train_file(tmp_path, 24)}",
        "trainer.total_training_steps=3",
        "trainer.save_freq=2",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # = data.train_batch_size: one update per step
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.ref.sync_ref_model=true",
        "actor_rollout_ref.ref.ref_model_sync_steps=2",
        "actor_rollout_ref.ref.ref_model_mixup_alpha=1.0",
    ]
    full = run_ppo(load_config(_overrides(tmp_path / "full", *common), config_name="demo_two_ranks"))[
        "history"
    ]
    kl = [h["actor/kl_loss"] for h in full if h["step"] > 0]
    assert abs(kl[0]) < 1e-7 and kl[1] > 1e-5 and abs(kl[2]) < 1e-7, kl
    assert full[1]["timing_s/sync_ref"] > 0 and "timing_s/sync_ref" not in full[0]
    step2 = tmp_path / "full" / "ckpt" / "global_step_2"
    assert (step2 / "ref").is_dir() and (step2 / "actor").is_dir()
    resumed = run_ppo(
        load_config(
            _overrides(
                tmp_path / "resumed",
                *common,
                "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={step2}",
            ),
            config_name="demo_two_ranks",
        )
    )["history"]
    assert [h["step"] for h in resumed] == [3]
    assert abs(resumed[0]["actor/kl_loss"]) < 1e-7
    assert resumed[0]["actor/pg_loss"] == pytest.approx(full[-1]["actor/pg_loss"], abs=1e-5)
