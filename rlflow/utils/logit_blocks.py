"""Row-block kernels of `rlflow.utils.torch_functional.logprobs_from_logits` / ``entropy_from_logits``.

Each kernel maps one 2-D block of logits ``(rows, vocab)`` to per-row statistics (forward) or to the
block's gradient (backward). Eager, each is a handful of ATen ops that write ``(rows, vocab)``
intermediates (the upcast, the shift, ``exp``, the product); `kernels` ``(compiled=True)`` returns the
same functions through ``torch.compile(dynamic=True)``, which fuses each into one pass over the block
(``actor_rollout_ref.actor.use_torch_compile``, verl's key: verl compiles its entropy function the same
way). The row count is dynamic, so a new micro-batch length does not recompile; a new dtype or vocabulary
size does, once. Compiled and eager agree to float32 rounding (the fused reductions sum in another
order), tested in ``tests/utils/test_logit_blocks.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["LogitKernels", "kernels"]


def lse_block(block: torch.Tensor, cdtype: torch.dtype) -> torch.Tensor:
    """``(rows, vocab)`` logits → ``(rows,)`` ``logsumexp`` in ``cdtype``."""
    return torch.logsumexp(block.to(cdtype), dim=-1)


def logprob_grad_block(
    block: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Gradient of ``g * (x[label] - logsumexp(x))`` w.r.t. the block ``x``: ``g * (1[j == label] - p_j)``.

    Args:
        block: ``(rows, vocab)`` logits; lse: ``(rows,)``; g: ``(rows,)`` upstream gradient in the compute
            dtype; labels: ``(rows,)`` int64.

    Returns:
        ``(rows, vocab)`` in ``block.dtype``.
    """
    gcol = g.unsqueeze(-1)
    grad = -gcol * torch.exp(block.to(lse.dtype) - lse.unsqueeze(-1))
    return grad.scatter_add(-1, labels.unsqueeze(-1), gcol).to(block.dtype)


def entropy_stats_block(
    block: torch.Tensor, cdtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, vocab)`` logits → ``(row_max, lse, mean_shifted)``, each ``(rows,)`` in ``cdtype``.

    On the shifted logits ``x' = x - max(x)``: ``lse = logsumexp(x')`` and ``mean_shifted = E_p[x']``, so
    the entropy ``lse - mean_shifted`` subtracts two numbers of its own size. ``-inf`` logits (banned
    tokens) are clamped to the dtype's lowest value: ``p = 0`` and ``p * x' = 0``.
    """
    x = block.to(cdtype).clamp_min(torch.finfo(cdtype).min)
    row_max = x.max(dim=-1, keepdim=True).values
    x = x - row_max
    lse = torch.logsumexp(x, dim=-1)
    mean_shifted = (torch.exp(x - lse.unsqueeze(-1)) * x).sum(dim=-1)
    return row_max.squeeze(-1), lse, mean_shifted


def entropy_grad_block(
    block: torch.Tensor,
    row_max: torch.Tensor,
    lse: torch.Tensor,
    mean_shifted: torch.Tensor,
    g: torch.Tensor,
) -> torch.Tensor:
    """Gradient of ``g * H(softmax(x))`` w.r.t. the block: ``g * p_j * (E_p[x] - x_j)`` (``(rows, vocab)``,
    ``block.dtype``); the statistics are `entropy_stats_block`'s."""
    cdtype = lse.dtype
    x = block.to(cdtype).clamp_min(torch.finfo(cdtype).min) - row_max.unsqueeze(-1)
    p = torch.exp(x - lse.unsqueeze(-1))
    return (g.unsqueeze(-1) * p * (mean_shifted.unsqueeze(-1) - x)).to(block.dtype)


class LogitKernels(NamedTuple):
    """The four block kernels, eager or compiled."""

    lse: Callable[..., torch.Tensor]
    logprob_grad: Callable[..., torch.Tensor]
    entropy_stats: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    entropy_grad: Callable[..., torch.Tensor]


_EAGER = LogitKernels(lse_block, logprob_grad_block, entropy_stats_block, entropy_grad_block)
_COMPILED: LogitKernels | None = None


def kernels(compiled: bool = False) -> LogitKernels:
    """The block kernels: eager, or (``compiled``) built once per process with
    ``torch.compile(dynamic=True)`` (each compiles on its first call: seconds on CPU, where inductor
    generates C++)."""
    global _COMPILED
    if not compiled:
        return _EAGER
    if _COMPILED is None:
        _COMPILED = LogitKernels(*(torch.compile(fn, dynamic=True) for fn in _EAGER))
    return _COMPILED
