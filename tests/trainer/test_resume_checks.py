"""Before Ray starts, a resume checkpoint must hold the LoRA adapters the run's config gives each role
(`rlflow.trainer.checkpointing.check_resume_adapters`, run by `prepare_config`).

A checkpoint of the embedded tiny model's architecture is written here without Ray (`save_checkpoint` on a
plain module, the trainer's directory layout around it). Before, turning adapters on or off (or changing
their rank) between a run and its resume failed only inside the workers, on DCP's missing keys, after Ray
and every role had started, or dropped the trained adapters without a word when only the model was
loaded.
"""

from __future__ import annotations

import re

import pytest
import torch

from rlflow.config import load_config
from rlflow.models.lora import LoRASpec, inject_lora
from rlflow.models.tiny import build_tiny_model
from rlflow.parallel.checkpoint import save_checkpoint
from rlflow.trainer.checkpointing import STATE_FILE, resume_dir
from rlflow.trainer.main_ppo import prepare_config
from rlflow.utils.checkpoint_files import write_latest_pointer


def _checkpoint(root, actor_rank: int, critic_rank: int | None) -> None:
    """``root/global_step_3`` with an actor (adapters of ``actor_rank`` on every linear layer, 0 = none)
    and, unless None, a critic, as the trainer writes them; the pointer names step 3."""
    from transformers import Qwen2ForTokenClassification

    step = root / "global_step_3"
    actor = build_tiny_model(seed=0)
    if actor_rank:
        inject_lora(actor, LoRASpec(rank=actor_rank, alpha=16.0))
    save_checkpoint(step / "actor", actor)
    if critic_rank is not None:
        config = actor.config
        config.num_labels = 1
        critic = Qwen2ForTokenClassification(config)
        if critic_rank:
            inject_lora(critic, LoRASpec(rank=critic_rank, alpha=16.0), trainable=[critic.score])
        save_checkpoint(step / "critic", critic)
    torch.save({"global_steps": 3}, step / STATE_FILE)
    write_latest_pointer(root, 3)


def _prepare(root, *overrides: str) -> None:
    # rlflow://tiny: the architecture the checkpoint was written with (a path the demo's warm start keeps)
    cfg = load_config(
        ["actor_rollout_ref.model.path=rlflow://tiny", f"trainer.default_local_dir={root}", *overrides],
        config_name="demo",
    )
    prepare_config(cfg, build_warm_start=False)


def test_a_resume_checkpoint_must_hold_the_adapters_the_config_gives_each_role(tmp_path):
    _checkpoint(tmp_path, actor_rank=8, critic_rank=4)
    assert resume_dir("auto", None, tmp_path) == str(tmp_path / "global_step_3")
    _prepare(tmp_path, "actor_rollout_ref.model.lora_rank=8", "critic.model.lora_rank=4")  # as saved
    _prepare(tmp_path, "trainer.resume_mode=disable")  # a fresh start reads nothing
    cases = [
        (
            [],
            "actor was saved with LoRA adapters of rank 8 on 28 linear layers, this run gives the actor no LoRA adapters",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=16", "critic.model.lora_rank=4"],
            "this run gives the actor LoRA adapters of rank 16 on 28 linear layers",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"],
            "this run gives the actor LoRA adapters of rank 8 on 8 linear layers (actor_rollout_ref.model.lora_rank",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=8"],
            "critic was saved with LoRA adapters of rank 4 on 28 linear layers, this run gives the critic no "
            "LoRA adapters (critic.model.lora_rank / lora_alpha / target_modules)",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            _prepare(tmp_path, *overrides)
    # resume_path names the checkpoint instead of the pointer; a run without a critic does not look at it
    step = tmp_path / "global_step_3"
    with pytest.raises(ValueError, match=re.escape(f"{step}/actor was saved with LoRA adapters")):
        _prepare(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}")
    _prepare(tmp_path, "actor_rollout_ref.model.lora_rank=8", "algorithm.adv_estimator=grpo")


def test_a_checkpoint_without_adapters_refuses_a_run_with_them(tmp_path):
    _checkpoint(tmp_path, actor_rank=0, critic_rank=0)
    _prepare(tmp_path)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "critic was saved with no LoRA adapters, this run gives the critic LoRA adapters of rank 2"
        ),
    ):
        _prepare(tmp_path, "critic.model.lora_rank=2")
