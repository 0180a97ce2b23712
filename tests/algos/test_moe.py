"""Router losses of mixture-of-experts layers (`rlflow.algos.moe`): by hand, against Hugging Face's
load-balancing loss, and with padding left out."""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.algos.moe import router_losses


def test_a_two_token_router_by_hand():
    # token 0: logits (ln 3, 0) -> p = (0.75, 0.25), expert 0; token 1: (0, ln 4) -> p = (0.2, 0.8), expert 1
    logits = torch.tensor([[math.log(3.0), 0.0], [0.0, math.log(4.0)]])
    aux, z = router_losses([logits], top_k=1)
    # f = (1/2, 1/2), P = ((0.75 + 0.2) / 2, (0.25 + 0.8) / 2) = (0.475, 0.525): aux = 2 * (0.2375 + 0.2625)
    assert aux.item() == pytest.approx(1.0, abs=1e-6)
    # logsumexp: ln 4 and ln 5
    assert z.item() == pytest.approx((math.log(4.0) ** 2 + math.log(5.0) ** 2) / 2, rel=1e-6)
    # a router that sends both tokens to expert 0 with near certainty: aux -> E = 2
    skewed, _ = router_losses([torch.tensor([[20.0, 0.0], [20.0, 0.0]])], top_k=1)
    assert skewed.item() == pytest.approx(2.0, abs=1e-6)


def test_one_layer_is_huggingfaces_load_balancing_loss_over_top_k_and_layers_add_up():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    g = torch.Generator().manual_seed(0)
    layers = [torch.randn(9, 6, generator=g) for _ in range(3)]
    for layer in layers:
        aux, _ = router_losses([layer], top_k=2)
        hf = load_balancing_loss_func((layer,), num_experts=6, top_k=2)
        assert (2 * aux).item() == pytest.approx(hf.item(), rel=1e-6)
    total, total_z = router_losses(layers, top_k=2)
    parts = [router_losses([layer], top_k=2) for layer in layers]
    assert total.item() == pytest.approx(sum(a.item() for a, _ in parts), rel=1e-6)
    assert total_z.item() == pytest.approx(sum(z.item() for _, z in parts), rel=1e-6)


def test_padding_tokens_are_left_out_and_the_loss_has_a_gradient():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(7, 4, generator=g, requires_grad=True)
    valid = torch.tensor([True, True, False, True, False, True, True])
    aux, z = router_losses([logits], top_k=2, valid=valid)
    ref_aux, ref_z = router_losses([logits.detach()[valid]], top_k=2)
    assert (aux.item(), z.item()) == pytest.approx((ref_aux.item(), ref_z.item()), rel=1e-6)
    (aux + z).backward()
    assert logits.grad[~valid].abs().sum() == 0 and logits.grad[valid].abs().sum() > 0
    with pytest.raises(ValueError, match=r"top_k=5 must be in \[1, 4\]"):
        router_losses([logits], top_k=5)
