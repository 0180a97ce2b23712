"""``actor_rollout_ref.model.mtp``: what is refused before Ray starts, naming the key."""

from __future__ import annotations

import pytest

from rlflow.trainer.check_config import check_config
from tests.tiny_hybrid_model import save_tiny_hybrid_model

MTP = "actor_rollout_ref.model.mtp"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [f"{MTP}.enable_train=true"],
            r"mtp\.enable_train=True needs actor_rollout_ref\.model\.mtp\.enable=true",
        ),
        (
            [f"{MTP}.enable=true", f"{MTP}.enable_rollout=true"],
            r"mtp\.enable_rollout=true: speculative decoding",
        ),
        (
            [f"{MTP}.num_speculative_tokens=3"],
            r"mtp\.num_speculative_tokens=3: the rollout engine's MTP draft",
        ),
        ([f"{MTP}.enable=true", f"{MTP}.num_layers=0"], r"mtp\.num_layers=0 must be >= 1"),
        ([f"{MTP}.enable=true", f"{MTP}.hybrid_override_pattern=*M"], r"MTP blocks are '\*'"),
        (
            [
                f"{MTP}.enable=true",
                f"{MTP}.enable_train=true",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            ],
            r"mtp\.enable_train with actor\.ulysses_sequence_parallel_size=2",
        ),
        ([f"{MTP}.enable=true", "actor_rollout_ref.model.lora_rank=4"], r"mtp\.enable with LoRA"),
        (
            [f"{MTP}.enable=true", f"{MTP}.hybrid_override_pattern=*E"],
            r"hybrid_override_pattern='\*E' sets Nemotron-H's MTP blocks; a qwen2 MTP layer is one decoder layer",
        ),
    ],
)
def test_mtp_settings_rlflow_does_not_run_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_config(overrides, "demo")


def test_the_checkpoints_mtp_layers_bound_depths_and_pattern(tmp_path):
    path = save_tiny_hybrid_model(tmp_path / "nh", with_mtp=True)  # one "*E" MTP layer
    base = [f"actor_rollout_ref.model.path={path}", f"{MTP}.enable=true", f"{MTP}.enable_train=true"]
    check_config([*base, f"{MTP}.num_layers=2", f"{MTP}.use_repeated_layer=true"], "demo")
    with pytest.raises(
        ValueError, match=r"mtp\.enable=true: 2 MTP depths need 2 MTP layers, the checkpoint has 1"
    ):
        check_config([*base, f"{MTP}.num_layers=2"], "demo")
    with pytest.raises(ValueError, match=r"hybrid_override_pattern='\*E-' differs from the checkpoint's"):
        check_config([*base, f"{MTP}.hybrid_override_pattern=*E-"], "demo")
    # Mamba layers cannot be split along the sequence
    with pytest.raises(ValueError, match=r"ulysses_sequence_parallel_size=2: nemotron_h has recurrent"):
        check_config(
            [
                f"actor_rollout_ref.model.path={path}",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "trainer.n_gpus_per_node=2",
            ],
            "demo",
        )


def test_architectures_without_rlflows_mtp_layers_are_refused(tmp_path):
    from transformers import Qwen3NextConfig

    from rlflow.models.tiny import build_tiny_tokenizer

    Qwen3NextConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1
    ).save_pretrained(tmp_path)
    build_tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"mtp\.enable=true: multi-token prediction for 'qwen3_next' models"):
        check_config([f"actor_rollout_ref.model.path={tmp_path}", f"{MTP}.enable=true"], "demo")
