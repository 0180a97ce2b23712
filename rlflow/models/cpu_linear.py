"""Linear layers through oneDNN's fp32 kernel on the CPU (``trainer.cpu_linear_kernel``).

torch computes ``F.linear`` in fp32 on x86 CPUs with MKL's GEMM. On some CPUs oneDNN's kernel (shipped in
the same torch build) is much faster: on a 2-core AMD EPYC (Zen 5) MKL multiplies at about 210 GFLOP/s and
oneDNN at 420-500, on every shape of a 13M Qwen2's forward and backward; on another EPYC (AVX-512, 32 MB
L3) the two were within 10 %; MKL is tuned for Intel's CPUs. `resolve_cpu_linear_kernel` measures both
where the run starts and picks oneDNN only where it is clearly faster.

`linear` is ``F.linear`` with the forward and both backward products in oneDNN (the forward and the input
gradient through ``torch.ops.mkldnn._linear_pointwise``, the weight gradient through its inner-product
backward; exact fp32, no reduced-precision math), for fp32 CPU tensors and products large enough for
oneDNN's per-call cost to pay (`MIN_MACS`); anything else goes to ``F.linear``. Without autograd (the
rollout's prefill, the reference's and reward model's forwards) it is the forward product alone.
`install_onednn_linear` routes a model's ``nn.Linear`` modules through it; a generation replica of such a
model gets the same layers (`rlflow.rollout.hf.build_generation_replica`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from rlflow.models.cpu_attention import ONEDNN_ATTENTION_ATTR
from rlflow.utils.onednn import (
    onednn_linear,
    onednn_linear_available,
    onednn_linear_weight_grad,
    onednn_weight_grad_available,
)

__all__ = [
    "CPU_LINEAR_KERNELS",
    "MIN_MACS",
    "OneDNNLinear",
    "check_onednn_usable",
    "install_onednn_linear",
    "linear",
    "resolve_cpu_linear_kernel",
    "uses_onednn_linear",
]

logger = logging.getLogger(__name__)

CPU_LINEAR_KERNELS = ("auto", "aten", "onednn")
"""``trainer.cpu_linear_kernel``'s values: ``aten`` is ``F.linear`` (MKL on x86), ``onednn`` this module's
`linear`, ``auto`` the faster of the two as measured (`resolve_cpu_linear_kernel`)."""

MIN_MACS = 1 << 21
"""Smallest product (rows x in x out multiply-adds) `linear` sends to oneDNN. Below it oneDNN's per-call
cost exceeds what its kernel saves. Measured at 2 threads on the Zen 5 EPYC: 16 rows x (384, 384), 2.4M
MACs: 41 us against F.linear's 47; 64 rows x (128, 128), 1M MACs: 27 against 20; 128 x (128, 128), 2.1M:
32 and 32."""

AUTO_MIN_SPEEDUP = 1.25
"""``auto`` picks oneDNN when its measured fp32 rate is at least this multiple of ``torch.matmul``'s (2.1-2.3x
on the Zen 5 EPYC; 1.08-1.14x on the other one, where MKL stays)."""


def _forward_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, x W^T + b)``: x's rows (n, in), contiguous, and the product by oneDNN in x's leading shape.

    The product has its own storage, not a view of the (n, out) result: FSDP2 warns about modules
    returning views (an in-place op on one would skip its pre-backward hook)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return rows, onednn_linear(rows, weight, bias).resize_(*x.shape[:-1], weight.shape[0])


class _OneDNNLinearFunction(torch.autograd.Function):
    """``F.linear`` whose three products (``y = x W^T``, ``dx = dy W``, ``dW = dy^T x``) run in oneDNN; the
    weight gradient through its inner-product backward (`onednn_linear_weight_grad`), which reads ``dy`` and
    ``x`` as they are: at 2662 rows x (384 -> 1536), 8.0 ms against 11.7 ms for ``_linear_pointwise`` on
    their transposed copies (2 threads; 14.8 and 16.8 ms at one thread, Zen 5 EPYC).

    Shapes: x (..., in), weight (out, in), bias (out,) or None -> (..., out).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows, out = _forward_product(x, weight, bias)
        ctx.save_for_backward(rows, weight)
        ctx.input_shape = x.shape
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, weight = ctx.saved_tensors
        grad = grad_out.reshape(-1, grad_out.shape[-1]).contiguous()  # (rows, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # dy W: oneDNN's x W'^T with W' = W^T (in, out)
            grad_x = onednn_linear(grad, weight.t().contiguous(), None).resize_(ctx.input_shape)
        want_b = ctx.has_bias and ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1] and onednn_weight_grad_available():  # dy^T x (and dy summed) in one call
            grad_w, grad_b = onednn_linear_weight_grad(grad, rows, weight, want_b)
        elif ctx.needs_input_grad[1]:  # dy^T x: oneDNN's A B^T with A = dy^T (out, rows), B = x^T (in, rows)
            grad_w = onednn_linear(grad.t().contiguous(), rows.t().contiguous(), None)
        if want_b and grad_b is None:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


def _routes_to_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if bias is not None and bias.dtype != torch.float32:
        return False
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.dim() != 2 or not weight.is_contiguous():
        return False  # a DTensor or a strided view: F.linear handles it
    if torch.is_autocast_enabled("cpu"):
        return False  # autocast picks the dtype
    rows = x.numel() // max(x.shape[-1], 1)
    return rows * weight.shape[0] * weight.shape[1] >= MIN_MACS


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, onednn: bool = True
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN when ``onednn`` and the call qualifies: fp32 CPU tensors, a
    plain contiguous weight, no autocast, at least `MIN_MACS` multiply-adds. The same math in fp32; the
    summation order differs from MKL's (results agree to float rounding, about 1e-6 relative).

    Shapes: x (..., in), weight (out, in), bias (out,) or None -> (..., out).
    """
    if onednn and _routes_to_onednn(x, weight, bias):
        if torch.is_grad_enabled():
            return _OneDNNLinearFunction.apply(x, weight, bias)
        return _forward_product(x, weight, bias)[1]  # no autograd: the product alone
    return F.linear(x, weight, bias)


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` computing with `linear` (made by `install_onednn_linear`; same parameters, same
    state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def install_onednn_linear(model: nn.Module) -> int:
    """Route ``model``'s linear layers through `linear`; returns how many.

    Plain ``nn.Linear`` modules become `OneDNNLinear` (a class change: parameters, hooks and the state dict
    stay as they are). Modules with their own forward that call `linear` (``LoRALinear``) get
    ``onednn = True``. Other subclasses of ``nn.Linear`` (a fused LM head) keep their forward. The attention
    modules (transformers' ``...Attention`` classes) are marked for the packed attention's oneDNN products
    (`rlflow.models.cpu_attention`).
    """
    count = 0
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            setattr(module, ONEDNN_ATTENTION_ATTR, True)
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
            count += 1
        elif isinstance(module, nn.Linear) and hasattr(type(module), "onednn"):
            module.onednn = True
            count += 1
    return count


def uses_onednn_linear(model: nn.Module) -> bool:
    """True when `install_onednn_linear` routed any of ``model``'s linear layers through `linear`."""
    return any(isinstance(m, OneDNNLinear) or getattr(m, "onednn", False) is True for m in model.modules())


def check_onednn_usable(device_type: str, key: str = "trainer.cpu_linear_kernel") -> None:
    """Refuse ``<key>=onednn`` where it cannot run (`ValueError` naming the key): a run computing on
    ``device_type`` other than the CPU, or a torch build without a working oneDNN linear op."""
    if device_type != "cpu":
        raise ValueError(
            f"{key}=onednn is a CPU kernel, but this run computes on {device_type}; set {key} to auto or aten"
        )
    if not onednn_linear_available():
        raise ValueError(
            f"{key}=onednn: this torch build has no working oneDNN linear op "
            f"(torch.ops.mkldnn._linear_pointwise); set {key} to auto or aten"
        )


def resolve_cpu_linear_kernel(
    setting: str, device_type: str, threads: int, key: str = "trainer.cpu_linear_kernel"
) -> str:
    """``trainer.cpu_linear_kernel`` resolved for a run: ``aten`` or ``onednn``.

    ``aten`` and ``onednn`` are kept (``onednn`` needs this torch build's oneDNN; it is a CPU kernel, so a run
    computing on the GPU refuses it). ``auto``: ``aten`` off the CPU or without oneDNN, else ``onednn`` when
    oneDNN's measured fp32 rate at ``threads`` threads is at least `AUTO_MIN_SPEEDUP` times
    ``torch.matmul``'s (`rlflow.logging.flops.measure_peak_flops`, measured once per process).

    Args:
        setting: auto | aten | onednn.
        device_type: where the roles compute (``cpu`` or ``cuda``).
        threads: the intra-op threads a rank computes with.
        key: the config key, for errors (the SFT and PPO trainers share it).
    """
    if setting not in CPU_LINEAR_KERNELS:
        raise ValueError(f"{key}={setting!r}: choose one of {list(CPU_LINEAR_KERNELS)}")
    if setting == "onednn":
        check_onednn_usable(device_type, key)
        return setting
    if setting == "aten" or device_type != "cpu" or not onednn_linear_available():
        return "aten"
    from rlflow.logging.flops import measure_peak_flops

    mkl = measure_peak_flops("cpu", num_threads=threads)
    onednn = measure_peak_flops("cpu", num_threads=threads, kernel="onednn")
    chosen = "onednn" if onednn >= AUTO_MIN_SPEEDUP * mkl else "aten"
    logger.info(
        "%s=auto: %s (fp32 at %d threads: torch.matmul %.0f GFLOP/s, oneDNN %.0f GFLOP/s)",
        key,
        chosen,
        threads,
        mkl / 1e9,
        onednn / 1e9,
    )
    return chosen
