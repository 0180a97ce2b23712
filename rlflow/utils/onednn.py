"""oneDNN's linear op in this torch build (``torch.ops.mkldnn``): the call, the weight reorder of its packed
form, and a probe that they work. One place for what the training layers (`rlflow.models.cpu_linear`),
the rollout's decoding projections (`rlflow.rollout.fast_decode`) and the GEMM-rate measurement
(`rlflow.logging.flops`) call."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = ["onednn_linear", "onednn_linear_available", "reorder_linear_weight"]


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN: x (rows, in) contiguous, weight (out, in) or reordered by
    `reorder_linear_weight`, bias (out,) or None -> (rows, out)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


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
