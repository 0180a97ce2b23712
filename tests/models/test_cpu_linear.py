"""rlflow.models.cpu_linear: linear layers through oneDNN's fp32 kernel (``trainer.cpu_linear_kernel``).

The forward and both gradients against an fp64 reference (fp32 rounding is about 1e-7 of the values'
scale; the bar is 1e-5 of it); which calls go to oneDNN (the autograd node says); a tiny Qwen2 (with and
without LoRA adapters) gives the same logits and gradients through oneDNN as through ``F.linear``; the
setting's resolution and its config checks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rlflow.config import load_config, to_typed, validate_config
from rlflow.config.loading import load_sft_config, to_typed_sft
from rlflow.config.sft_validate import validate_sft_config
from rlflow.logging.flops import measure_peak_flops
from rlflow.models import cpu_linear
from rlflow.models.cpu_linear import (
    AUTO_MIN_SPEEDUP,
    MIN_MACS,
    OneDNNLinear,
    install_onednn_linear,
    linear,
    resolve_cpu_linear_kernel,
)
from rlflow.models.lora import LoRALinear, LoRASpec, inject_lora
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.trainer.sft_trainer import sft_layout
from rlflow.utils.onednn import onednn_linear_available, onednn_weight_grad_available
from rlflow.workers.role_setup import actor_layout, critic_layout, ref_layout

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")
KEY = "trainer.cpu_linear_kernel"


def _through_onednn(out: torch.Tensor) -> bool:
    return "OneDNNLinear" in type(out.grad_fn).__name__


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 against fp64: within 1e-5 of the reference's largest magnitude."""
    scale = float(want.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * scale)


@needs_onednn
@pytest.mark.parametrize("weight_grad_op", [True, False], ids=["inner_product_backward", "transposed_copies"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward_and_gradients_match_an_fp64_reference(with_bias, weight_grad_op, monkeypatch):
    """Both ways of computing the weight gradient: oneDNN's inner-product backward where this torch build
    has it (`onednn_weight_grad_available`), else ``_linear_pointwise`` on transposed copies."""
    if weight_grad_op:
        assert onednn_weight_grad_available()  # this build has the op: the path the runs here take
    else:
        monkeypatch.setattr(cpu_linear, "onednn_weight_grad_available", lambda: False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, 96, generator=gen)  # 256 rows x 96 x 128 = 3.1M multiply-adds
    weight = torch.randn(128, 96, generator=gen)
    bias = torch.randn(128, generator=gen) if with_bias else None
    upstream = torch.randn(4, 64, 128, generator=gen)

    leaves = [t.clone().requires_grad_() for t in (x, weight, *([bias] if with_bias else []))]
    out = linear(leaves[0], leaves[1], leaves[2] if with_bias else None)
    assert _through_onednn(out) and out.shape == (4, 64, 128)
    assert not out._is_view()  # FSDP2 warns when a module returns a view
    (out * upstream).sum().backward()

    ref = [t.double().requires_grad_() for t in (x, weight, *([bias] if with_bias else []))]
    want = torch.nn.functional.linear(ref[0], ref[1], ref[2] if with_bias else None)
    (want * upstream.double()).sum().backward()
    _close(out.detach(), want.detach())
    for got, expected in zip(leaves, ref):
        _close(got.grad, expected.grad)


@needs_onednn
def test_without_autograd_the_product_runs_alone_through_onednn():
    """Under ``no_grad`` (the rollout's prefill, the reference's and the reward model's forwards) `linear`
    calls oneDNN's kernel without an autograd node, with the autograd path's output to the bit."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(2, 50, 96, generator=gen), torch.randn(640, 96, generator=gen), None
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        out = linear(x, weight, bias)
    assert out.grad_fn is None and out.shape == (2, 50, 640) and not out._is_view()
    assert "mkldnn::_linear_pointwise" in {e.key for e in prof.key_averages()}
    assert torch.equal(out, linear(x, weight.clone().requires_grad_(), bias).detach())


@needs_onednn
def test_a_frozen_weight_gets_no_gradient_and_the_input_its_own():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 80, generator=gen, requires_grad=True)
    weight = torch.randn(100, 80, generator=gen)  # frozen (a LoRA base weight)
    out = linear(x, weight)
    assert _through_onednn(out)
    out.sum().backward()
    assert weight.grad is None
    _close(x.grad, torch.ones(300, 100, dtype=torch.float64) @ weight.double())


@needs_onednn
def test_what_stays_with_f_linear():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(128, 128, generator=gen, requires_grad=True)
    small_rows = (MIN_MACS // (128 * 128)) - 1  # one row short of the threshold
    assert not _through_onednn(linear(torch.randn(small_rows, 128, generator=gen), weight))
    assert _through_onednn(linear(torch.randn(small_rows + 1, 128, generator=gen), weight))
    big = torch.randn(512, 128, generator=gen)
    assert not _through_onednn(linear(big, weight, onednn=False))
    assert not _through_onednn(linear(big.bfloat16(), weight.bfloat16()))  # oneDNN via aten already
    assert not _through_onednn(linear(big, weight.t().contiguous().t()))  # a strided weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(big, weight).dtype == torch.bfloat16  # autocast decides, as for F.linear


@needs_onednn
def test_a_tiny_qwen2_gives_the_same_logits_and_gradients():
    model = build_tiny_model(TinyModelConfig(num_hidden_layers=2), seed=0)
    fast = copy.deepcopy(model)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert install_onednn_linear(fast) == linears > 0
    assert not any(type(m) is nn.Linear for m in fast.modules())
    assert fast.state_dict().keys() == model.state_dict().keys()

    ids = torch.randint(3, 259, (4, 48), generator=torch.Generator().manual_seed(3))
    outputs = {}
    for name, m in (("aten", model), ("onednn", fast)):
        logits = m(input_ids=ids, use_cache=False).logits
        logits.logsumexp(-1).mean().backward()
        outputs[name] = (logits.detach(), {n: p.grad for n, p in m.named_parameters()})
    (logits_a, grads_a), (logits_o, grads_o) = outputs["aten"], outputs["onednn"]
    torch.testing.assert_close(logits_o, logits_a, rtol=0, atol=1e-5 * float(logits_a.abs().max()))
    for name, grad in grads_a.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(grads_o[name], grad, rtol=0, atol=1e-4 * scale + 1e-12, msg=name)


@needs_onednn
def test_lora_layers_keep_their_class_and_compute_the_base_through_onednn():
    model = build_tiny_model(TinyModelConfig(num_hidden_layers=1), seed=0)
    inject_lora(model, LoRASpec(rank=4, alpha=8.0), seed=0)
    install_onednn_linear(model)
    adapted = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert adapted and all(type(m) is LoRALinear and m.onednn for m in adapted)
    assert any(type(m) is OneDNNLinear for m in model.modules())  # the LM head (tied, untargeted)
    layer = adapted[0]
    x = torch.randn(200, layer.in_features, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = layer.weight.double() @ x.double().T
        update = layer.lora_B.double() @ (layer.lora_A.double() @ x.double().T) * float(layer.lora_scaling)
        _close(layer(x), (want + update).T)


def test_the_setting_resolves_to_a_kernel():
    assert resolve_cpu_linear_kernel("aten", "cpu", 2, KEY) == "aten"
    assert resolve_cpu_linear_kernel("auto", "cuda", 2, KEY) == "aten"
    with pytest.raises(ValueError, match=r"trainer\.cpu_linear_kernel='mkl'"):
        resolve_cpu_linear_kernel("mkl", "cpu", 2, KEY)
    with pytest.raises(ValueError, match=r"trainer\.cpu_linear_kernel=onednn is a CPU kernel"):
        resolve_cpu_linear_kernel("onednn", "cuda", 2, KEY)
    if not onednn_linear_available():
        assert resolve_cpu_linear_kernel("auto", "cpu", 2, KEY) == "aten"
        return
    assert resolve_cpu_linear_kernel("onednn", "cpu", 2, KEY) == "onednn"
    # auto: the rule on this machine's rates (measured once per process, then cached)
    threads = min(2, torch.get_num_threads())
    chosen = resolve_cpu_linear_kernel("auto", "cpu", threads, KEY)
    mkl = measure_peak_flops("cpu", num_threads=threads)
    onednn = measure_peak_flops("cpu", num_threads=threads, kernel="onednn")
    assert chosen == ("onednn" if onednn >= AUTO_MIN_SPEEDUP * mkl else "aten")


def test_the_config_checks_name_the_key():
    with pytest.raises(ValueError, match=r"trainer\.cpu_linear_kernel='fast' is not one of"):
        validate_config(load_config(["trainer.cpu_linear_kernel=fast"], config_name="demo"))
    with pytest.raises(ValueError, match=r"trainer\.cpu_linear_kernel=onednn is a CPU kernel"):
        validate_config(
            load_config(["trainer.cpu_linear_kernel=onednn", "trainer.device=cuda"], config_name="demo")
        )
    with pytest.raises(ValueError, match=r"trainer\.cpu_linear_kernel='fast' is not one of"):
        validate_sft_config(load_sft_config(["trainer.cpu_linear_kernel=fast"]))


def test_every_role_layout_carries_the_setting():
    ppo = to_typed(load_config(["trainer.cpu_linear_kernel=onednn"], config_name="demo"))
    assert {f(ppo).cpu_linear_kernel for f in (actor_layout, ref_layout, critic_layout)} == {"onednn"}
    sft = to_typed_sft(load_sft_config(["trainer.cpu_linear_kernel=aten"]))
    assert sft_layout(sft).cpu_linear_kernel == "aten"
