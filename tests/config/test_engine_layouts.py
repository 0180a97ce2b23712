"""verl's other engines (VeOmni, NeMo Automodel, MindSpeed) read onto rlflow's FSDP2 keys
(`rlflow.config.engine_layouts`). The keys are those of verl's engine configs and example scripts; the
composed ports are in ``tests/trainer/verl_scripts/engines.py``."""

from __future__ import annotations

import logging
import re

import pytest

from rlflow.config.aliases import rewrite_overrides

A, REF, C = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"


def test_veomni_keys_become_fsdp2_keys():
    got = rewrite_overrides(
        [
            "model_engine=veomni",
            f"{A}.strategy=veomni",
            f"{A}.veomni.param_offload=True",
            f"{A}.veomni.optimizer_offload=True",
            f"{A}.veomni.fsdp_size=-1",
            f"{A}.veomni.ulysses_parallel_size=2",
            f"{A}.veomni.expert_parallel_size=",  # a script's unset variable
            f"{A}.veomni.enable_full_shard=False",  # ZeRO-2
            f"{A}.veomni.forward_prefetch=true",
            f"{A}.veomni.attn_implementation=flash_attention_2",
            f"{A}.veomni.moe_implementation=fused_triton",
            f"{A}.veomni.cross_entropy_loss_implementation=liger_kernel",
            f"{A}.veomni.seed=42",
            f"{A}.veomni.mixed_precision=true",
            f"{A}.veomni.use_torch_compile=false",
            f"{REF}.strategy=veomni",
            f"{REF}.veomni.param_offload=True",
            f"{REF}.veomni.optimizer_offload=True",  # the reference has no optimizer: dropped
            f"{C}.veomni.enable_fsdp_offload=True",  # FSDP2's CPU offload policy: rlflow's param_offload
            f"{C}.veomni.use_torch_compile=true",  # the critic has no log-prob kernels: dropped
            "data.train_batch_size=8",  # not an engine key: untouched
        ]
    )
    assert got == [
        f"{A}.strategy=fsdp2",
        f"{A}.fsdp_config.param_offload=True",
        f"{A}.fsdp_config.optimizer_offload=True",
        f"{A}.fsdp_config.fsdp_size=-1",
        f"{A}.ulysses_sequence_parallel_size=2",
        f"{A}.fsdp_config.reshard_after_forward=False",
        f"{A}.fsdp_config.forward_prefetch=true",
        f"{A}.use_torch_compile=false",
        f"{REF}.strategy=fsdp2",
        f"{REF}.fsdp_config.param_offload=True",
        f"{C}.fsdp_config.param_offload=true",
        "data.train_batch_size=8",
    ]


def test_automodel_keys_become_fsdp2_keys():
    got = rewrite_overrides(
        [
            "model_engine=automodel",
            f"{A}.automodel_config.distributed_strategy=fsdp2",
            f"{A}.automodel_config.tp_size=1",
            f"{A}.automodel_config.ep_size=8",
            f"{A}.automodel_config.cp_size=2",
            f"{A}.automodel_config.param_offload=true",
            f"{A}.automodel_config.activation_checkpointing=true",
            f"{A}.automodel_config.model_dtype=bf16",
            f"{A}.automodel_config.backend_config.attn=te",
            f"{A}.automodel_config.enable_fp8=false",
            f"{C}.automodel_config.activation_checkpointing=false",
            f"{REF}.automodel_config.activation_checkpointing=true",  # no backward: dropped
        ]
    )
    assert got == [
        f"{A}.ulysses_sequence_parallel_size=2",
        f"{A}.fsdp_config.param_offload=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        f"{A}.fsdp_config.mixed_precision.param_dtype=bf16",
        "critic.model.enable_gradient_checkpointing=false",
    ]


def test_mindspeed_keys_are_megatrons_then_fsdp2s():
    got = rewrite_overrides(
        [
            "model_engine=mindspeed",
            f"{A}.mindspeed.tensor_model_parallel_size=4",
            f"{A}.mindspeed.context_parallel_size=2",
            f"{A}.mindspeed.param_offload=True",
            f"{A}.mindspeed.grad_offload=True",
            f"{A}.mindspeed.use_mbridge=True",
            f"{A}.mindspeed.llm_kwargs.spec=[mindspeed_llm.tasks.models.spec.qwen3_spec, layer_spec]",
            f"+{A}.mindspeed.llm_kwargs.num_query_groups=8",
            f"+{A}.mindspeed.llm_kwargs.recompute_granularity=full",
            f"+{A}.mindspeed.llm_kwargs.recompute_method=uniform",
            f"+{A}.mindspeed.llm_kwargs.overlap_grad_reduce=True",
            f"{REF}.mindspeed.param_offload=True",
        ]
    )
    assert got == [
        f"{A}.megatron.tensor_model_parallel_size=4",  # checked as Megatron checks it (megatron_checks)
        f"{A}.ulysses_sequence_parallel_size=2",
        f"{A}.fsdp_config.param_offload=True",
        f"{A}.fsdp_config.grad_offload=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        f"{REF}.fsdp_config.param_offload=True",
    ]


def test_an_engine_key_dropped_says_why(caplog: pytest.LogCaptureFixture):
    # logged once per key and process
    with caplog.at_level(logging.INFO, logger="rlflow.config.engine_layouts"):
        assert rewrite_overrides([f"{C}.veomni.moe_implementation=fused_quack"]) == []
    assert (
        f"config key {C}.veomni.moe_implementation=fused_quack changes nothing: a kernel choice"
        in caplog.text
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model_engine=deepspeed"],
            "model_engine='deepspeed' must be one of ['dp', 'fsdp', 'megatron', 'veomni'",
        ),
        ([f"{A}.veomni.attn_implementation=native-sparse"], "sparse attention computes another function"),
        ([f"{A}.veomni.seed=7"], "rlflow seeds every worker from trainer.seed"),
        (
            [f"{A}.veomni.full_determinism=true"],
            f"{A}.veomni.full_determinism='true': not a switch in rlflow",
        ),
        ([f"{A}.veomni.activation_gpu_limit=0.5"], "offloading activations above a GPU-memory limit"),
        ([f"{A}.veomni.expert_parallel_size=two"], "must be a whole number >= 1 (or null)"),
        ([f"{A}.veomni.enable_fsdp_offload=maybe"], "expected true or false"),
        ([f"{A}.veomni.ulysses_size=2"], f"{A}.veomni.ulysses_size: not one of the veomni keys"),
        ([f"{A}.automodel_config.enable_fp8=true"], "fp8 training is not supported"),
        ([f"{A}.automodel_config.lr=1"], f"{A}.automodel_config.lr: not one of the automodel_config keys"),
        ([f"{A}.mindspeed.llm_kwargs.hidden_dropout=0.1"], "rlflow trains with the model's own dropout"),
        ([f"{A}.mindspeed.mm_kwargs.vision=1"], "MindSpeed-MM (multimodal models) is not supported"),
        ([f"{A}.mindspeed.llm_kwargs.lr=1"], f"{A}.mindspeed.llm_kwargs.lr: not one of the mindspeed keys"),
        (  # an engine key and rlflow's key for the same switch must agree
            [f"{A}.fsdp_config.param_offload=false", f"{A}.veomni.param_offload=true"],
            f"{A}.veomni.param_offload=true sets {A}.fsdp_config.param_offload=true, but the command line also sets",
        ),
        (  # also through verl's other spelling of rlflow's key
            [f"{A}.veomni.ulysses_parallel_size=2", f"{A}.fsdp_config.ulysses_sequence_parallel_size=1"],
            f"{A}.veomni.ulysses_parallel_size=2 sets {A}.ulysses_sequence_parallel_size=2",
        ),
    ],
)
def test_engine_keys_without_a_meaning_here_are_refused_naming_them(overrides: list[str], message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        rewrite_overrides(overrides)


def test_vllm_arguments_rlflow_owns_are_its_rollout_keys_and_must_agree():
    R = "actor_rollout_ref.rollout"
    got = rewrite_overrides(
        [
            f"+{R}.engine_kwargs.vllm.max_model_len=1024",
            f"{R}.max_model_len=1024",
            f"+{R}.engine_kwargs.vllm.tensor_parallel_size=1",
            f"{R}.disable_log_stats=False",
            f"+{R}.engine_kwargs.vllm.kv_cache_dtype=fp8",  # vLLM's own: passed on
        ]
    )
    assert got == [
        f"+{R}.max_model_len=1024",
        f"{R}.max_model_len=1024",
        f"+{R}.tensor_model_parallel_size=1",
        f"{R}.engine_kwargs.vllm.disable_log_stats=False",
        f"+{R}.engine_kwargs.vllm.kv_cache_dtype=fp8",
    ]
    with pytest.raises(ValueError, match=re.escape(f"sets {R}.max_model_len to 100 and to 1024")):
        rewrite_overrides([f"{R}.max_model_len=100", f"+{R}.engine_kwargs.vllm.max_model_len=1024"])
