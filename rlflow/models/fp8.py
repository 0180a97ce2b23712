"""FP8 training and an FP8 rollout, emulated: every GEMM operand on the FP8 grid of its recipe.

Transformer Engine's FP8 recipes (what a Megatron run sets with ``override_transformer_config.fp8`` and
``fp8_recipe``), and verl's FP8 rollout (DeepSeek's block scaling), quantize each operand of a linear
layer's three GEMMs, ``y = x W^T`` (fprop), ``dx = dy W`` (dgrad), ``dW = dy^T x`` (wgrad), to FP8 with
scales over blocks that run along the GEMM's contraction dimension, then multiply the FP8 values with FP32
accumulation. This module computes the same numbers: each operand is quantized to its FP8 format with its
recipe's scales and dequantized in FP32 (`fake_quant`), and the product is an FP32 GEMM, whose result is
cast to the input's dtype, as TE's output is. The values multiplied are those of the FP8 GEMM, and products
of two FP8 numbers are exact in FP32, so the result differs from a tensor-core FP8 GEMM by FP32 summation
order only. It is an emulation: no FP8 kernel runs, so it is slower than the plain dtype, not faster; it
reproduces what FP8 does to a run's numbers (a Megatron FP8 port; an FP8 rollout and its trainer agreeing).

Recipes (`Fp8Recipe`; blocks as rows x columns of the operand with the contraction dimension last):

* ``tensorwise``: one scale per tensor, from its current amax (TE's ``Float8CurrentScaling``).
* ``blockwise``: weights in 128 x 128 blocks, activations and gradients in 1 x 128 blocks along the
  contraction dimension (TE's ``Float8BlockScaling``, DeepSeek-V3's; FP32 scales).
* ``mxfp8``: every operand in 1 x 32 blocks along the contraction dimension with power-of-two scales
  (OCP microscaling, TE's ``MXFP8BlockScaling``).

``format``: ``e4m3`` everywhere, or ``hybrid``: E4M3 forward operands and E5M2 gradients. Bias and the
bias gradient stay in high precision. A scale is ``fmax / amax`` of its block (1 for an all-zero block);
quantizing saturates at the format's largest finite value.
"""

from __future__ import annotations

import functools
import logging
import re
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)

__all__ = [
    "FP8_FORMATS",
    "FP8_RECIPES",
    "Fp8Linear",
    "Fp8Recipe",
    "fake_quant",
    "fp8_linear",
    "install_fp8",
    "is_experts_block",
    "quantize_fp8_weights_",
    "quantize_matrices_",
    "use_eager_experts",
]

FP8_FORMATS = ("e4m3", "hybrid")
"""``fp8.format`` values: E4M3 for every operand, or E4M3 forward and E5M2 gradients (TE's names)."""

FP8_RECIPES = ("tensorwise", "blockwise", "mxfp8")
"""``fp8.recipe`` values (module docstring)."""

_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
_EMAX = {"e4m3": 8, "e5m2": 15}  # exponent of each format's largest power of two (OCP MX's emax_elem)
_BLOCK = 128  # blockwise: TE's and DeepSeek's block
_MX_BLOCK = 32  # mxfp8: OCP's block


def fake_quant(
    x: torch.Tensor, fmt: str, block_rows: int | None, block_cols: int | None, pow2_scale: bool = False
) -> torch.Tensor:
    """``x`` quantized to FP8 and back, in FP32: each block of ``block_rows x block_cols`` elements (None =
    the whole dimension; edge blocks are partial) scaled by ``fmax / amax`` of the block (``pow2_scale``: by
    ``2^(emax - floor(log2 amax))``, OCP's microscaling), rounded to ``fmt`` (saturating) and scaled back.

    Shapes: x (m, n) -> (m, n) float32.
    """
    if fmt not in _DTYPES:
        raise ValueError(f"fp8 format {fmt!r}: choose e4m3 or e5m2")
    m, n = x.shape
    rows = m if block_rows is None else min(block_rows, m)
    cols = n if block_cols is None else min(block_cols, n)
    pad_m, pad_n = (-m) % rows, (-n) % cols
    xf = x.float()
    if pad_m or pad_n:
        xf = F.pad(xf, (0, pad_n, 0, pad_m))
    blocks = xf.view((m + pad_m) // rows, rows, (n + pad_n) // cols, cols)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True)
    fmax = _FMAX[fmt]
    if pow2_scale:
        scale = torch.exp2(_EMAX[fmt] - torch.floor(torch.log2(amax)))
    else:
        scale = fmax / amax
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    q = (blocks * scale).clamp(-fmax, fmax).to(_DTYPES[fmt]).float() / scale
    return q.view(m + pad_m, n + pad_n)[:m, :n]


@dataclass(frozen=True)
class Fp8Recipe:
    """How a linear layer's GEMM operands are quantized (module docstring).

    Attributes:
        format: ``e4m3`` or ``hybrid`` (E5M2 gradients).
        recipe: ``tensorwise``, ``blockwise`` or ``mxfp8``.
    """

    format: str = "e4m3"
    recipe: str = "blockwise"

    def __post_init__(self) -> None:
        if self.format not in FP8_FORMATS:
            raise ValueError(f"fp8 format {self.format!r}: choose one of {list(FP8_FORMATS)}")
        if self.recipe not in FP8_RECIPES:
            raise ValueError(f"fp8 recipe {self.recipe!r}: choose one of {list(FP8_RECIPES)}")

    def quantize(self, t: torch.Tensor, kind: str, contraction_dim: int) -> torch.Tensor:
        """One GEMM operand on its FP8 grid, in FP32.

        Args:
            t: the operand, 2-D.
            kind: ``weight``, ``input`` or ``grad`` (gradients take E5M2 under ``hybrid``; weights take
                128 x 128 blocks under ``blockwise``).
            contraction_dim: the dimension of ``t`` the GEMM sums over (0 or 1).
        """
        fmt = "e5m2" if kind == "grad" and self.format == "hybrid" else "e4m3"
        if self.recipe == "tensorwise":
            return fake_quant(t, fmt, None, None)
        if self.recipe == "blockwise" and kind == "weight":
            return fake_quant(t, fmt, _BLOCK, _BLOCK)
        size, pow2 = (_BLOCK, False) if self.recipe == "blockwise" else (_MX_BLOCK, True)
        rows, cols = (1, size) if contraction_dim == 1 else (size, 1)
        return fake_quant(t, fmt, rows, cols, pow2_scale=pow2)


class _Fp8LinearFunction(torch.autograd.Function):
    """``x W^T + b`` with each GEMM's operands on their FP8 grid (`Fp8Recipe.quantize`)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        recipe: Fp8Recipe,
        weight_quantized: bool,
        weight_transform: Any,
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        w = weight if weight_transform is None else weight_transform(weight)
        w = w.float() if weight_quantized else recipe.quantize(w, "weight", 1)
        y = recipe.quantize(x2, "input", 1) @ w.t()
        if bias is not None:
            y = y + bias.float()
        # the weight as given (a parameter FSDP frees after the forward and gathers again for the backward),
        # not a transformed copy, which would stay alive until the backward
        ctx.save_for_backward(x, weight)
        ctx.recipe, ctx.weight_quantized, ctx.has_bias = recipe, weight_quantized, bias is not None
        ctx.weight_transform = weight_transform
        return y.to(x.dtype).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        recipe: Fp8Recipe = ctx.recipe
        g = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # dgrad: sums over the output features
            w = weight if ctx.weight_transform is None else ctx.weight_transform(weight)
            w = w.float() if ctx.weight_quantized else recipe.quantize(w, "weight", 0)
            grad_x = (recipe.quantize(g, "grad", 1) @ w).to(x.dtype).view(x.shape)
        if ctx.needs_input_grad[1]:
            # wgrad: sums over the tokens; a weight transform's gradient passes straight through
            x2 = x.reshape(-1, x.shape[-1])
            grad_w = (recipe.quantize(g, "grad", 0).t() @ recipe.quantize(x2, "input", 0)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.float().sum(0).to(grad_out.dtype)
        return grad_x, grad_w, grad_b, None, None, None


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: Fp8Recipe,
    weight_quantized: bool = False,
    weight_transform: Any = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with FP8 numerics (module docstring).

    Shapes: x (..., in), weight (out, in), bias (out,) or None -> (..., out) in x's dtype.

    Args:
        weight_quantized: the weight already holds its FP8 values (`quantize_fp8_weights_`; a rollout's
            copy), so it is not quantized again.
        weight_transform: applied to the weight before it is quantized (QAT's `rlflow.models.qat.QATSpec.
            quantize`), again in the backward; its gradient passes straight through to ``weight``.
    """
    return _Fp8LinearFunction.apply(x, weight, bias, recipe, weight_quantized, weight_transform)


class Fp8Linear(nn.Linear):
    """An ``nn.Linear`` computing with `fp8_linear` (made by `install_fp8`: a class change, parameters,
    hooks and state dict as they were)."""

    fp8_recipe: Fp8Recipe
    fp8_weight_quantized: bool = False
    weight_transform: Any = None  # QAT's quantized weight (`rlflow.models.qat`), quantized again to FP8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(
            x, self.weight, self.bias, self.fp8_recipe, self.fp8_weight_quantized, self.weight_transform
        )


class _ExpertLinears(TorchFunctionMode):
    """Inside a mixture-of-experts block's experts: each ``F.linear`` (one expert's projection) through
    `fp8_linear`, as TE's grouped FP8 GEMM quantizes each expert's weight and tokens."""

    def __init__(self, recipe: Fp8Recipe, weight_quantized: bool, weight_transform: Any = None) -> None:
        super().__init__()
        self.recipe, self.weight_quantized, self.weight_transform = recipe, weight_quantized, weight_transform

    def __torch_function__(
        self, func: Any, arg_types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return fp8_linear(x, weight, bias, self.recipe, self.weight_quantized, self.weight_transform)
        return func(*args, **kwargs)


_ROUTERS = re.compile(r"(^|\.)(gate|router|shared_expert_gate)$")
"""Routers stay in high precision, as Megatron keeps them (``mlp.gate`` of Qwen-MoE, Mixtral, OLMoE)."""


def is_experts_block(module: nn.Module) -> bool:
    """A transformers experts block: its weights stacked over the experts, ``(experts, out, in)``."""
    return any(p.dim() == 3 for p in module.parameters(recurse=False))


def use_eager_experts(module: nn.Module) -> None:
    """Run an experts block through transformers' per-expert loop (one ``F.linear`` per expert, which the
    FP8 and QAT layers intercept); the grouped kernels multiply all experts in one call."""
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"


def _fp8_experts_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """An experts block's forward (its class's) with each ``F.linear`` through `fp8_linear`."""
    quantized = bool(getattr(self, "fp8_weight_quantized", False))
    with _ExpertLinears(self.fp8_recipe, quantized, getattr(self, "weight_transform", None)):
        return type(self).forward(self, *args, **kwargs)


def _wrap_experts(module: nn.Module, recipe: Fp8Recipe) -> None:
    # a method bound to the module (not a closure over it): a deep copy of the model rebinds it to the copy
    module.forward = types.MethodType(_fp8_experts_forward, module)  # type: ignore[method-assign]
    module.fp8_recipe = recipe


def install_fp8(model: nn.Module, recipe: Fp8Recipe) -> int:
    """Make the linear layers of ``model``'s decoder layers compute with FP8 numerics; returns how many
    layers (each experts block counts once).

    Plain ``nn.Linear`` layers inside the decoder layers become `Fp8Linear`; experts blocks (weights
    stacked over the experts) run each expert's ``F.linear`` through `fp8_linear`, with transformers'
    per-expert loop (``config._experts_implementation = "eager"``: the grouped kernels multiply all
    experts in one call). The embeddings, the LM head, a value head, the routers and the attention's
    score and value products stay in the compute dtype, as Megatron's FP8 keeps them.

    Raises:
        ValueError: the model has no decoder layers rlflow recognises.
    """
    from rlflow.parallel.fsdp import find_decoder_layers

    layers = find_decoder_layers(model)
    if not layers:
        raise ValueError(f"fp8: found no decoder layers in {type(model).__name__}")
    count = 0
    for layer in layers:
        for name, module in layer.named_modules():
            if _ROUTERS.search(name):
                continue
            if type(module) is nn.Linear or type(module).__name__ == "OneDNNLinear":
                module.__class__ = Fp8Linear
                module.fp8_recipe = recipe
                count += 1
            elif is_experts_block(module) and not hasattr(module, "fp8_recipe"):
                use_eager_experts(module)
                _wrap_experts(module, recipe)
                count += 1
    if count == 0:
        raise ValueError(
            f"fp8: {type(model).__name__}'s decoder layers have no linear layers rlflow quantizes"
        )
    return count


@torch.no_grad()
def quantize_matrices_(weight: torch.Tensor, quantize: Any) -> None:
    """``weight`` (out, in), or stacked over the experts (experts, out, in), replaced in place by
    ``quantize`` of each of its matrices (cast back to its dtype)."""
    for matrix in weight if weight.dim() == 3 else weight[None]:
        matrix.copy_(quantize(matrix).to(matrix.dtype))


@torch.no_grad()
def quantize_fp8_weights_(model: nn.Module) -> int:
    """Replace the weights of ``model``'s FP8 layers (`install_fp8`) by their FP8 values, in place, and mark
    them so the forward does not quantize them again: a rollout's copy, whose weights stay fixed between
    weight syncs (vLLM's FP8 rollout keeps the quantized weights). Returns how many tensors."""
    count = 0
    for module in model.modules():
        recipe = getattr(module, "fp8_recipe", None)
        if recipe is None:
            continue
        if isinstance(module, Fp8Linear):
            weights = [module.weight]
        else:
            weights = [p for p in module.parameters(recurse=False) if p.dim() == 3]
        for weight in weights:
            quantize_matrices_(weight, functools.partial(recipe.quantize, kind="weight", contraction_dim=1))
            count += 1
        module.fp8_weight_quantized = True
    return count
