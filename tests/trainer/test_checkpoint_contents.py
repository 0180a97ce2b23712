"""``<role>.checkpoint.save_contents`` without the optimizer (verl's way to save disk): the checkpoints
hold no optimizer state, a resume restores the model and the rest and starts AdamW's moments afresh (said
in the log), and the resumed step computes the uninterrupted run's losses and gradients, which depend on
the weights and the data only (one optimizer step per step: its metrics come before any update of it)."""

from __future__ import annotations

import json
import logging
import re

import pytest

from rlflow.config import load_config, validate_config
from rlflow.trainer.main_ppo import run_ppo
from tests.config.keys import HEADS

from .test_e2e import _comparable, _overrides, _small_train_file

ACTOR, CRITIC = "actor_rollout_ref.actor", "critic"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_checkpoints_without_the_optimizer_resume_the_model(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rlflow")
    common = [
        f"data.train_files={_small_train_file(tmp_path, 16)}",
        "trainer.save_freq=1",
        f"{ACTOR}.ppo_mini_batch_size=8",  # one optimizer step per role and step: the metrics of step 2 are
        f"{CRITIC}.ppo_mini_batch_size=8",  # taken before it, on the weights step 1 left
        f"{ACTOR}.checkpoint.save_contents=['model','extra']",  # verl's SAPO Megatron script
        f"{CRITIC}.checkpoint.save_contents=[model,extra]",
    ]
    full = run_ppo(load_config(_overrides(tmp_path / "full", *common), config_name="demo_two_ranks"))
    step1 = tmp_path / "full" / "ckpt" / "global_step_1"
    for role in ("actor", "critic"):
        assert json.loads((step1 / role / "meta.json").read_text())["has_optimizer"] is False
    caplog.clear()
    resumed = run_ppo(
        load_config(
            _overrides(
                tmp_path / "resumed",
                *common,
                "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={step1}",
            ),
            config_name="demo_two_ranks",
        )
    )
    notes = [r.getMessage() for r in caplog.records if "holds no optimizer state" in r.getMessage()]
    assert len(notes) == 2 and all(
        "the optimizer's moments start afresh" in n for n in notes
    )  # actor, critic
    assert [h["step"] for h in resumed["history"]] == [2]
    want, got = _comparable(full["history"][-1]), _comparable(resumed["history"][-1])
    for key in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        tol = {"abs": 1e-5} if key == "actor/pg_loss" else {"rel": 1e-4}  # as test_e2e's resume tests
        assert got[key] == pytest.approx(want[key], **tol), key


def test_leaving_the_optimizer_out_is_warned_and_restoring_it_refused(caplog):
    cfg = load_config([f"{ACTOR}.checkpoint.save_contents=[model,extra]"], config_name="demo_two_ranks")
    with caplog.at_level(logging.WARNING, logger="rlflow.config.checkpoint_checks"):
        validate_config(cfg, **HEADS)
    assert "leaves ['optimizer'] out of every checkpoint: a resume starts optimizer afresh" in caplog.text
    cfg = load_config(
        [
            f"{ACTOR}.checkpoint.save_contents=[model,extra]",
            f"{ACTOR}.checkpoint.load_contents=[model,optimizer]",
        ],
        config_name="demo_two_ranks",
    )
    message = f"{ACTOR}.checkpoint.load_contents=['model', 'optimizer'] restores ['optimizer'], which"
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_config(cfg, **HEADS)
