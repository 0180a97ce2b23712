"""Quantization-aware training (QAT) of 4-bit weights: the forward sees each selected weight on its FP4 grid,
the gradient reaches the full-precision weight unchanged (the straight-through estimator), and the rollout
decodes with the quantized weights, what a deployment of the quantized checkpoint computes.

Two weight formats, both with E2M1 elements (the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives),
blocks running along a weight's input (contraction) dimension:

* NVFP4 (``mode=w4a16``, verl's QAT default): blocks of 16 (``group_size``), each with an E4M3 scale, under
  one FP32 scale per tensor: ``s_tensor = amax(W) / (448 * 6)``, ``s_block = e4m3(amax(block) / (6 *
  s_tensor))``, ``W ~ e2m1(W / (s_block s_tensor)) s_block s_tensor``. Every linear layer and experts block
  the ignore patterns leave (verl's default leaves out ``lm_head``, ``embed_tokens`` and the routers).
* MXFP4 (``mode=mxfp4_experts``, verl's DeepSeek-V4 recipe): blocks of 32 with a power-of-two scale
  ``2^(floor(log2 amax) - 2)`` (OCP microscaling), on the routed experts' weights only.

Activations stay in the compute dtype (W4A16). Rounding is to nearest, ties to the even element, values
beyond 6 x scale saturate. With FP8 training on as well (`rlflow.models.fp8`), the FP8 GEMM quantizes the
QAT weight, the DeepSeek-V4 scripts' "FP4 weights feeding an FP8 GEMM".
"""

from __future__ import annotations

import fnmatch
import re
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlflow.models.fp8 import is_experts_block, quantize_matrices_, use_eager_experts

__all__ = [
    "QAT_MODES",
    "QATLinear",
    "QATSpec",
    "fake_quant_mxfp4",
    "fake_quant_nvfp4",
    "install_qat",
    "qat_linear",
    "qat_quantize_weights_",
    "qat_spec_of",
    "qat_weight_names",
    "quantize_weight_stream",
    "round_e2m1",
]

QAT_MODES = ("w4a16", "mxfp4_experts")
"""``qat.mode`` values (module docstring)."""

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_MIDPOINTS = (_E2M1[1:] + _E2M1[:-1]) / 2
_TIE_GOES_UP = torch.tensor([False, True, False, True, False, True, False])  # to the even element
_MX_BLOCK = 32
_E4M3_MAX = 448.0


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """``v`` rounded to the nearest E2M1 value (ties to even, saturating at +-6), in FP32."""
    a = v.float().abs().clamp(max=6.0)
    mids = _MIDPOINTS.to(a.device)
    low = torch.bucketize(a, mids, right=False)  # a tie goes to the lower element
    high = torch.bucketize(a, mids, right=True)  # ... or to the upper one
    up = _TIE_GOES_UP.to(a.device)[low.clamp(max=len(mids) - 1)]
    index = torch.where((low != high) & up, high, low)
    return _E2M1.to(a.device)[index] * torch.sign(v.float())


def _blocks(w: torch.Tensor, size: int) -> torch.Tensor:
    """``w`` (rows, cols) as (rows, cols / size, size) in FP32, the last block zero-padded."""
    rows, cols = w.shape
    pad = (-cols) % size
    wf = F.pad(w.float(), (0, pad)) if pad else w.float()
    return wf.view(rows, (cols + pad) // size, size)


def fake_quant_mxfp4(w: torch.Tensor) -> torch.Tensor:
    """``w`` on the MXFP4 grid (blocks of 32 along the last dimension, power-of-two scales), in w's dtype.

    Shapes: w (rows, cols) -> (rows, cols).
    """
    blocks = _blocks(w, _MX_BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.floor(torch.log2(amax)) - 2)
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    q = (round_e2m1(blocks / scale) * scale).view(w.shape[0], -1)
    return q[:, : w.shape[1]].to(w.dtype)


def fake_quant_nvfp4(w: torch.Tensor, group_size: int = 16) -> torch.Tensor:
    """``w`` on the NVFP4 grid (blocks of ``group_size`` along the last dimension with E4M3 scales, one FP32
    scale for the tensor), in w's dtype.

    Shapes: w (rows, cols) -> (rows, cols).
    """
    blocks = _blocks(w, group_size)
    tensor_amax = blocks.abs().amax()
    if tensor_amax == 0:
        return w.clone()
    s_tensor = tensor_amax / (_E4M3_MAX * 6.0)
    s_block = (blocks.abs().amax(-1, keepdim=True) / (6.0 * s_tensor)).to(torch.float8_e4m3fn).float()
    scale = s_block * s_tensor
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.where(scale > 0, round_e2m1(blocks / safe) * scale, torch.zeros_like(blocks))
    return q.view(w.shape[0], -1)[:, : w.shape[1]].to(w.dtype)


class _QATLinearFunction(torch.autograd.Function):
    """``F.linear(x, quantize(W), b)``, the gradient passed straight through to ``W``. The weight is saved
    as given (a parameter FSDP frees after the forward and gathers again for the backward) and quantized
    again in the backward, so no quantized copy of it stays alive in between."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quantize: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.quantize, ctx.has_bias = quantize, bias is not None
        return F.linear(x, quantize(weight), bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_out @ ctx.quantize(weight)
        g = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:  # dL/dW = g^T x whatever W is: straight through the quantizer
            grad_w = g.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b, None


def qat_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: QATSpec
) -> torch.Tensor:
    """``F.linear(x, W_q, bias)`` with ``W_q = spec.quantize(weight)`` in the forward and the gradient of
    ``W_q`` given to ``weight`` (the straight-through estimator).

    Shapes: x (..., in), weight (out, in), bias (out,) or None -> (..., out).
    """
    return _QATLinearFunction.apply(x, weight, bias, spec.quantize)


@dataclass(frozen=True)
class QATSpec:
    """What QAT quantizes and how (``actor.qat``).

    Attributes:
        mode: ``w4a16`` (NVFP4 weights) or ``mxfp4_experts`` (MXFP4 routed-expert weights).
        group_size: NVFP4's block (16).
        ignore_patterns: module names left in full precision: ``re:<regex>`` (searched in the name) or a
            shell pattern matched against the name or its last components (``lm_head``).
    """

    mode: str = "w4a16"
    group_size: int = 16
    ignore_patterns: Sequence[str] = ("lm_head", "embed_tokens", "re:.*mlp.gate$")

    def __post_init__(self) -> None:
        if self.mode not in QAT_MODES:
            raise ValueError(f"qat mode {self.mode!r}: choose one of {list(QAT_MODES)}")

    def quantize(self, w: torch.Tensor) -> torch.Tensor:
        """One weight matrix (out, in) on its grid."""
        if self.mode == "mxfp4_experts":
            return fake_quant_mxfp4(w)
        return fake_quant_nvfp4(w, self.group_size)

    def ignores(self, name: str) -> bool:
        for pattern in self.ignore_patterns:
            if pattern.startswith("re:"):
                if re.search(pattern[3:], name):
                    return True
            elif fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, f"*.{pattern}"):
                return True
        return False


class QATLinear(nn.Linear):
    """An ``nn.Linear`` whose forward uses its QAT weight (made by `install_qat`: a class change)."""

    qat_spec: QATSpec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return qat_linear(x, self.weight, self.bias, self.qat_spec)


def qat_targets(model: nn.Module, spec: QATSpec) -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` of every layer ``spec`` quantizes: experts blocks (weights stacked over the experts)
    and, under ``w4a16``, linear layers (a fused LM head among them) too; none an ignore pattern names.

    Raises:
        ValueError: a selected weight tied to the input embeddings (quantizing the copy a rollout decodes
            with would quantize the embeddings too).
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in model.named_modules():
        if spec.ignores(name):
            continue
        linear = isinstance(module, nn.Linear) or type(module).__name__ == "FusedLMHead"
        if is_experts_block(module) or (spec.mode == "w4a16" and linear):
            if id(getattr(module, "weight", None)) in embeddings:
                raise ValueError(
                    f"qat: {name}'s weight is tied to the input embeddings, which QAT leaves in full precision: "
                    f"add {name} to qat.ignore_patterns"
                )
            yield name, module


class _ExpertWeights(torch.overrides.TorchFunctionMode):
    """Inside an experts block without FP8: each ``F.linear`` (one expert's projection) on its QAT weight."""

    def __init__(self, spec: QATSpec) -> None:
        super().__init__()
        self.spec = spec

    def __torch_function__(
        self, func: Any, arg_types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return qat_linear(args[0], args[1], bias, self.spec)
        return func(*args, **kwargs)


def _qat_experts_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """An experts block's forward (its class's) with each expert's ``F.linear`` on its QAT weight."""
    with _ExpertWeights(self.qat_spec):
        return type(self).forward(self, *args, **kwargs)


def install_qat(model: nn.Module, spec: QATSpec) -> int:
    """Make ``model``'s forward use the QAT weights of the layers `qat_targets` selects; returns how many.

    Plain linear layers become `QATLinear`; FP8 layers (`rlflow.models.fp8`, installed first) quantize the
    QAT weight; experts blocks run each expert's ``F.linear`` on its QAT weight (transformers' per-expert
    loop, as under FP8). The parameters stay full precision: the optimizer updates them.

    Raises:
        ValueError: nothing to quantize (a dense model under ``mxfp4_experts``, or patterns that leave
            nothing).
    """
    count = 0
    for name, module in qat_targets(model, spec):
        if is_experts_block(module):
            if hasattr(module, "fp8_recipe"):
                module.weight_transform = spec.quantize
            else:
                use_eager_experts(module)
                # bound to the module (not a closure over it): a deep copy of the model rebinds it
                module.forward = types.MethodType(_qat_experts_forward, module)  # type: ignore[method-assign]
        elif hasattr(module, "fp8_recipe"):
            module.weight_transform = spec.quantize
        elif type(module) is nn.Linear or type(module).__name__ == "OneDNNLinear":
            module.__class__ = QATLinear
        else:
            raise ValueError(
                f"qat: {name} is a {type(module).__name__}, whose forward QAT cannot reach (the fused LM head "
                "of model.use_fused_kernels, a LoRA layer): add it to qat.ignore_patterns"
            )
        module.qat_spec = spec
        count += 1
    if count == 0:
        what = (
            "no routed experts"
            if spec.mode == "mxfp4_experts"
            else "no linear layers outside ignore_patterns"
        )
        raise ValueError(f"qat mode={spec.mode}: {type(model).__name__} has {what} to quantize")
    return count


@torch.no_grad()
def qat_quantize_weights_(model: nn.Module, spec: QATSpec) -> int:
    """Replace the weights of the layers `qat_targets` selects by their quantized values, in place (a
    rollout's copy of the actor: it decodes with what the quantized checkpoint holds). Returns how many
    tensors."""
    count = 0
    for _, module in qat_targets(model, spec):
        weights = [p for p in module.parameters(recurse=False) if p.dim() == 3] or [module.weight]
        for weight in weights:
            quantize_matrices_(weight, spec.quantize)
            count += 1
    return count


def qat_spec_of(model: nn.Module) -> QATSpec | None:
    """The `QATSpec` `install_qat` gave ``model``'s layers (None: no QAT)."""
    return next((m.qat_spec for m in model.modules() if hasattr(m, "qat_spec")), None)


def qat_weight_names(model: nn.Module, spec: QATSpec) -> set[str]:
    """Hugging Face names of the weights `qat_targets` selects (FSDP1's wrapper prefixes removed)."""
    from rlflow.parallel.sharded import clean_param_name

    names = set()
    for name, module in qat_targets(model, spec):
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() == 3 or pname == "weight":
                names.add(clean_param_name(f"{name}.{pname}" if name else pname))
    return names


def quantize_weight_stream(
    pairs: Iterable[tuple[str, torch.Tensor]], names: set[str], spec: QATSpec
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs with the tensors named in ``names`` quantized (per expert when stacked): the
    weights an engine that loads them by name receives from a QAT actor."""
    for name, tensor in pairs:
        if name in names:
            tensor = (
                torch.stack([spec.quantize(m) for m in tensor])
                if tensor.dim() == 3
                else spec.quantize(tensor)
            )
        yield name, tensor
