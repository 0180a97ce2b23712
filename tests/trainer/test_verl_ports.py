"""verl's example command lines run on rlflow with only environment edits.

Each port keeps every key and value of the verl script (facts: its overrides) and changes only what the
environment dictates: data and model paths (the embedded task and tiny model), GPU counts, batch sizes and
sequence lengths that fit a 2-core CPU machine, vLLM -> the HF rollout (no GPU), no wandb. The edited
overrides are marked ``# env``; ``trainer.total_training_steps=2`` is added so each port runs 2 steps.
"""

from __future__ import annotations

import math

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

# verl examples/ppo_trainer/run_deepseek7b_llm_sp2.sh: PPO, actor and critic Ulysses SP 2, gradient
# checkpointing and remove-padding on both.
DEEPSEEK7B_SP2 = [
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 512
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 32
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",  # env: 64
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4 GPUs
    "actor_rollout_ref.rollout.name=hf",  # env: vllm needs a GPU
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "critic.optim.lr=1e-5",
    "critic.ulysses_sequence_parallel_size=2",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=2",  # env: 64
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='deepseek_llm_7b_function_rm_sp2'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]

# verl examples/gpg_trainer/run_qwen2-7b_math.sh: GPG advantages and loss (`use_gpg_loss`, verl's flag for
# policy_loss.loss_mode=gpg), 5 responses per prompt, no KL.
GPG_QWEN2_7B_MATH = [
    "algorithm.adv_estimator=gpg",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.use_gpg_loss=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",  # env: 16
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",  # env: 16
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2 GPUs
    "actor_rollout_ref.rollout.name=hf",  # env: vllm needs a GPU
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",  # env: 16
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_gpg_example_gsm8k_math'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def _local(tmp_path) -> list[str]:
    return [
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        f"trainer.log_dir={tmp_path / 'logs'}",
    ]


def test_deepseek7b_llm_sp2_runs_two_steps(tmp_path):
    cfg = load_config([*DEEPSEEK7B_SP2, *_local(tmp_path)])
    assert cfg.critic.fsdp_config.param_offload is False  # verl's critic.model.fsdp_config.* alias
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        for key in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
            assert math.isfinite(h[key]), key
    assert "val-core/rlflow/repeat/reward/mean@1" in steps[-1]  # test_freq=5: validated at the last step


def test_gpg_qwen2_7b_math_runs_two_steps(tmp_path):
    cfg = load_config([*GPG_QWEN2_7B_MATH, *_local(tmp_path)])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gpg"  # verl's use_gpg_loss flag
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert "critic/vf_loss" not in h
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean"):
            assert math.isfinite(h[key]), key
        assert h["actor/pg_clipfrac"] == 0.0  # GPG has no ratio to clip
