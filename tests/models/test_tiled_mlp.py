"""rlflow.models.tiled_mlp (verl's ``model.tiled_mlp``): the MLP over the tokens in checkpointed pieces.

A tiny Qwen2 in fp64, tiled into 3 pieces over 17 packed tokens (pieces of 6, 6, 5), against the same
model untiled: logits and every gradient agree to summation order (1e-12), with and without the layer's
own gradient checkpointing around it, and without autograd. What the forward keeps for the backward
(counted with ``saved_tensors_hooks``) loses at least the MLP's three ``tokens x intermediate``
activations per layer. Mixture-of-experts blocks and bad shard counts are refused naming the key.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlflow.models.tiled_mlp import install_tiled_mlp, tiled_forward

LAYERS, HIDDEN, INTERMEDIATE, TOKENS = 2, 16, 48, 17
KEY = "actor_rollout_ref.model.tiled_mlp"


def _model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(torch.float64)


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (1, TOKENS), generator=torch.Generator().manual_seed(3))


def _forward_backward(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Logits, gradients, and the bytes the forward saved for the backward (each storage once)."""
    model.zero_grad()
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(_ids()).logits
    (logits * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits.detach(), grads, sum(storages.values())


@pytest.mark.parametrize("layer_checkpointing", [False, True], ids=["plain", "inside-layer-checkpointing"])
def test_tiled_mlp_gives_the_untiled_numbers_and_keeps_less_for_the_backward(layer_checkpointing):
    plain, tiled = _model(), _model()
    assert install_tiled_mlp(tiled, 3, KEY) == LAYERS
    assert install_tiled_mlp(tiled, 3, KEY) == LAYERS  # idempotent: the pieces are not tiled again
    for model in (plain, tiled):
        model.train()
        if layer_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    logits, grads, saved = _forward_backward(plain)
    tiled_logits, tiled_grads, tiled_saved = _forward_backward(tiled)
    torch.testing.assert_close(tiled_logits, logits, rtol=0, atol=1e-12)
    assert tiled_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(tiled_grads[name], grad, rtol=1e-12, atol=1e-12, msg=name)
    if not layer_checkpointing:  # gate, up and their product: tokens x intermediate each, fp64, per layer
        assert saved - tiled_saved >= LAYERS * 3 * TOKENS * INTERMEDIATE * 8
    with torch.no_grad():
        torch.testing.assert_close(tiled(_ids()).logits, plain(_ids()).logits, rtol=0, atol=1e-12)


def test_pieces_cover_every_token_in_order():
    seen = []

    def record(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[-2])
        return x * 2

    x = torch.arange(2 * 7 * 3, dtype=torch.float64).reshape(2, 7, 3)
    assert torch.equal(tiled_forward(record, 3, x), x * 2)
    assert seen == [3, 3, 1]
    seen.clear()
    assert torch.equal(tiled_forward(record, 16, x), x * 2)  # more pieces than tokens: one token each
    assert seen == [1] * 7


def test_mixture_of_experts_blocks_and_bad_shard_counts_are_refused():
    from transformers import AutoModelForCausalLM

    from tests.tiny_moe_model import save_tiny_moe_model

    with pytest.raises(ValueError, match=rf"^{KEY}.num_shards=0 must be >= 1"):
        install_tiled_mlp(_model(), 0, KEY)
    with tempfile.TemporaryDirectory() as tmp:
        moe = AutoModelForCausalLM.from_pretrained(save_tiny_moe_model(tmp))
    with pytest.raises(ValueError, match=rf"^{KEY}.enabled=true: \w+ is a mixture-of-experts block"):
        install_tiled_mlp(moe, 2, KEY)


def _built_roles(rank: int) -> dict:
    from rlflow.config import config_section
    from rlflow.config.engine_schema import FSDPConfig
    from rlflow.models.loader import load_model_config
    from rlflow.parallel.fsdp import find_decoder_layers
    from rlflow.workers.role_setup import RoleLayout, build_role_module, model_path, setup_role_parallel

    out = {}
    for kind, role, section in (
        ("causal_lm", "actor_rollout_ref.actor", "actor_rollout_ref.model"),
        ("value", "critic", "critic.model"),
    ):
        for enabled in (False, True):
            model_cfg = config_section(
                section, path="rlflow://tiny", tiled_mlp={"enabled": enabled, "num_shards": 2}
            )
            layout = RoleLayout(role, model_cfg, "fsdp2", 1, FSDPConfig())
            parallel = setup_role_parallel(1, layout, load_model_config(model_path(model_cfg)))
            module = build_role_module(kind, layout, parallel)
            ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0))
            out[(kind, enabled)] = {
                "tiled": ["forward" in vars(layer.mlp) for layer in find_decoder_layers(module)],
                "logits": module(input_ids=ids, use_cache=False).logits.detach(),
            }
    return out


def test_roles_built_with_the_key_tile_every_layer_and_compute_the_same():
    from rlflow.parallel.distributed import spawn_workers

    built = spawn_workers(_built_roles, 1)[0]
    for kind in ("causal_lm", "value"):
        plain, tiled = built[(kind, False)], built[(kind, True)]
        assert not any(plain["tiled"]) and tiled["tiled"] and all(tiled["tiled"]), kind
        torch.testing.assert_close(tiled["logits"], plain["logits"], rtol=1e-5, atol=1e-6)
