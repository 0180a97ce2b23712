"""oneDNN's linear op in this torch build (``torch.ops.mkldnn``): the call, the weight reorder of its packed
form, and a probe that they work. One place for what the training layers (`rlflow.models.cpu_linear`),
the rollout's decoding projections (`rlflow.rollout.fast_decode`) and the GEMM-rate measurement
(`rlflow.logging.flops`) call."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = [
    "onednn_linear",
    "onednn_linear_available",
    "onednn_linear_weight_grad",
    "onednn_weight_grad_available",
    "reorder_linear_weight",
]


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN: x (rows, in) contiguous, weight (out, in) or reordered by
    `reorder_linear_weight`, bias (out,) or None -> (rows, out)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_linear_weight_grad(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight (and bias) gradient of ``x @ weight.T + bias`` by oneDNN's inner-product backward:
    ``grad_out.T @ x`` and ``grad_out.sum(0)``, without the transposed copies of ``grad_out`` and ``x`` a
    product through `onednn_linear` would need.

    Args:
        grad_out: (rows, out) contiguous fp32.
        x: (rows, in) contiguous fp32.
        weight: (out, in), for its shape and dtype.
        bias: also return the bias gradient.

    Returns:
        ``(grad_weight (out, in), grad_bias (out,) or None)``, dense tensors.
    """
    grad_w, grad_b = torch.ops.aten.mkldnn_linear_backward_weights(
        grad_out.to_mkldnn(), x.to_mkldnn(), weight, bias
    )
    return grad_w, grad_b if bias else None


def reorder_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A copy of ``weight`` (out, in) in oneDNN's blocked layout, for `onednn_linear` calls that reuse it."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


@functools.cache
def onednn_linear_available(packed: bool = False) -> bool:
    """True when `onednn_linear` (with ``packed``: on a `reorder_linear_weight` weight) runs on the CPU in
    this torch build and gives ``F.linear``'s result on a probe (to float rounding)."""
    if not torch.backends.mkldnn.is_available() or getattr(torch.ops, "mkldnn", None) is None:
        return False
    probe = torch.Generator().manual_seed(0)
    weight, x = torch.randn(24, 40, generator=probe), torch.randn(3, 40, generator=probe)
    bias = torch.randn(24, generator=probe)
    try:
        out = onednn_linear(x, reorder_linear_weight(weight) if packed else weight, bias)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return bool(torch.allclose(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5))


@functools.cache
def onednn_weight_grad_available() -> bool:
    """True when `onednn_linear_weight_grad` runs in this torch build and gives ``grad_out.T @ x`` and
    ``grad_out.sum(0)`` on a probe (to float rounding)."""
    if not onednn_linear_available():
        return False
    probe = torch.Generator().manual_seed(0)
    grad, x = torch.randn(30, 24, generator=probe), torch.randn(30, 40, generator=probe)
    try:
        grad_w, grad_b = onednn_linear_weight_grad(grad, x, torch.empty(24, 40), True)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return (
        grad_w.layout == torch.strided
        and grad_b is not None
        and bool(torch.allclose(grad_w, grad.t() @ x, rtol=1e-5, atol=1e-5))
        and bool(torch.allclose(grad_b, grad.sum(0), rtol=1e-5, atol=1e-5))
    )
