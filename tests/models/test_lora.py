"""rlflow.models.lora: the adapters' arithmetic, the module selection, merging, and the sharded paths.

One linear layer against hand-computed numbers; a tiny Qwen2 with adapters against the same model with
the merged weights (fp64 to 1e-10); the streamed merge (any order) against the state-dict merge; on 2
gloo ranks (FSDP2 and FSDP1, rank 1 built on ``meta``): only the adapters train, and the weights the
rollout engine receives (`rlflow.rollout.weights`, `sync_replica_weights`) give the adapted model's
logits.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from rlflow.models.lora import (
    LoRALinear,
    LoRASpec,
    inject_lora,
    lora_modules,
    lora_targets,
    merge_lora_state_dict,
    merge_lora_stream,
    output_head,
)
from rlflow.parallel.distributed import spawn_workers

LINEARS_PER_LAYER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _config(dtype: torch.dtype = torch.float32) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
        dtype=dtype,
    )


def _model(dtype: torch.dtype = torch.float32, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(_config(dtype)).to(dtype).eval()


def _randomize_adapters(model: nn.Module, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.copy_(
                    torch.randn(module.lora_B.shape, generator=gen, dtype=module.lora_B.dtype)
                )


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))


def test_one_layer_matches_hand_computed_values():
    layer = nn.Linear(2, 2, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        layer.bias.copy_(torch.tensor([0.5, -0.5]))
    holder = nn.Sequential(layer)
    inject_lora(holder, LoRASpec(rank=1, alpha=2.0), seed=0)  # scaling 2
    with torch.no_grad():
        layer.lora_A.copy_(torch.tensor([[1.0, -1.0]]))
        layer.lora_B.copy_(torch.tensor([[0.5], [2.0]]))
    x = torch.tensor([[1.0, 3.0]])
    # base: [1 + 6 + 0.5, 3 + 12 - 0.5] = [7.5, 14.5]; x A^T = -2; update = 2 * (-2) * [0.5, 2] = [-2, -8]
    assert layer(x).tolist() == [[5.5, 6.5]]
    merged = merge_lora_state_dict({f"0.{k}": v for k, v in holder[0].state_dict().items()})
    # W + 2 * B A = [[1 + 1, 2 - 1], [3 + 4, 4 - 4]]
    assert merged["0.weight"].tolist() == [[2.0, 1.0], [7.0, 0.0]]
    assert sorted(merged) == ["0.bias", "0.weight"]


def test_adapted_model_starts_equal_to_the_base_model_and_only_adapters_train():
    base, model = _model(), _model()
    names = inject_lora(model, LoRASpec(rank=4, alpha=8.0), seed=0)
    assert len(names) == 2 * len(LINEARS_PER_LAYER)  # all-linear: every layer's, not the LM head
    assert "lm_head" not in names
    ids = _ids()
    assert torch.equal(model(ids).logits, base(ids).logits)  # B = 0: the update is exactly zero
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.{leaf}" for n in names for leaf in ("lora_A", "lora_B")}
    model(ids).logits.square().mean().backward()
    for name, param in model.named_parameters():
        if name.endswith("lora_B"):
            assert param.grad is not None and param.grad.abs().max() > 0, name
        elif name.endswith("lora_A"):  # dL/dA = s B^T (...) = 0 while B = 0
            assert param.grad is not None and param.grad.abs().max() == 0, name
        else:
            assert param.grad is None, name


def test_a_value_models_head_is_never_adapted_and_trains_in_full_beside_the_adapters():
    """The critic's LoRA (``critic.model.lora_rank``): ``all-linear`` leaves the value head ``score``
    out, ``trainable=[head]`` keeps it trainable; the adapted critic starts with the base values."""
    config = _config()
    config.num_labels = 1
    torch.manual_seed(0)
    base = Qwen2ForTokenClassification(config).eval()
    model = Qwen2ForTokenClassification(config).eval()
    model.load_state_dict(base.state_dict())
    head = output_head(model)
    assert head is model.score
    names = inject_lora(model, LoRASpec(rank=2, alpha=4.0, key_prefix="critic.model"), trainable=[head])
    assert "score" not in names and len(names) == 2 * len(LINEARS_PER_LAYER)
    assert not isinstance(model.score, LoRALinear)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"score.weight", "score.bias"} | {
        f"{n}.{leaf}" for n in names for leaf in ("lora_A", "lora_B")
    }
    ids = _ids()
    assert torch.equal(model(ids).logits, base(ids).logits)
    model(ids).logits.square().mean().backward()
    assert model.score.weight.grad.abs().max() > 0
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    with pytest.raises(ValueError, match=r"^critic\.model\.target_modules=\('nothing',\)"):
        lora_targets(
            model, LoRASpec(rank=2, alpha=4.0, target_modules=("nothing",), key_prefix="critic.model")
        )


def test_same_seed_same_adapters_and_init_bound():
    a, b = _model(), _model()
    inject_lora(a, LoRASpec(rank=4, alpha=8.0), seed=5)
    inject_lora(b, LoRASpec(rank=4, alpha=8.0), seed=5)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name
    q = a.model.layers[0].self_attn.q_proj
    assert q.lora_A.shape == (4, 16) and q.lora_B.shape == (16, 4)
    assert 0 < q.lora_A.abs().max() <= 1 / 16**0.5  # nn.Linear's uniform bound 1/sqrt(in_features)
    assert float(q.lora_scaling) == 2.0


def test_merged_weights_give_the_adapted_models_logits():
    model = _model(torch.float64)
    inject_lora(model, LoRASpec(rank=3, alpha=5.0), seed=0)
    _randomize_adapters(model)
    merged = merge_lora_state_dict(model.state_dict())
    plain = _model(torch.float64, seed=7)
    plain.load_state_dict(merged, strict=True)
    ids = _ids()
    adapted, reference = model(ids).logits, plain(ids).logits
    assert (adapted - _model(torch.float64)(ids).logits).abs().max() > 1e-2  # the adapters matter
    torch.testing.assert_close(adapted, reference, rtol=0, atol=1e-10)


def test_streamed_merge_in_any_order_equals_the_state_dict_merge():
    model = _model()
    inject_lora(model, LoRASpec(rank=2, alpha=4.0), seed=0)
    _randomize_adapters(model)
    expected = merge_lora_state_dict(model.state_dict())
    pairs = list(model.named_parameters())
    random.Random(0).shuffle(pairs)
    streamed = dict(merge_lora_stream(pairs, lora_modules(model)))
    assert sorted(streamed) == sorted(k for k in expected if k in dict(model.named_parameters()))
    for name, tensor in streamed.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    with pytest.raises(ValueError, match="incomplete adapted modules"):
        list(merge_lora_stream([p for p in pairs if not p[0].endswith("lora_B")], lora_modules(model)))


@pytest.mark.parametrize(
    "targets, excluded, expected",
    [
        (("q_proj", "v_proj"), None, {"q_proj", "v_proj"}),
        (r".*\.mlp\..*", None, {"gate_proj", "up_proj", "down_proj"}),
        ("all-linear", ("down_proj",), set(LINEARS_PER_LAYER) - {"down_proj"}),
        ("all-linear", r".*layers\.1\..*", set(LINEARS_PER_LAYER)),  # layer 1 left out by the regex
    ],
)
def test_target_and_exclude_modules(targets, excluded, expected):
    model = _model()
    names = [n for n, _ in lora_targets(model, LoRASpec(2, 4.0, targets, excluded))]
    assert {n.rsplit(".", 1)[-1] for n in names} == expected
    if isinstance(excluded, str):
        assert all(".layers.0." in n for n in names)
    else:
        assert len(names) == 2 * len(expected)


def test_no_matching_module_names_the_key():
    with pytest.raises(ValueError, match=r"target_modules=.*matches no linear layer.*q_proj"):
        inject_lora(_model(), LoRASpec(2, 4.0, ("qkv_proj",)))


# --------------------------------------------------------------------------- 2 gloo ranks


def _sharded_worker(rank: int, strategy: str) -> dict:
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import build_sharded_model
    from rlflow.rollout.hf import build_generation_replica, sync_replica_weights

    dims = ParallelDims(world_size=2).build_meshes("cpu")
    spec = LoRASpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))

    def load(device: torch.device) -> nn.Module:
        if device.type == "meta":
            with device:
                model = Qwen2ForCausalLM(_config())
        else:
            model = _model()
        inject_lora(model, spec, seed=0)
        return model

    module = build_sharded_model(load, dims, strategy=strategy)
    trainable = [p for p in module.parameters() if p.requires_grad]
    optim = torch.optim.SGD(trainable, lr=0.5)
    ids = _ids()
    module.train()
    module(ids).logits.square().mean().backward()
    optim.step()
    module.eval()
    with torch.no_grad():
        logits = module(ids).logits
    replica = build_generation_replica(module, torch.float32, torch.device("cpu"))
    sync_replica_weights(module, replica, bucket_bytes=4096)
    with torch.no_grad():
        replica_logits = replica(ids).logits
    from rlflow.parallel.sharded import get_full_state_dict

    state = get_full_state_dict(module, rank0_only=False)
    return {
        "logits": logits,
        "replica_logits": replica_logits,
        "state": state,
        "num_trainable_tensors": len(trainable),
    }


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_sharded_adapters_train_alone_and_reach_the_rollout_replica_merged(strategy):
    results = spawn_workers(_sharded_worker, 2, (strategy,))
    base = _model().state_dict()
    for out in results:
        assert out["num_trainable_tensors"] == 2 * 3 * 2  # 2 layers x 3 modules x (A, B)
        state = out["state"]
        for name, tensor in base.items():  # every base weight unchanged by the step
            torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)
        moved = [n for n in state if n.endswith("lora_B") and state[n].abs().max() > 0]
        assert len(moved) == 6
        # the replica (merged weights, gathered in 4 KiB buckets) computes the adapted model's logits
        torch.testing.assert_close(out["replica_logits"], out["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[0]["logits"], results[1]["logits"], rtol=0, atol=0)
