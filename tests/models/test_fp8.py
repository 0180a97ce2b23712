"""FP8 numerics (`rlflow.models.fp8`): the quantizers against hand-computed values and an independent
grid-rounding reference; the linear layer's three GEMMs against a float64 reference that quantizes each
operand block by block along its contraction dimension; the layers a model computes in FP8."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from rlflow.models.fp8 import Fp8Linear, Fp8Recipe, fake_quant, fp8_linear, install_fp8, quantize_fp8_weights_
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from tests.tiny_moe_model import tiny_moe_config

FMAX = {"e4m3": 448.0, "e5m2": 57344.0}


def grid(fmt: str) -> torch.Tensor:
    """Every finite value of the format, sorted (from its 256 bit patterns)."""
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
    return values[torch.isfinite(values)].unique()


def round_to_grid(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Nearest value of the format (random inputs: ties have probability zero), saturating."""
    g = grid(fmt)
    v = v.double().clamp(-FMAX[fmt], FMAX[fmt])
    return g[(v[..., None] - g).abs().argmin(-1)]


def reference_quant(t: torch.Tensor, fmt: str, rows: int, cols: int, pow2: bool = False) -> torch.Tensor:
    """Block by block in float64: scale fmax / amax (or OCP's power of two), round, scale back."""
    t = t.double()
    out = torch.empty_like(t)
    for i in range(0, t.shape[0], rows):
        for j in range(0, t.shape[1], cols):
            block = t[i : i + rows, j : j + cols]
            amax = float(block.abs().max())
            if amax == 0:
                scale = 1.0
            elif pow2:
                emax = 8 if fmt == "e4m3" else 15
                scale = 2.0 ** (emax - torch.floor(torch.log2(torch.tensor(amax))).item())
            else:
                scale = FMAX[fmt] / amax
            out[i : i + rows, j : j + cols] = round_to_grid(block * scale, fmt) / scale
    return out


def test_fake_quant_matches_hand_computed_values() -> None:
    # tensorwise E4M3: scale 448 / 4 = 112; 11.2 -> 11 (step 1 in [8, 16)), 22.4 -> 22 (step 2), 33.6 -> 32 (step 4)
    x = torch.tensor([[0.1, 0.2, 0.3, 4.0]])
    expected = torch.tensor([[11 / 112, 22 / 112, 32 / 112, 4.0]])
    torch.testing.assert_close(fake_quant(x, "e4m3", None, None), expected, rtol=1e-6, atol=0)
    # microscaling: amax 5 -> scale 2^(8 - 2) = 64; 0.3 * 64 = 19.2 -> 20 (step 2 in [16, 32)) -> 0.3125
    torch.testing.assert_close(
        fake_quant(torch.tensor([[5.0, 0.3]]), "e4m3", 1, 32, pow2_scale=True), torch.tensor([[5.0, 0.3125]])
    )
    # E5M2 keeps two mantissa bits: scale 57344 / 4; 0.3 * 14336 = 4300.8 -> 4096 (step 1024 in [4096, 8192))
    torch.testing.assert_close(
        fake_quant(torch.tensor([[0.3, 4.0]]), "e5m2", None, None), torch.tensor([[4096 / 14336, 4.0]])
    )
    # an all-zero block stays zero (scale 1), and a block's scale is its own
    x = torch.zeros(1, 256)
    x[0, 200] = 3.0
    out = fake_quant(x, "e4m3", 1, 128)
    assert out[0, :128].abs().sum() == 0
    assert abs(float(out[0, 200]) - 3.0) < 1e-6  # amax maps to fmax (to FP32 rounding of the scale)


@pytest.mark.parametrize(
    ("fmt", "rows", "cols", "pow2"),
    [
        ("e4m3", 1, 128, False),
        ("e4m3", 128, 128, False),
        ("e5m2", 128, 1, False),
        ("e4m3", 1, 32, True),
        ("e5m2", 32, 1, True),
    ],
)
def test_fake_quant_matches_a_block_by_block_reference(fmt: str, rows: int, cols: int, pow2: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(150, 300) * torch.logspace(
        -2, 2, 300
    )  # blocks of very different amax; partial edge blocks
    got = fake_quant(x, fmt, rows, cols, pow2_scale=pow2)
    torch.testing.assert_close(got.double(), reference_quant(x, fmt, rows, cols, pow2), rtol=1e-6, atol=0)


def operand(recipe: Fp8Recipe, t: torch.Tensor, kind: str, contraction_dim: int) -> torch.Tensor:
    """The reference's quantized operand: blocks along the contraction dimension (module docstring)."""
    fmt = "e5m2" if kind == "grad" and recipe.format == "hybrid" else "e4m3"
    if recipe.recipe == "tensorwise":
        return reference_quant(t, fmt, t.shape[0], t.shape[1])
    if recipe.recipe == "blockwise" and kind == "weight":
        return reference_quant(t, fmt, 128, 128)
    size = 128 if recipe.recipe == "blockwise" else 32
    rows, cols = (1, size) if contraction_dim == 1 else (size, 1)
    return reference_quant(t, fmt, rows, cols, pow2=recipe.recipe == "mxfp8")


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_fp8_linear_gemms_match_a_float64_reference(recipe: str, fmt: str) -> None:
    spec = Fp8Recipe(fmt, recipe)
    torch.manual_seed(1)
    x = torch.randn(3, 50, 160, requires_grad=True)  # 150 tokens: a partial 128-token block in the wgrad
    w = (torch.randn(144, 160) / 12).requires_grad_()
    b = torch.randn(144, requires_grad=True)
    gy = torch.randn(3, 50, 144)
    y = fp8_linear(x, w, b, spec)
    y.backward(gy)

    x2, g2 = x.detach().reshape(-1, 160), gy.reshape(-1, 144)
    y_ref = operand(spec, x2, "input", 1) @ operand(spec, w.detach(), "weight", 1).t() + b.detach().double()
    dx_ref = operand(spec, g2, "grad", 1) @ operand(spec, w.detach(), "weight", 0)
    dw_ref = operand(spec, g2, "grad", 0).t() @ operand(spec, x2, "input", 0)
    # the products of FP8 values are exact; only the FP32 sums differ from float64 (scale: sqrt(160) terms)
    torch.testing.assert_close(y.detach().reshape(-1, 144).double(), y_ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(x.grad.reshape(-1, 160).double(), dx_ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), dw_ref, rtol=0, atol=5e-4)
    torch.testing.assert_close(b.grad, g2.sum(0), rtol=1e-5, atol=1e-5)
    # and it is not the plain product: FP8's rounding is visible at its scale (E4M3: 2^-4 relative steps)
    plain = F.linear(x.detach(), w.detach(), b.detach())
    assert 1e-3 < float((y.detach() - plain).abs().max() / plain.abs().max()) < 0.1


def test_blockwise_forward_is_per_token_so_a_row_does_not_depend_on_its_batch() -> None:
    spec = Fp8Recipe("e4m3", "blockwise")
    torch.manual_seed(2)
    x, w = torch.randn(8, 256), torch.randn(64, 256)
    # the operand a row contributes is its own (bit-equal); the products then differ by summation order only
    assert torch.equal(spec.quantize(x[3:4], "input", 1), spec.quantize(x, "input", 1)[3:4])
    alone = fp8_linear(x[3:4], w, None, spec)
    together = fp8_linear(x, w, None, spec)[3:4]
    torch.testing.assert_close(alone, together, rtol=0, atol=1e-5 * float(together.abs().max()))
    # tensorwise scales over the whole batch: the row's operand depends on the other rows
    tensorwise = Fp8Recipe("e4m3", "tensorwise")
    assert not torch.equal(tensorwise.quantize(x[3:4], "input", 1), tensorwise.quantize(x, "input", 1)[3:4])


def test_install_fp8_swaps_the_decoder_linears_and_wraps_the_experts() -> None:
    dense = build_tiny_model(TinyModelConfig())
    n_layers = dense.config.num_hidden_layers
    assert install_fp8(dense, Fp8Recipe()) == 7 * n_layers
    assert type(dense.lm_head) is torch.nn.Linear  # the head stays in the compute dtype
    attn, mlp = dense.model.layers[0].self_attn, dense.model.layers[0].mlp
    assert type(attn.q_proj) is Fp8Linear and type(mlp.down_proj) is Fp8Linear

    tiny = TinyModelConfig()
    moe = AutoModelForCausalLM.from_config(tiny_moe_config(tiny.vocab_size, 64, tiny.max_position_embeddings))
    assert install_fp8(moe, Fp8Recipe()) == 5 * 2  # q, k, v, o and the experts block per layer
    assert type(moe.model.layers[0].mlp.gate).__name__ == "Qwen3MoeTopKRouter"
    assert moe.config._experts_implementation == "eager"


@pytest.mark.parametrize("moe", [False, True])
def test_a_quantized_copy_computes_what_the_fp8_trainer_computes(moe: bool) -> None:
    """The rollout's copy (weights replaced by their FP8 values once) gives the logits the FP8 trainer's
    forward gives (it quantizes the weights in every forward): bit-equal."""
    torch.manual_seed(3)
    tiny = TinyModelConfig()
    if moe:
        make = lambda: AutoModelForCausalLM.from_config(  # noqa: E731
            tiny_moe_config(tiny.vocab_size, 64, tiny.max_position_embeddings)
        )
    else:
        make = lambda: build_tiny_model(tiny)  # noqa: E731
    trainer, rollout = make(), make()
    rollout.load_state_dict(trainer.state_dict())
    install_fp8(trainer, Fp8Recipe("e4m3", "blockwise"))
    install_fp8(rollout, Fp8Recipe("e4m3", "blockwise"))
    # dense: 7 weights per layer; MoE: q, k, v, o and the experts' two stacked weights, 2 layers
    assert quantize_fp8_weights_(rollout) == (6 * 2 if moe else 7 * trainer.config.num_hidden_layers)
    ids = torch.randint(3, 200, (2, 12))
    with torch.no_grad():
        a, b = trainer(ids).logits, rollout(ids).logits
    assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_the_cuda_path_computes_the_cpu_numbers(recipe: str) -> None:
    """The same quantizers and FP32 products on the GPU: forward and gradients equal the CPU's to FP32
    summation order (TF32 off, as torch's default keeps it for matmuls)."""
    spec = Fp8Recipe("hybrid", recipe)
    torch.manual_seed(4)
    x, w, g = torch.randn(2, 70, 256), torch.randn(192, 256) / 16, torch.randn(2, 70, 192)
    results = []
    for device in ("cpu", "cuda"):
        xd, wd = x.to(device).requires_grad_(), w.to(device).requires_grad_()
        y = fp8_linear(xd, wd, None, spec)
        y.backward(g.to(device))
        results.append([t.detach().cpu() for t in (y, xd.grad, wd.grad)])
    for cpu, cuda in zip(*results):
        torch.testing.assert_close(cuda, cpu, rtol=0, atol=1e-4 * float(cpu.abs().max()))
