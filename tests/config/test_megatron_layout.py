"""verl's Megatron scripts read onto rlflow's FSDP2 keys (`rlflow.config.megatron_layout`) and their layout
checked as Megatron checks it (`rlflow.config.megatron_checks`).

The keys are those verl's Megatron example scripts pass (``examples/*_trainer/*megatron*.sh``); the 2-step
runs of such scripts are in ``tests/trainer/test_verl_ports.py``.
"""

from __future__ import annotations

import re

import pytest

from rlflow.config import load_config
from rlflow.config.aliases import rewrite_overrides
from rlflow.trainer.main_ppo import megatron_summaries, prepare_config

A, REF, C = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"
M = f"{A}.megatron"
T = f"{M}.override_transformer_config"


def test_megatron_overrides_become_fsdp2_overrides():
    got = rewrite_overrides(
        [
            f"{A}.strategy=megatron",
            f"{M}.tensor_model_parallel_size=2",
            f"{M}.pipeline_model_parallel_size=1",
            f"{M}.context_parallel_size=2",
            f"{M}.param_offload=True",
            f"{M}.grad_offload=True",
            f"{M}.optimizer_offload=False",
            f"{M}.dtype=bfloat16",
            f"{M}.use_mbridge=True",
            f"{M}.use_dist_checkpointing=True",
            f"{M}.dist_checkpointing_path=/ckpt/qwen",
            f"+{T}.recompute_granularity=full",
            f"+{T}.recompute_method=uniform",
            f"+{T}.recompute_num_layers=1",
            f"+{T}.apply_rope_fusion=True",
            f"+{T}.moe_router_dtype=fp32",
            f"+{T}.moe_aux_loss_coeff=0.01",
            f"+{T}.moe_z_loss_coeff=0.001",
            f"+{A}.optim.override_optimizer_config.optimizer_cpu_offload=True",
            f"+{A}.optim.override_optimizer_config.optimizer_offload_fraction=1.",
            f"+{A}.optim.override_optimizer_config.use_precision_aware_optimizer=True",
            f"{REF}.megatron.param_offload=True",
            f"{REF}.megatron.context_parallel_size=2",
            f"+{REF}.megatron.override_transformer_config.recompute_granularity=full",  # no backward
            f"{C}.strategy=megatron",
            f"{C}.megatron.pipeline_model_parallel_size=2",
            f"+{C}.megatron.override_transformer_config.recompute_granularity=selective",
            "reward_model.megatron.tensor_model_parallel_size=1",
            "reward_model.megatron.param_offload=True",
            "model_engine=megatron",
            "data.train_batch_size=8",  # not Megatron's: untouched
        ]
    )
    assert got == [
        f"{A}.strategy=fsdp2",
        f"{M}.tensor_model_parallel_size=2",
        f"{M}.pipeline_model_parallel_size=1",
        f"{A}.ulysses_sequence_parallel_size=2",
        f"{A}.fsdp_config.param_offload=True",
        f"{A}.fsdp_config.grad_offload=True",
        f"{A}.fsdp_config.optimizer_offload=False",
        f"{A}.fsdp_config.mixed_precision.param_dtype=bfloat16",
        f"{M}.use_dist_checkpointing=True",
        f"{M}.dist_checkpointing_path=/ckpt/qwen",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        f"{A}.moe_aux_loss_coef=0.01",  # the actor's router losses (rlflow.algos.moe)
        f"{A}.moe_z_loss_coef=0.001",
        f"{REF}.fsdp_config.param_offload=True",
        f"{REF}.ulysses_sequence_parallel_size=2",
        f"{C}.strategy=fsdp2",
        f"{C}.megatron.pipeline_model_parallel_size=2",
        "critic.model.enable_gradient_checkpointing=true",
        "reward_model.inference.tensor_model_parallel_size=1",
        "reward_model.model.fsdp_config.param_offload=True",
        "data.train_batch_size=8",
        f"{A}.fsdp_config.optimizer_offload=true",  # Megatron's CPU optimizer: after the role's own switch
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            f"+{C}.megatron.override_transformer_config.moe_aux_loss_coeff=0.01",
            "the critic's or the reference's router load-balancing loss is not part of rlflow's loss",
        ),
        (f"+{REF}.megatron.override_transformer_config.moe_z_loss_coeff=1e-3", "router z-loss is not part"),
        (f"+{T}.moe_router_bias_update_rate=0.001", "the aux-loss-free router bias update"),
        (f"+{T}.recompute_granularity=partial", "must be full, selective or null"),
        (f"+{T}.sequence_parallel=True", "a Megatron transformer option rlflow has no meaning for"),
        (f"{M}.use_fp8_padding=True", "not one of the Megatron keys rlflow reads onto FSDP2"),
        ("reward_model.megatron.pipeline_model_parallel_size=2", "one full copy per rank"),
        (
            f"+{A}.optim.override_optimizer_config.optimizer_offload_fraction=1.5",
            "expected a number in (0, 1]",
        ),
        (f"+{A}.optim.override_optimizer_config.clip_grad=1.0", "a Megatron optimizer option"),
        (f"{M}.use_mbridge=maybe", "expected true or false"),
        ("model_engine=deepspeed", "model_engine='deepspeed' must be one of"),
        (f"{M}.use_remove_padding=maybe", "expected true or false"),
    ],
)
def test_megatron_keys_without_a_meaning_here_are_refused_naming_them(override: str, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        rewrite_overrides([override])


def test_recompute_cannot_meet_an_explicit_no_checkpointing():
    message = "recompute_granularity=full sets it to true, but the command line also sets"
    with pytest.raises(ValueError, match=re.escape(message)):
        rewrite_overrides(
            [
                "actor_rollout_ref.model.enable_gradient_checkpointing=False",
                f"+{T}.recompute_granularity=full",
            ]
        )


def test_newer_megatron_kernel_switches_and_off_values_are_dropped():
    """DeepSeek-V4 / Nemotron / Qwen3.5 scripts' kernel, packing and pipeline options; DSA's indexer loss,
    multi-token prediction and fp8 at their off values; Megatron's aux_loss balancing is rlflow's."""
    got = rewrite_overrides(
        [
            f"+{T}.use_fused_mhc=False",
            f"+{T}.apply_dsa_kernel_fusion=True",
            f"+{T}.use_triton_gdn=False",
            f"+{T}.pipeline_model_parallel_layout='Et*3|(tt|)*29m|L'",
            f"+{T}.sequence_packing_scheduler=dp_balanced",
            f"+{T}.cp_partition_mode=contiguous",
            f"+{T}.max_seqlen_per_dp_cp_rank=",
            f"+{T}.calculate_per_token_loss=True",
            f"+{T}.cuda_graph_impl=none",
            f"+{T}.dsa_indexer_loss_coeff=0.0",
            f"+{T}.dsa_indexer_use_sparse_loss=True",
            f"+{T}.mtp_num_layers=",
            f"+{T}.fp8=null",
            f"+{T}.moe_router_load_balancing_type=none",
            f"+{A}.optim.override_optimizer_config.chunked_optimizer_state_offload=True",
            f"+{A}.optim.override_optimizer_config.optimizer_state_offload_chunk_size_mb=1024",
            f"+{A}.optim.override_optimizer_config.decoupled_weight_decay=True",
            f"+{A}.optim.override_optimizer_config.fp8_recipe=",
        ]
    )
    assert got == []
    assert rewrite_overrides(
        [f"+{T}.moe_router_load_balancing_type=aux_loss", f"+{T}.moe_aux_loss_coeff=0.01"]
    ) == [f"{A}.moe_aux_loss_coef=0.01"]
    for override, message in (
        (f"+{T}.dsa_indexer_loss_coeff=0.1", "the DeepSeek sparse-attention indexer's loss is not part"),
        (
            f"+{REF}.megatron.override_transformer_config.mtp_num_layers=1",
            "multi-token prediction is the actor's",
        ),
        (f"+{T}.fp8=e4m3", "Megatron's default recipe is delayed scaling"),
        (f"+{T}.fp8_recipe=delayed", "delayed scaling (scales from an amax history"),
        (
            f"+{T}.moe_router_load_balancing_type=seq_aux_loss",
            "rlflow's load-balancing loss is Megatron's aux_loss",
        ),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            rewrite_overrides([override])
    with pytest.raises(ValueError, match=re.escape("turns Megatron's load-balancing loss off")):
        rewrite_overrides([f"+{T}.moe_router_load_balancing_type=none", f"+{T}.moe_aux_loss_coeff=0.01"])


def test_megatron_mtp_keys_are_read_onto_the_actors_mtp_section():
    """Nemotron 3.5 Lightning's MTP keys: depths, repeated layer, pattern and loss weight onto
    ``actor_rollout_ref.model.mtp``; ``keep_mtp_spec_in_bf16`` dropped."""
    got = rewrite_overrides(
        [
            f"+{T}.mtp_num_layers=2",
            f'+{T}.mtp_hybrid_override_pattern="*E"',
            f"+{T}.mtp_use_repeated_layer=True",
            f"+{T}.keep_mtp_spec_in_bf16=True",
            f"+{T}.mtp_loss_scaling_factor=0.3",
        ]
    )
    mtp = "actor_rollout_ref.model.mtp"
    assert got == [
        f"{mtp}.num_layers=2",
        f"{mtp}.hybrid_override_pattern=*E",  # unquoted by the rewrite; Hydra reads it as the string
        f"{mtp}.use_repeated_layer=True",
        f"{mtp}.mtp_loss_scaling_factor=0.3",
    ]
    assert (
        rewrite_overrides(
            [f"+{T}.mtp_num_layers=null", f"+{REF}.megatron.override_transformer_config.mtp_num_layers=0"]
        )
        == []
    )


def test_megatron_remove_padding_is_the_models_and_must_agree_with_it():
    got = rewrite_overrides(
        [
            "actor_rollout_ref.model.use_remove_padding=True",
            f"{M}.use_remove_padding=True",
            f"{REF}.megatron.use_remove_padding=True",
            f"{C}.megatron.use_remove_padding=False",
            f"{M}.use_distributed_optimizer=True",
            f"{M}.sequence_parallel=True",
            f"{M}.use_megatron_fsdp=False",
        ]
    )
    assert got == [
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "critic.model.use_remove_padding=False",
    ]
    with pytest.raises(
        ValueError,
        match=re.escape(f"{M}.use_remove_padding=False sets it to False, but the command line also sets"),
    ):
        rewrite_overrides(
            ["actor_rollout_ref.model.use_remove_padding=true", f"{M}.use_remove_padding=False"]
        )


def _prepared(overrides: list[str]):
    cfg = load_config(["trainer.n_gpus_per_node=2", *overrides], config_name="ppo_megatron_trainer")
    return prepare_config(cfg, build_warm_start=False)


def test_a_megatron_script_composes_as_fsdp2_with_its_layout():
    cfg = _prepared(
        [
            "trainer.n_gpus_per_node=4",  # PP 2 x CP 2
            "ray_init.num_cpus=4",
            f"{A}.strategy=megatron",
            f"{M}.pipeline_model_parallel_size=2",
            f"{M}.virtual_pipeline_model_parallel_size=2",
            f"{M}.context_parallel_size=2",
            f"{M}.param_offload=True",
            f"{M}.grad_offload=True",
            f"{M}.use_dist_checkpointing=True",
            f"{M}.dist_checkpointing_path=/ckpt/qwen",
            f"+{T}.recompute_granularity=full",
            f"{A}.use_kl_loss=True",
        ]
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert actor.ulysses_sequence_parallel_size == 2
    assert (actor.fsdp_config.param_offload, actor.fsdp_config.grad_offload) == (True, True)
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert (
        actor.megatron.pipeline_model_parallel_size,
        actor.megatron.virtual_pipeline_model_parallel_size,
    ) == (2, 2)
    from rlflow.config import to_typed

    (line,) = megatron_summaries(to_typed(cfg))  # the reference keeps the default layout
    assert line.startswith(
        f"{M}: verl's Megatron layout TP 1 x PP 2 (virtual 2), EP 1 (ETP None) runs as FSDP2"
    )
    assert "Ulysses sequence parallelism 2" in line and "converts into /ckpt/qwen" in line


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [f"{M}.tensor_model_parallel_size=2", f"{M}.context_parallel_size=2"],
            f"{M}.tensor_model_parallel_size=2 x {M}.pipeline_model_parallel_size=1 x context (Ulysses) size 2 "
            "= 4 must divide the 2 ranks",
        ),
        (
            [f"{M}.pipeline_model_parallel_size=2", f"{M}.expert_model_parallel_size=2"],
            f"{M}.pipeline_model_parallel_size=2 x {M}.expert_model_parallel_size=2 x "
            f"{M}.expert_tensor_parallel_size=1 = 4 must divide",
        ),
        (
            [f"{C}.megatron.tensor_model_parallel_size=3", "algorithm.adv_estimator=gae"],
            f"{C}.megatron.tensor_model_parallel_size=3",
        ),
        ([f"{M}.virtual_pipeline_model_parallel_size=2"], "needs actor_rollout_ref.actor.megatron.pipeline"),
        (
            [f"{M}.use_dist_checkpointing=True"],
            f"{M}.use_dist_checkpointing=true needs {M}.dist_checkpointing_path",
        ),
        (
            [f"{M}.grad_offload=True"],
            f"{A}.fsdp_config.grad_offload=true without {A}.fsdp_config.param_offload",
        ),
    ],
)
def test_a_layout_megatron_would_refuse_is_refused(overrides: list[str], message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        _prepared(overrides)


def test_strategy_megatron_in_a_config_file_says_what_to_write(tmp_path):
    path = tmp_path / "critic.yaml"
    path.write_text("strategy: megatron\n")
    cfg = load_config(
        ["algorithm.adv_estimator=gae", f"critic.config_path={path}"], config_name="demo_two_ranks"
    )
    with pytest.raises(ValueError, match=re.escape("critic.strategy=megatron: rlflow trains on FSDP")):
        prepare_config(cfg, build_warm_start=False)


def test_a_boolean_given_no_value_is_false_as_verl_reads_it():
    """``data.return_raw_chat=$return_raw_chat`` with the variable unset (verl's run_qwen2-7b_math_megatron)."""
    cfg = load_config(["data.return_raw_chat=true", "data.return_raw_chat="], config_name="demo_two_ranks")
    assert cfg.data.return_raw_chat is False


def test_data_trust_remote_code_needs_the_models_and_megatron_lora_keys_are_aliases():
    with pytest.raises(
        ValueError, match=re.escape("data.trust_remote_code=true: every worker loads the tokenizer")
    ):
        _prepared(["data.trust_remote_code=True"])
    cfg = _prepared(
        [
            "data.trust_remote_code=True",
            "actor_rollout_ref.model.trust_remote_code=True",
            "actor_rollout_ref.model.lora.rank=16",
            "actor_rollout_ref.model.lora.alpha=32",
        ]
    )
    assert cfg.data.trust_remote_code is True
    assert (cfg.actor_rollout_ref.model.lora_rank, cfg.actor_rollout_ref.model.lora_alpha) == (16, 32)


def test_other_spellings_of_verls_megatron_scripts():
    cfg = load_config(
        [
            "reward_model.param_offload=True",  # older verl
            "actor_rollout_ref.actor.optim.lr_decay_style=cosine",  # verl's Megatron optimizer
            "critic.optim.lr_decay_style=constant",
            "data.filter_overlong_prompts_workers=8",  # one batched tokenizer call here: dropped, logged
        ],
        config_name="ppo_megatron_trainer",
    )
    assert cfg.reward_model.model.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert cfg.critic.optim.lr_scheduler_type == "constant"
    cfg = load_config(
        [
            "actor_rollout_ref.model.use_liger=True",  # Liger's Triton kernels: the fused LM head here
            "actor_rollout_ref.rollout.max_batch_size=256",  # TensorRT-LLM's batch limit
            "+actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=32",  # warned by the engine
        ]
    )
    assert cfg.actor_rollout_ref.model.use_fused_kernels is True
    assert cfg.actor_rollout_ref.rollout.max_num_seqs == 256
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.trtllm == {"batch_wait_timeout_iters": 32}
    with pytest.raises(
        ValueError, match=re.escape("data.filter_overlong_prompts_workers='many' must be a whole")
    ):
        load_config(["data.filter_overlong_prompts_workers=many"])
