"""verl example scripts on Megatron-LM (``*_megatron.sh``, ``--config-name ppo_megatron_trainer``); see the
package docstring. Their Megatron keys are read onto FSDP2's (`rlflow.config.megatron_layout`); the
model-parallel sizes are GPU counts, scaled to the 2 ranks here (``# env``: the script's value), keeping
pipeline parallelism 2 where the script has it.
"""

from __future__ import annotations

# examples/grpo_trainer/run_qwen2-7b_math_megatron.sh: GRPO on Megatron, TP 2 x PP 2 for actor and reference;
# rollout_mode=sync leaves return_raw_chat unset (an empty value: false).
GRPO_QWEN2_7B_MATH_MEGATRON = [
    "algorithm.adv_estimator=grpo",
    "data.return_raw_chat=",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 4
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",  # env: 4
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.mode=sync",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",  # env: 4
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",  # env: 2
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=verl_grpo_example_gsm8k_math",
    "trainer.experiment_name=qwen2_7b_megatron",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
]


# examples/ppo_trainer/run_moonlight16b_a3b_gsm8k_megatron.sh: PPO with a critic (GAE), every role on
# PP 2 x TP 8 with 8-way expert parallelism over 4 nodes; the tokenizer's custom code (data.trust_remote_code).
PPO_MOONLIGHT16B_A3B_MEGATRON = [
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 512
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.trust_remote_code=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 4
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
    "critic.optim.lr=1e-5",
    "critic.ppo_micro_batch_size_per_gpu=2",  # env: 4
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=verl_megatron_gsm8k_examples",
    "trainer.experiment_name=moonlight_16b_a3b_instruct_1node",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",  # env: 4
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "actor_rollout_ref.model.trust_remote_code=True",
    "critic.model.trust_remote_code=True",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=13",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "critic.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",  # env: 8
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",  # env: 8
    "critic.megatron.tensor_model_parallel_size=1",  # env: 8
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=1",  # env: 8
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size=1",  # env: 8
    "critic.megatron.expert_model_parallel_size=1",  # env: 8
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
    "actor_rollout_ref.ref.megatron.expert_tensor_parallel_size=1",
    "critic.megatron.expert_tensor_parallel_size=1",
    "actor_rollout_ref.actor.megatron.param_offload=False",
    "actor_rollout_ref.actor.megatron.optimizer_offload=False",
    "actor_rollout_ref.actor.megatron.grad_offload=False",
    "actor_rollout_ref.ref.megatron.param_offload=False",
    "critic.megatron.param_offload=False",
    "critic.megatron.optimizer_offload=False",
    "critic.megatron.grad_offload=False",
    "trainer.val_before_train=False",
    "trainer.total_epochs=100",
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
]


# examples/gmpo_trainer/run_qwen2_5_7b_megatron.sh: GMPO (geo-mean loss) on Megatron with full recompute,
# every offload, Megatron's CPU optimizer, bf16 compute and its kernel switches (an Ascend NPU script).
GMPO_QWEN25_7B_MEGATRON = [
    "data.train_batch_size=8",  # env: 256
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.dataloader_num_workers=0",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.55",
    "actor_rollout_ref.rollout.max_model_len=1536",
    "actor_rollout_ref.rollout.max_num_seqs=128",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1152",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=1536",
    "actor_rollout_ref.rollout.calculate_log_probs=False",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.enable_prefix_caching=True",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[2,4,8,16,32,64,128]",
    "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.clip_ratio_low=0.4",
    "actor_rollout_ref.actor.clip_ratio_high=0.4",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.0",
    "+actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True",
    "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True",
    "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 128
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1536",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
    "actor_rollout_ref.actor.megatron.param_offload=True",
    "actor_rollout_ref.actor.megatron.grad_offload=True",
    "actor_rollout_ref.actor.megatron.optimizer_offload=True",
    "actor_rollout_ref.actor.megatron.use_mbridge=True",
    "actor_rollout_ref.actor.megatron.vanilla_mbridge=False",
    "actor_rollout_ref.actor.megatron.dtype=bfloat16",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.apply_rope_fusion=True",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.position_embedding_type=rope",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_rotary_pos_emb=True",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.normalization=RMSNorm",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_rmsnorm=True",
    "++actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=flash",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn=True",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=1536",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1",
    "actor_rollout_ref.ref.megatron.param_offload=True",
    "actor_rollout_ref.ref.megatron.use_mbridge=True",
    "actor_rollout_ref.ref.megatron.vanilla_mbridge=False",
    "trainer.balance_batch=True",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",
    "trainer.project_name=verl_gmpo_gsm8k_math",
    "trainer.experiment_name=qwen2_5_7b_gmpo_megatron_vllm_ascend",
    "trainer.n_gpus_per_node=2",  # env: 4
    "trainer.nnodes=1",
    "trainer.device=cpu",  # env: npu
    "trainer.val_before_train=False",
    "trainer.save_freq=10",
    "trainer.test_freq=-1",
    "trainer.resume_mode=auto",
    "trainer.max_actor_ckpt_to_keep=1",
    "trainer.total_epochs=2",
    "trainer.total_training_steps=100",
    "model_engine=megatron",
]
