"""`rlflow.workers.role_setup`: verl's ``wrap_policy.transformer_layer_cls_to_wrap`` against the model."""

from __future__ import annotations

import dataclasses

import pytest

from rlflow.config.engine_schema import FSDPConfig, WrapPolicySection
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.workers.role_setup import RoleLayout, check_layer_classes


def _layout(names: list[str] | None) -> RoleLayout:
    fsdp = dataclasses.replace(
        FSDPConfig(), wrap_policy=WrapPolicySection(transformer_layer_cls_to_wrap=names)
    )
    return RoleLayout("actor_rollout_ref.actor", None, "fsdp2", 1, fsdp)


def test_named_layer_classes_must_be_the_decoder_layers_rlflow_wraps():
    model = build_tiny_model(TinyModelConfig(num_hidden_layers=2))
    check_layer_classes(model, _layout(None))
    check_layer_classes(model, _layout(["Qwen2DecoderLayer"]))
    with pytest.raises(ValueError) as err:
        check_layer_classes(model, _layout(["MistralDecoderLayer"]))
    assert str(err.value).startswith(
        "actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=['MistralDecoderLayer']: "
        "this model's decoder layers are ['Qwen2DecoderLayer']"
    )


def _quantized_layers(rank: int, model_dir: str) -> dict:
    """Build the actor, reference and critic as their workers do; report what each layer computes with."""
    from transformers import AutoConfig

    from rlflow.config import load_config, to_typed
    from rlflow.workers.role_setup import (
        actor_layout,
        build_role_module,
        critic_layout,
        ref_layout,
        setup_role_parallel,
    )

    config = to_typed(
        load_config(
            [
                f"actor_rollout_ref.model.path={model_dir}",
                f"critic.model.path={model_dir}",
                "actor_rollout_ref.actor.fsdp_config.fp8.format=hybrid",
                "actor_rollout_ref.actor.qat.enable=true",
                "actor_rollout_ref.actor.qat.mode=mxfp4_experts",
                "critic.fsdp_config.fp8.format=e4m3",
                "critic.fsdp_config.fp8.recipe=tensorwise",
            ],
            config_name="demo",
        )
    )
    facts = {}
    for role, kind, layout in (
        ("actor", "causal_lm", actor_layout(config)),
        ("ref", "causal_lm", ref_layout(config)),
        ("critic", "value", critic_layout(config)),
    ):
        parallel = setup_role_parallel(1, layout, AutoConfig.from_pretrained(model_dir))
        model = build_role_module(kind, layout, parallel)
        layer = model.model.layers[0]
        experts = layer.mlp.experts
        facts[role] = {
            "q_proj": (
                type(layer.self_attn.q_proj).__name__,
                getattr(layer.self_attn.q_proj, "fp8_recipe", None),
            ),
            "experts_fp8": getattr(experts, "fp8_recipe", None),
            "experts_qat": getattr(experts, "qat_spec", None),
            "head_quantized": any(  # the LM head and the value head keep the compute dtype
                hasattr(model.lm_head if kind == "causal_lm" else model.score, a)
                for a in ("fp8_recipe", "qat_spec")
            ),
        }
    return facts


def test_each_role_builds_the_fp8_and_qat_layers_its_config_asks_for(tmp_path):
    """The workers' model builder applies ``fsdp_config.fp8`` (actor, critic) and ``actor.qat``; the reference
    computes as the actor does (FP8 and QAT), so that its log-probs differ from the actor's by the weights."""
    from rlflow.models.fp8 import Fp8Recipe
    from rlflow.models.qat import QATSpec
    from rlflow.parallel.distributed import spawn_workers
    from tests.tiny_moe_model import save_tiny_moe_model

    facts = spawn_workers(_quantized_layers, 1, (save_tiny_moe_model(tmp_path / "moe"),))[0]
    hybrid, qat = Fp8Recipe("hybrid", "blockwise"), QATSpec("mxfp4_experts")
    for role in ("actor", "ref"):
        assert facts[role] == {
            "q_proj": ("Fp8Linear", hybrid),
            "experts_fp8": hybrid,
            "experts_qat": qat,
            "head_quantized": False,
        }, role
    assert facts["critic"] == {
        "q_proj": ("Fp8Linear", Fp8Recipe("e4m3", "tensorwise")),
        "experts_fp8": Fp8Recipe("e4m3", "tensorwise"),
        "experts_qat": None,
        "head_quantized": False,
    }
