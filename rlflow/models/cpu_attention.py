"""Attention of packed sequences with oneDNN's GEMM on the CPU, for models whose linear layers
compute with oneDNN (``trainer.cpu_linear_kernel`` resolved to ``onednn``, `rlflow.models.cpu_linear`).

The packed path of `rlflow.models.attention` runs one SDPA call per sequence. On the CPU that is torch's
flash kernel, whose small block products go through MKL: at the 13M bench model's shapes (4 heads of 96,
2 KV heads, 16 sequences of 140-200 tokens) it computes at about 40 GFLOP/s on one Zen 5 core, where
oneDNN's GEMM reaches 190 on the same products. `packed_onednn_attention` computes each sequence's
attention as explicit products through `rlflow.utils.onednn.onednn_linear`:

* forward, per sequence and KV head, with the ``G`` query heads of the group folded into the rows
  (``(len * G, d)``, row ``t * G + g``): ``S = Q K^T`` (len * G, len), ``P = softmax(scale * S + M)`` with
  ``M`` the causal mask of query ``t`` (``-inf`` on the keys after it), ``O = P V``;
* backward from the stored ``P``: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = scale * P * (dP - rowsum(dO * O))``,
  ``dQ = dS K``, ``dK = dS^T Q``.

The same exact fp32 math as SDPA in another summation order (agreement to float rounding, ~1e-6). ``P``
takes ``heads * len**2`` floats per sequence and layer until the backward, so sequences longer than
`MAX_LENGTH` (and everything else this path does not cover: dropout, non-fp32 tensors, a torch build
without oneDNN) keep the SDPA call.

Measured on one core of the 2-core Zen 5 EPYC (docs/benchmarks.md), one 13M layer over 16 sequences of
140-200 tokens: forward and backward 22-24 ms against SDPA's 34.5-35, forward alone 6.9-7.5 against
10.3-10.7.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from rlflow.utils.onednn import onednn_linear, onednn_linear_available

__all__ = [
    "MAX_LENGTH",
    "MIN_HEAD_DIM",
    "MIN_MACS_PER_THREAD",
    "ONEDNN_ATTENTION_ATTR",
    "onednn_attention_applies",
    "packed_onednn_attention",
]

ONEDNN_ATTENTION_ATTR = "rlflow_onednn_attention"
"""Attribute `rlflow.models.cpu_linear.install_onednn_linear` sets (True) on a model's attention modules:
their packed attention runs through `packed_onednn_attention` where it applies."""

MAX_LENGTH = 1024
"""Longest sequence this path takes: its ``P`` (``heads * len**2`` floats per layer, 16 MiB at 4 heads and
1024 tokens) is kept for the backward; longer sequences keep SDPA, whose flash kernel stores none."""

MIN_HEAD_DIM = 64
"""Narrower heads keep SDPA: with 32-wide heads the products are too thin for oneDNN's kernel to gain
(one core, 8 sequences of 350-450 tokens: 1.07x; two cores 0.85x)."""

MIN_MACS_PER_THREAD = 1 << 22
"""Smallest mean score product (``len**2 * G * d`` multiply-adds per sequence and KV head) per torch thread
this path takes; below it the per-call costs of the products, copies and softmax outweigh what oneDNN's
kernel saves. Forward and backward against SDPA on the Zen 5 EPYC: ``G = 2, d = 96, len 140-200`` (5.5M)
1.5x faster on one core, the same on two; ``G = 2, d = 64`` (4.1M) 1.3x and 0.9x; ``G = 2, d = 128``
(8.3M) 1.7x and 1.1x; ``G = 1, d = 64`` (2.1M) 0.98x and 0.62x; ``G = 2, d = 96, len 350-450`` (31M) 1.8x
and 1.2x."""

_MASK = torch.zeros(0, 0)


def _causal_mask(length: int) -> torch.Tensor:
    """Additive causal mask (length, length): -inf on the keys after each query. The top-left block of
    one cached mask, grown to the next power of two when a longer sequence comes (at most `MAX_LENGTH`
    squared floats, 4 MiB)."""
    global _MASK
    if _MASK.shape[0] < length:
        size = 1 << (length - 1).bit_length()
        _MASK = torch.full((size, size), float("-inf")).triu_(1)
    return _MASK[:length, :length]


def onednn_attention_applies(
    module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, dropout: float, lengths: list[list[int]]
) -> bool:
    """True when `packed_onednn_attention` computes this call: the module was marked
    (`ONEDNN_ATTENTION_ATTR`), fp32 CPU tensors, no dropout, every sequence at most `MAX_LENGTH` tokens,
    products large enough to pay oneDNN's per-call cost (`MIN_HEAD_DIM`, `MIN_MACS_PER_THREAD`), and
    oneDNN's linear op works in this torch build."""
    if not getattr(module, ONEDNN_ATTENTION_ATTR, False) or dropout:
        return False
    if q.device.type != "cpu" or q.dtype != torch.float32 or k.dtype != torch.float32:
        return False
    if q.shape[-1] < MIN_HEAD_DIM or q.shape[1] % k.shape[1]:
        return False
    flat = [length for row in lengths for length in row if length]
    if not flat or max(flat) > MAX_LENGTH:
        return False
    group = q.shape[1] // k.shape[1]
    mean_macs = group * q.shape[-1] * sum(length * length for length in flat) / len(flat)
    if mean_macs < MIN_MACS_PER_THREAD * torch.get_num_threads():
        return False
    return onednn_linear_available()


def _segments(lengths: list[list[int]]) -> list[tuple[int, int, int]]:
    """``(row, start, length)`` of every packed sequence."""
    out = []
    for row, row_lengths in enumerate(lengths):
        start = 0
        for length in row_lengths:
            if length:
                out.append((row, start, length))
            start += length
    return out


def _fold(x: torch.Tensor, row: int, heads: slice, start: int, length: int) -> torch.Tensor:
    """The heads ``heads`` of one sequence of x (b, h, s, d) as rows ``t * G + g``: (length * G, d)."""
    return x[row, heads, start : start + length].transpose(0, 1).reshape(-1, x.shape[-1])


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[list[int]], scale: float, causal: bool
) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple[int, int, int]]]:
    """The forward: ``(out (b, s, heads, d), P of every sequence and KV head, the segments)``."""
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out = q.new_empty(batch, seq, heads, dim)  # returned as (b, h, s, d): its transpose is contiguous
    if any(sum(row) < seq for row in lengths):
        out.zero_()
    probs = []
    segments = _segments(lengths)
    for row, start, length in segments:
        mask = _causal_mask(length)[:, None] if causal else None  # (length, 1, length): every head
        for h in range(kv_heads):
            qf = _fold(q, row, slice(h * group, (h + 1) * group), start, length)
            key = k[row, h, start : start + length].contiguous()
            scores = onednn_linear(qf, key)  # (length * G, length), row t * G + g
            if causal:
                scores = torch.add(mask, scores.view(length, group, length), alpha=scale)
                scores = scores.view(length * group, length)
            else:
                scores = scores.mul_(scale)
            p = torch.softmax(scores, dim=-1)
            value_t = v[row, h, start : start + length].t().contiguous()  # (d, length)
            out[row, start : start + length, h * group : (h + 1) * group] = onednn_linear(p, value_t).view(
                length, group, dim
            )
            probs.append(p)
    return out, probs, segments


class _PackedOneDNNAttention(torch.autograd.Function):
    """q (b, h, s, d), k/v (b, h_kv, s, d) -> (b, h, s, d), causal or not inside each packed sequence."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lengths: list[list[int]],
        scale: float,
        causal: bool,
    ) -> torch.Tensor:
        out, probs, segments = _attend(q, k, v, lengths, scale, causal)
        ctx.save_for_backward(q, k, v, out)
        ctx.probs, ctx.segments, ctx.scale = probs, segments, scale
        return out.transpose(1, 2)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out = ctx.saved_tensors
        batch, heads, seq, dim = q.shape
        kv_heads = k.shape[1]
        group = heads // kv_heads
        grad_q = q.new_zeros(batch, seq, heads, dim)
        grad_k = k.new_zeros(batch, seq, kv_heads, dim)
        grad_v = v.new_zeros(batch, seq, kv_heads, dim)
        out = out.transpose(1, 2)
        probs = iter(ctx.probs)
        for row, start, length in ctx.segments:
            end = start + length
            for h in range(kv_heads):
                p = next(probs)
                heads_h = slice(h * group, (h + 1) * group)
                qf = _fold(q, row, heads_h, start, length)
                do = _fold(grad_out, row, heads_h, start, length)
                o = _fold(out, row, heads_h, start, length)
                key = k[row, h, start:end].contiguous()
                value = v[row, h, start:end].contiguous()
                grad_v[row, start:end, h] = onednn_linear(p.t().contiguous(), do.t().contiguous())
                grad_p = onednn_linear(do, value)  # (length * G, length)
                delta = (do * o).sum(-1, keepdim=True)
                grad_s = grad_p.sub_(delta).mul_(p).mul_(ctx.scale)
                grad_q[row, start:end, heads_h] = onednn_linear(grad_s, key.t().contiguous()).view(
                    length, group, dim
                )
                grad_k[row, start:end, h] = onednn_linear(grad_s.t().contiguous(), qf.t().contiguous())
        ctx.probs = None
        return grad_q.transpose(1, 2), grad_k.transpose(1, 2), grad_v.transpose(1, 2), None, None, None


def packed_onednn_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: list[list[int]],
    scaling: float | None,
    causal: bool,
) -> torch.Tensor:
    """Attention inside each packed sequence through oneDNN's GEMM (see the module docstring).

    Args:
        q: (b, heads, s, d) fp32 CPU.
        k / v: (b, kv_heads, s, d); ``heads`` a multiple of ``kv_heads``.
        lengths: per row of the batch, the lengths of its packed sequences (summing to at most ``s``;
            columns after them stay zero).
        scaling: softmax scale; None = ``d ** -0.5``.
        causal: causal attention inside each sequence.

    Returns:
        (b, heads, s, d), a transposed view of a (b, s, heads, d) tensor.
    """
    scale = float(scaling) if scaling is not None else q.shape[-1] ** -0.5
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _PackedOneDNNAttention.apply(q, k, v, lengths, scale, causal)
    return _attend(q, k, v, lengths, scale, causal)[0].transpose(1, 2)  # no autograd: nothing kept
