"""verl example scripts: the other outcome-reward trainers (REINFORCE++, RLOO, ReMax, GPG, GMPO) and DAPO; see the package docstring."""

from __future__ import annotations

# examples/gpg_trainer/run_qwen2-7b_math.sh: GPG advantages and loss (`use_gpg_loss`, verl's flag for
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
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh: REINFORCE++, 8 responses, MSE KL loss.
REINFORCE_PP_QWEN2_7B_MATH = [
    "algorithm.adv_estimator=reinforce_plus_plus",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=3e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # env: 1024
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # env: 16
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=mse",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",  # env: 16
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",  # env: 16
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=2",  # env: 16
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/rloo_trainer/run_qwen2-7b.sh: RLOO, 5 responses, KL in the reward.
RLOO_QWEN2_7B = [
    "algorithm.adv_estimator=rloo",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",  # env: 80
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=10",  # env: 160
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=10",  # env: 160
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=True",
    "algorithm.kl_penalty=kl",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_rloo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.device=cpu",  # env: cuda
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh: ReMax (greedy baselines), dynamic batch sizes.
REMAX_QWEN25_3B_SEQ_BALANCE = [
    "algorithm.adv_estimator=remax",
    "data.train_batch_size=8",  # env: 512
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 128
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=True",
    "algorithm.kl_penalty=kl",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_remax_example_gsm8k'",
    "trainer.experiment_name='qwen2.5_3b_function_rm_kl1e-3'",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "trainer.total_epochs=5",
]


# examples/gmpo_trainer/run_qwen3_8b_fsdp.sh: GMPO (geo-mean loss), dynamic batch sizes everywhere.
GMPO_QWEN3_8B = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 2048
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
    "actor_rollout_ref.actor.clip_ratio_low=0.4",
    "actor_rollout_ref.actor.clip_ratio_high=0.4",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24576",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24576",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.balance_batch=True",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=verl_gmpo_gsm8k_math",
    "trainer.experiment_name=qwen3_8b_vllm_fsdp",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# recipe/dapo/test_dapo_7b_math.sh (launched through main_ppo): DAPO's clip-higher and token-mean loss,
# the dapo reward manager with its overlong buffer; and algorithm.filter_groups / data.gen_batch_size as
# recipe/dapo/run_dapo_qwen2.5_32b.sh sets them (enable, acc, 10 rounds, 3x the train batch).
DAPO_7B_MATH = [
    "data.prompt_key=prompt",
    "data.truncation='left'",
    "data.max_prompt_length=32",  # env: 2048
    "data.max_response_length=8",  # env: 8192
    "data.gen_batch_size=12",  # env: 1536 (3 x train_batch_size)
    "data.train_batch_size=4",  # env: 512
    "actor_rollout_ref.rollout.n=4",  # env: 16
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "algorithm.filter_groups.metric=acc",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.model.use_remove_padding=True",
    "+actor_rollout_ref.model.override_config.max_position_embeddings=32768",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=80",  # env: 20480 = 2 x (prompt + response)
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=120",  # env: 30720 = 3 x (prompt + response)
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=120",  # env: 30720
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=1",  # env: 10 (> the 2 steps the port runs: refused)
    "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 32
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",  # env: 4 (2 ranks)
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.80",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",  # env: 4
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",  # env: 32
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",  # env: 4096
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward_model.reward_kwargs.max_resp_len=8",  # env: 8192
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=DAPO",
    "trainer.experiment_name=DAPO-Qwen2.5-7b-MATH-0527a1",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",  # env: 8
    "trainer.val_before_train=True",
    "trainer.test_freq=10",
    "trainer.save_freq=10",
    "trainer.total_epochs=10",
    "trainer.total_training_steps=200",
    "trainer.resume_mode=auto",
    "trainer.log_val_generations=10",
]

# examples/sapo_trainer/run_qwen30b_sapo.sh (verl's newer layout: the reward section ``reward.*`` and the
# engine's ``fsdp_config.strategy``), its FSDP branch with GRPO: SAPO's smooth gate with tau_pos / tau_neg
# and DAPO's overlong reward shaping.
SAPO_QWEN3_30B = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "algorithm.gamma=1.0",
    "algorithm.lam=0.95",
    "data.return_raw_chat=True",
    "data.train_batch_size=4",  # env: 256
    "data.max_prompt_length=32",  # env: 2048
    "data.max_response_length=8",  # env: 8192
    "data.filter_overlong_prompts=True",
    "data.filter_overlong_prompts_workers=64",
    "data.truncation='error'",
    "trainer.use_legacy_worker_impl=disable",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=RL4LLM",
    "trainer.experiment_name=qwen3-30B-base-vanilla-fsdp",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",  # env: the Slurm allocation's nodes
    "trainer.val_before_train=False",
    "trainer.log_val_generations=100",
    "trainer.save_freq=-1",
    "trainer.test_freq=10",
    "trainer.total_epochs=10",
    "trainer.total_training_steps=2000",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.tau_pos=1.0",
    "actor_rollout_ref.actor.tau_neg=1.05",
    "actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 32
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=120",  # env: 3 x (prompt + response)
    "actor_rollout_ref.actor.fsdp_config.strategy=fsdp",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",  # env: 4
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.rollout.data_parallel_size=1",
    "actor_rollout_ref.rollout.expert_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    "actor_rollout_ref.rollout.n=4",  # env: 16
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "reward.reward_manager.name=dapo",
    "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward.reward_kwargs.overlong_buffer_cfg.len=4",  # env: 4096
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward.reward_kwargs.max_resp_len=8",  # env: 8192
]
