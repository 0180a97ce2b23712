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
