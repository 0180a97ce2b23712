"""verl example scripts: GRPO (``examples/grpo_trainer``); see the package docstring."""

from __future__ import annotations

# examples/grpo_trainer/run_qwen2-7b.sh: GRPO, 5 responses per prompt, low-variance KL loss.
GRPO_QWEN2_7B = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",  # env: 40
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",  # env: 40
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",  # env: 40
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/grpo_trainer/run_qwen2-7b_sync_ref_model.sh: GRPO with the reference moved toward the actor
# every 128 steps (alpha 0.9); tests/trainer/test_ref_sync.py runs the same mechanism.
GRPO_QWEN2_7B_SYNC_REF_MODEL = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 40
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",  # env: 40
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",  # env: 40
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.sync_ref_model=True",
    "actor_rollout_ref.ref.ref_model_sync_steps=128",
    "actor_rollout_ref.ref.ref_model_mixup_alpha=0.9",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/grpo_trainer/run_qwen2-7b_seq_balance.sh: GRPO with dynamic batch sizes (an older version also
# sets actor_rollout_ref.rollout.mode=async: tests/trainer/test_verl_ports.py runs the list with it).
GRPO_QWEN2_7B_SEQ_BALANCE = [
    "algorithm.adv_estimator=grpo",
    "data.return_raw_chat=True",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: sglang
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm_kl1e-3'",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/grpo_trainer/run_qwen3-8b_npu.sh: GRPO on FSDP2 with forward prefetch on the actor and the
# reference, verl's entropy-chunking switches (``++``), torch.compile off.
GRPO_QWEN3_8B_NPU = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 256
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 64
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",  # env: 10
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.ref.use_torch_compile=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",  # env: 32
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",  # env: 32
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=GRPO",
    "trainer.experiment_name=GRPO-Qwen3-8B-npu",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.device=cpu",  # env: npu
    "trainer.resume_mode=auto",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
    "actor_rollout_ref.ref.fsdp_config.forward_prefetch=True",
    "++actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
    "++actor_rollout_ref.ref.entropy_from_logits_with_chunking=True",
    "trainer.val_before_train=True",
    "trainer.save_freq=5",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]

# examples/grpo_trainer/run_glm41v_9b.sh: GRPO with the DAPO reward manager, the fused head, verl's
# multimodal image column (the embedded data is text), thinking on in the chat template, and checkpoints
# that also hold a Hugging Face copy of the actor.
GRPO_GLM41V_9B = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 32
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 2048
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.image_key=images",
    "+data.enable_thinking=True",
    "reward_model.reward_manager=dapo",
    "actor_rollout_ref.model.use_fused_kernels=True",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # env: 32
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",
    "trainer.project_name=torch_verl_grpo_example_geo3k_think",
    "trainer.experiment_name=glm45v_function_rm_think",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=-1",
    "trainer.total_epochs=15",
    "trainer.max_actor_ckpt_to_keep=3",
    "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
    "trainer.device=cpu",  # env: cuda
]


# examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh: GRPO training LoRA adapters (rank 64, alpha 32,
# every linear layer) with vLLM loading safetensors and summoning the weights layer by layer.
GRPO_QWEN25_3B_LORA = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 1024
    "data.max_prompt_length=32",  # env: 512
    "data.max_response_length=8",  # env: 1024
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "data.shuffle=False",
    "actor_rollout_ref.model.use_shm=True",
    "actor_rollout_ref.model.lora_rank=64",
    "actor_rollout_ref.model.lora_alpha=32",
    "actor_rollout_ref.actor.optim.lr=3e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 256
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",  # env: 40
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",  # env: 40
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 2
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.load_format=safetensors",
    "actor_rollout_ref.rollout.layered_summon=True",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",  # env: 40
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/grpo_trainer/run_mistral3_1_24b.sh: GRPO with the actor's and the reference's weights kept in
# bf16 (fsdp_config.model_dtype), both offloaded; the Mistral decoder layers named for wrapping.
GRPO_MISTRAL31_24B = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 256
    "data.max_prompt_length=32",  # env: 8196
    "data.max_response_length=8",  # env: 2048
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.image_key=images",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 128
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    # env: ['MistralDecoderLayer'] (the tiny Qwen2 model stands in for Mistral-Small-3.1)
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=['Qwen2DecoderLayer']",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.actor.strategy=fsdp2",
    # env: ['MistralDecoderLayer']
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=['Qwen2DecoderLayer']",
    "actor_rollout_ref.ref.fsdp_config.model_dtype=bfloat16",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=False",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=verl_grpo_example_geo3k",
    "trainer.experiment_name=mistral3_1_24b_ai",
    "trainer.n_gpus_per_node=2",  # env: 8
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


# examples/grpo_trainer/run_qwen3_vl_30b-fsdp2_npu.sh: GRPO on FSDP2 with activation offload, parameter
# and optimizer offload, gradient checkpointing and Ulysses sequence parallelism on actor and reference.
GRPO_QWEN3_VL_30B_FSDP2 = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",  # env: 64
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 2048
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.image_key=images",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 32
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.ref.fsdp_config.fsdp_size=2",  # env: 16
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=True",
    "actor_rollout_ref.ref.fsdp_config.reshard_after_forward=True",
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=True",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking=True",
    "actor_rollout_ref.actor.fsdp_config.offload_policy=False",
    "actor_rollout_ref.actor.use_dynamic_bsz=False",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.model.enable_activation_offload=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 8
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.ignore_eos=False",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.expert_parallel_size=1",  # env: 8 (experts of the MoE model)
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params=0",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",  # env: 4
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",  # env: 4
    "critic.strategy=fsdp2",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=console",
    "trainer.project_name=verl_grpo_example_geo3k",
    "trainer.experiment_name=qwen3_vl_30b_function_rm",
    "trainer.n_gpus_per_node=2",  # env: 16
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.total_epochs=15",
]


# examples/grpo_trainer/run_qwen3_vl_30b_a3b_fsdp.sh: GRPO with sequence-level importance weights
# (batch-normalised) and verl's current token rejection (rollout_rs=token_k1, bounds 0.6_1.6), Ulysses SP 2
# and fused kernels.
GRPO_QWEN3_VL_30B_A3B_FSDP = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.rollout_correction.rollout_is=sequence",
    "algorithm.rollout_correction.rollout_is_threshold=2.0",
    "algorithm.rollout_correction.rollout_is_batch_normalize=true",
    "algorithm.rollout_correction.rollout_rs=token_k1",
    "algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6",
    "data.train_batch_size=8",  # env: 512
    "data.max_prompt_length=32",  # env: 1024
    "data.max_response_length=8",  # env: 2048
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.image_key=images",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_fused_kernels=True",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch",  # env: triton needs a GPU
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # env: 128
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # env: 10
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",  # env: 8
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=True",
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True",
    "actor_rollout_ref.rollout.name=hf",  # env: vllm
    "actor_rollout_ref.rollout.max_num_batched_tokens=20000",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",  # env: 10
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # env: 4
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.n=4",  # env: 5
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",  # env: 10
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.fsdp_config.reshard_after_forward=True",
    "actor_rollout_ref.ref.fsdp_config.forward_prefetch=True",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking=True",
    "trainer.critic_warmup=0",
    "trainer.logger=[console]",  # env: console + wandb
    "trainer.project_name=verl_grpo_geo3k",
    "trainer.experiment_name=qwen3_vl_30b_a3b_grpo_vllm_fsdp",
    "trainer.n_gpus_per_node=2",  # env: 8
    "trainer.nnodes=1",
    "trainer.resume_mode=auto",
    "trainer.val_before_train=True",
    "trainer.save_freq=5",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb=0",
    "data.dataloader_num_workers=0",  # env: verl's default 8 loader processes, on 2 cores
]
