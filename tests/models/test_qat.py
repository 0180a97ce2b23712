"""Quantization-aware training (`rlflow.models.qat`): the FP4 grids against hand-computed values, the
straight-through gradient, which layers each mode quantizes, and QAT under FP8."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from rlflow.models.fp8 import Fp8Recipe, fp8_linear, install_fp8
from rlflow.models.qat import (
    QATLinear,
    QATSpec,
    fake_quant_mxfp4,
    fake_quant_nvfp4,
    install_qat,
    qat_quantize_weights_,
    qat_weight_names,
    quantize_weight_stream,
    round_e2m1,
)
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from tests.tiny_moe_model import tiny_moe_config


def test_e2m1_rounds_to_nearest_with_ties_to_the_even_element_and_saturates() -> None:
    got = round_e2m1(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.3, 0.2, 2.6, -1e9]))
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, 0.0, 3.0, -6.0])
    assert torch.equal(got, expected)


def test_mxfp4_matches_hand_computed_values() -> None:
    w = torch.zeros(1, 64)
    # block 1: amax 5 -> scale 2^(floor(log2 5) - 2) = 1; 5 is a tie between 4 and 6 -> 4 (even)
    w[0, :4] = torch.tensor([5.0, 0.3, 2.6, -1.2])
    # block 2: amax 0.9 -> scale 2^(-1 - 2) = 1/8; 0.9 * 8 = 7.2 saturates at 6 -> 0.75; 0.1 * 8 = 0.8 -> 1 -> 0.125
    w[0, 32:34] = torch.tensor([0.9, 0.1])
    q = fake_quant_mxfp4(w)
    assert torch.equal(q[0, :4], torch.tensor([4.0, 0.5, 3.0, -1.0]))
    assert torch.equal(q[0, 32:34], torch.tensor([0.75, 0.125]))
    assert torch.equal(fake_quant_mxfp4(q), q)  # its own values are on the grid


def test_nvfp4_matches_hand_computed_values() -> None:
    w = torch.zeros(1, 48)
    # tensor scale: amax 2688 / (448 * 6) = 1. Block 1: scale 2688 / 6 = 448 (an E4M3 value); 1000 / 448 = 2.23 -> 2
    w[0, :2] = torch.tensor([2688.0, 1000.0])
    # block 2: scale 3 / 6 = 0.5; 1.1 / 0.5 = 2.2 -> 2 -> 1.0
    w[0, 16:18] = torch.tensor([3.0, 1.1])
    # block 3: scale 1.3 / 6 = 0.2167 -> E4M3 0.21875 (step 2^-6 in [0.125, 0.25)); 1.3 / 0.21875 = 5.94 -> 6,
    # 0.4 / 0.21875 = 1.83 -> 2
    w[0, 32:34] = torch.tensor([1.3, 0.4])
    q = fake_quant_nvfp4(w)
    torch.testing.assert_close(q[0, :2], torch.tensor([2688.0, 896.0]))
    torch.testing.assert_close(q[0, 16:18], torch.tensor([3.0, 1.0]))
    torch.testing.assert_close(q[0, 32:34], torch.tensor([6 * 0.21875, 2 * 0.21875]))


def test_the_gradient_passes_straight_through_the_quantizer() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    plain = torch.nn.Linear(64, 32)
    plain.load_state_dict(layer.state_dict())
    spec = QATSpec("w4a16")
    layer.__class__ = QATLinear
    layer.qat_spec = spec
    x = torch.randn(5, 64, requires_grad=True)
    x_plain = x.detach().clone().requires_grad_()
    g = torch.randn(5, 32)
    layer(x).backward(g)
    plain(x_plain).backward(g)
    torch.testing.assert_close(layer(x), F.linear(x, fake_quant_nvfp4(layer.weight), layer.bias))
    # dL/dW = g^T x whatever W is: the straight-through estimator hands it to the full-precision weight
    torch.testing.assert_close(layer.weight.grad, plain.weight.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, g @ fake_quant_nvfp4(layer.weight.detach()), rtol=1e-5, atol=1e-6)


def _moe() -> torch.nn.Module:
    tiny = TinyModelConfig()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(
        tiny_moe_config(tiny.vocab_size, 64, tiny.max_position_embeddings)
    )


def test_each_mode_quantizes_its_layers() -> None:
    dense = build_tiny_model(TinyModelConfig())
    layers = dense.config.num_hidden_layers
    assert install_qat(dense, QATSpec("w4a16")) == 7 * layers  # lm_head and the embeddings left out
    assert type(dense.lm_head) is torch.nn.Linear and type(dense.model.layers[0].mlp.up_proj) is QATLinear
    with pytest.raises(ValueError, match="has no routed experts to quantize"):
        install_qat(build_tiny_model(TinyModelConfig()), QATSpec("mxfp4_experts"))

    moe = _moe()
    assert install_qat(moe, QATSpec("mxfp4_experts")) == 2  # one experts block per layer, nothing else
    assert type(moe.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert moe.config._experts_implementation == "eager"
    names = qat_weight_names(moe, QATSpec("mxfp4_experts"))
    assert names == {
        f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")
    }


@pytest.mark.parametrize("fp8", [False, True])
def test_a_quantized_copy_computes_what_the_qat_trainer_computes(fp8: bool) -> None:
    """The rollout's copy (weights replaced by their MXFP4 values) gives the QAT trainer's logits, with
    the experts' FP8 GEMMs on top when FP8 is on (the DeepSeek-V4 recipe); QAT changes the logits."""
    spec = QATSpec("mxfp4_experts")
    trainer, rollout, plain = _moe(), _moe(), _moe()
    rollout.load_state_dict(trainer.state_dict())
    plain.load_state_dict(trainer.state_dict())
    if fp8:
        install_fp8(trainer, Fp8Recipe("e4m3", "blockwise"))
        install_fp8(rollout, Fp8Recipe("e4m3", "blockwise"))
        install_fp8(plain, Fp8Recipe("e4m3", "blockwise"))
    install_qat(trainer, spec)
    assert qat_quantize_weights_(rollout, spec) == 4
    ids = torch.randint(3, 200, (2, 12))
    with torch.no_grad():
        a, b, c = trainer(ids).logits, rollout(ids).logits, plain(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * float(a.abs().max()))
    assert float((a - c).abs().max()) > 1e-3 * float(c.abs().max())


def test_fp8_layers_quantize_the_qat_weight() -> None:
    dense = build_tiny_model(TinyModelConfig())
    install_fp8(dense, Fp8Recipe("e4m3", "blockwise"))
    install_qat(dense, QATSpec("w4a16"))
    layer = dense.model.layers[0].mlp.up_proj
    x = torch.randn(3, layer.in_features)
    expected = fp8_linear(x, fake_quant_nvfp4(layer.weight.detach()), None, Fp8Recipe("e4m3", "blockwise"))
    assert torch.equal(layer(x).detach(), expected)


def test_an_engine_loading_weights_by_name_receives_them_quantized() -> None:
    moe = _moe()
    spec = QATSpec("mxfp4_experts")
    names = qat_weight_names(moe, spec)
    out = dict(quantize_weight_stream(moe.named_parameters(), names, spec))
    experts = moe.model.layers[1].mlp.experts.down_proj
    got = out["model.layers.1.mlp.experts.down_proj"]
    assert torch.equal(got[2], fake_quant_mxfp4(experts[2].detach()))
    assert torch.equal(
        out["model.layers.1.self_attn.q_proj.weight"], moe.model.layers[1].self_attn.q_proj.weight
    )


@pytest.mark.parametrize("fp8", [False, True])
def test_a_deep_copy_of_a_quantized_model_computes_with_its_own_weights(fp8: bool) -> None:
    """The experts' wrapped forward is bound to its module, so a copy of the model (changed afterwards)
    runs its own experts, not the original's."""
    import copy

    model = _moe()
    if fp8:
        install_fp8(model, Fp8Recipe("e4m3", "blockwise"))
    install_qat(model, QATSpec("mxfp4_experts"))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.model.layers[0].mlp.experts.parameters():
            p.mul_(-1.0)
    ids = torch.randint(3, 200, (1, 8))
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, twin(ids).logits)
        fresh = copy.deepcopy(model)
        torch.testing.assert_close(fresh(ids).logits, model(ids).logits)


@pytest.mark.parametrize("fp8", [False, True])
def test_the_backward_keeps_the_weight_as_given_not_a_quantized_copy(fp8: bool) -> None:
    """What autograd saves is the input and the parameter itself (FSDP frees the gathered parameter after
    the forward and gathers it again for the backward); a quantized copy would stay alive in between."""
    layer = torch.nn.Linear(64, 32)
    if fp8:
        layer.__class__ = __import__("rlflow.models.fp8", fromlist=["Fp8Linear"]).Fp8Linear
        layer.fp8_recipe = Fp8Recipe("e4m3", "blockwise")
        layer.weight_transform = QATSpec("w4a16").quantize
    else:
        layer.__class__ = QATLinear
        layer.qat_spec = QATSpec("w4a16")
    x = torch.randn(3, 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = layer(x)
    assert {t.data_ptr() for t in saved} <= {x.data_ptr(), layer.weight.data_ptr()}
    out.sum().backward()
    assert layer.weight.grad is not None and x.grad is not None
