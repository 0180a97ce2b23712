"""verl example scripts: PPO with a critic (``examples/ppo_trainer``); see the package docstring."""

from __future__ import annotations

# examples/ppo_trainer/run_deepseek7b_llm_sp2.sh: PPO, actor and critic Ulysses SP 2, gradient
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
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/ppo_trainer/run_deepseek7b_llm_sp2.sh as of verl's early-2025 config layout (commit 74061786):
# the KL terms as ``actor.kl_loss.{type,coef}`` and ``algorithm.in_reward_kl.*`` (rlflow.config.aliases).
DEEPSEEK7B_SP2_EARLY_2025 = [
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
    "actor_rollout_ref.actor.kl_loss.type=low_var_kl",
    "actor_rollout_ref.actor.kl_loss.coef=0.001",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",  # env: 64
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",  # env: 64
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "critic.optim.lr=1e-5",
    "critic.ulysses_sequence_parallel_size=2",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=2",  # env: 64
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.in_reward_kl.type=kl",
    "algorithm.in_reward_kl.kl_ctrl.type=fixed",
    "algorithm.in_reward_kl.coef=0.001",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='deepseek_llm_7b_function_rm_sp2'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
]


# examples/ppo_trainer/run_qwen2-7b_seq_balance.sh: PPO with a critic, dynamic batch sizes everywhere.
PPO_QWEN2_7B_SEQ_BALANCE = [
    "algorithm.adv_estimator=gae",
    "data.return_raw_chat=True",
    "data.train_batch_size=8",  # env: 4096
    "data.max_prompt_length=32",  # env: 4096
    "data.max_response_length=8",  # env: 4096
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 512
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000",
    "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_max_token_len_per_gpu=98304",
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='qwen2-7b_function_rm_bsz8k_p4k_r4k_seq_packing'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.val_before_train=False",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/ppo_trainer/run_qwen2-7b_rm.sh (the version with verl's reward loop): PPO with a critic and a
# model-based reward. ``{reward_model_dir}`` is a tiny sequence-classification model the test builds.
PPO_QWEN2_7B_RM = [
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 512
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "data.return_raw_chat=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 16
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",  # env: 16
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True",
    "critic.optim.lr_warmup_steps_ratio=0.05",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=4",  # env: 32
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "reward_model.enable=True",
    "reward_model.model.path={reward_model_dir}",  # env: FsfairX-LLaMA3-RM-v0.1
    "reward_model.use_reward_loop=True",
    "reward_model.inference.name=hf",  # env: vllm (needs a GPU; rlflow's reward model is not served)
    "reward_model.inference.gpu_memory_utilization=0.8",
    "reward_model.inference.tensor_model_parallel_size=1",
    "reward_model.inference.prompt_length=2048",
    "reward_model.inference.response_length=1024",
    "reward_model.num_workers=8",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_example'",
    "trainer.val_before_train=False",
    "trainer.experiment_name='Qwen2-7B-Instruct_hybrid_rm'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_fused_kernels.sh: PPO with a reward model, dynamic
# batch sizes everywhere, and the fused LM head for the actor's log-probs.
PPO_QWEN2_7B_RM_SEQ_BALANCE_FUSED = [
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",  # env: 4096
    "data.max_prompt_length=32",  # env: 4096
    "data.max_response_length=8",  # env: 4096
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "data.return_raw_chat=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_fused_kernels=True",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch",  # env: the script's default triton
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 512
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=240",  # env: 24000
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=240",  # env: 24000
    "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.use_dynamic_bsz=True",
    "critic.ppo_max_token_len_per_gpu=980",  # env: 98304
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "reward_model.enable=True",
    "reward_model.model.path={reward_model_dir}",  # env: FsfairX-LLaMA3-RM-v0.1
    "reward_model.model.use_remove_padding=True",
    "reward_model.model.fsdp_config.param_offload=True",
    "reward_model.micro_batch_size_per_gpu=4",  # env: 32
    "reward_model.use_dynamic_bsz=True",
    "reward_model.forward_max_token_len_per_gpu=980",  # env: 98304
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='qwen2-7b_hybrid_rm_bsz8k_p4k_r4k_seq_packing'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.val_before_train=False",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh: PPO with a reward model and dynamic batch sizes,
# profiling steps 1, 2 and 5 per call on chosen ranks of each role (verl's Nsight Systems keys; rlflow
# records torch.profiler traces, `rlflow.single_controller.profiling`).
PPO_QWEN2_7B_RM_SEQ_BALANCE_NSYS = [
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",  # env: 4096
    "data.max_prompt_length=32",  # env: 4096
    "data.max_response_length=8",  # env: 4096
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "data.return_raw_chat=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 512
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=80",  # env: 24000
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=80",  # env: 24000
    "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "critic.use_dynamic_bsz=True",
    "critic.ppo_max_token_len_per_gpu=80",  # env: 98304
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "reward_model.enable=True",
    "reward_model.model.path={reward_model_dir}",  # env: FsfairX-LLaMA3-RM-v0.1
    "reward_model.model.use_remove_padding=True",
    "reward_model.model.fsdp_config.param_offload=True",
    "reward_model.micro_batch_size_per_gpu=2",  # env: 32
    "reward_model.use_dynamic_bsz=True",
    "reward_model.forward_max_token_len_per_gpu=80",  # env: 98304
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_example_gsm8k'",
    "trainer.experiment_name='qwen2-7b_hybrid_rm_bsz8k_p4k_r4k_seq_packing'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.val_before_train=False",
    "trainer.nnodes=1",  # env: 2
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.total_epochs=15",
    "trainer.total_training_steps=6",
    "actor_rollout_ref.actor.profile_ranks=[0,1]",  # env: [0,1,8,9] on 2 nodes x 8
    "actor_rollout_ref.actor.profile_ranks_all=False",
    "actor_rollout_ref.actor.profile_discrete=True",
    "actor_rollout_ref.rollout.profile_ranks=[0]",  # env: [0,2,8,10]
    "actor_rollout_ref.rollout.profile_ranks_all=False",
    "actor_rollout_ref.rollout.profile_discrete=True",
    "actor_rollout_ref.ref.profile_ranks=[0]",  # env: [0,3,8,11]
    "actor_rollout_ref.ref.profile_ranks_all=False",
    "actor_rollout_ref.ref.profile_discrete=True",
    "critic.profile_ranks=[0]",  # env: [0,4,8,12]
    "critic.profile_ranks_all=False",
    "critic.profile_discrete=True",
    "trainer.profile_steps=[1,2,5]",
]


# examples/ppo_trainer/run_deepseek7b_llm_sandbox_fusion.sh: PPO whose code rewards run in a SandboxFusion
# service (verl's prime manager); tests/reward/test_sandbox_fusion.py scores code rows through one.
PPO_DEEPSEEK7B_SANDBOX_FUSION = [
    "reward_model.sandbox_fusion_url=https://xxxxxxxxx.apigateway-cn-beijing.volceapi.com/run_code",
    "reward_model.reward_manager=prime",
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 512
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 16
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",  # env: 32
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "critic.optim.lr=1e-5",
    "critic.model.use_remove_padding=True",
    "critic.model.enable_gradient_checkpointing=True",
    "critic.ppo_micro_batch_size_per_gpu=2",  # env: 32
    "critic.model.fsdp_config.param_offload=False",
    "critic.model.fsdp_config.optimizer_offload=False",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=verl_example_gsm8k",
    "trainer.experiment_name=deepseek_llm_7b_function_rm",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=1",
    "trainer.total_epochs=15",
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
]
