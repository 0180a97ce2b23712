"""Ulysses sequence parallelism (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509) on torch.distributed.

Dataflow for one packed micro-batch on an SP group of size ``sp`` (every rank of the group holds the same
micro-batch):

1. ``ulysses_pad_and_slice_inputs``: pad the packed row ``(1, total)`` to a multiple of ``sp`` (padding ids 0,
   padding positions ``0, 1, ...`` so the pad is a sequence of its own) and keep this rank's contiguous slice
   ``(1, total_padded / sp)``.
2. The model runs on the local slice. Everything except attention is token-wise. In each attention layer
   (``rlflow.models.attention``, registered as ``"rlflow_packed"``) q, k, v ``(b, heads, s_local, d)`` go
   through an all-to-all to ``(b, heads / sp, s_full, d)``, attend causally inside each packed sequence
   (found from the *full* packed ``position_ids``, all-gathered once per forward), and go back with the
   inverse all-to-all.
3. ``gather_outputs_and_unpad``: all-gather the per-token outputs (log-probs, values, ...) along the
   sequence and drop the padding, so every SP rank holds the full packed outputs.

Gradient rule. Every SP rank computes the same loss ``L`` from the gathered outputs. The backward of the
gather keeps only this rank's slice of ``dL/d(outputs)`` and multiplies it by ``sp`` (``grad_scale=True``,
the default). The parameter gradients ``g_r`` of the ``sp`` ranks then satisfy::

    sum_r g_r = sp * grad(L)      i.e.      mean_r g_r = grad(L)

so averaging over the SP ranks gives exactly the gradient without SP; FSDP, which averages gradients over
all ``dp * sp`` ranks, therefore yields ``(1 / dp) * sum_d grad(L_d)``, the data-parallel gradient without
SP. Parameters used *after* the gather run replicated on every rank and get ``grad(L)`` on each, which the
same mean leaves unchanged. With ``grad_scale=False`` the rule becomes ``sum_r g_r = grad(L)`` (a sum, valid
only when no parameter is used after the gather).

Convention for losses under SP: the loss on each rank is the **full-sequence** loss of the micro-batch,
identical on the ``sp`` peers of a group (they hold the same samples). Normalisers such as the global
valid-token count are therefore counted over the DP ranks only (each SP group once), never summed over
the SP peers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "SeqAllToAll",
    "checkpoint_context_fn",
    "gather_heads_scatter_seq",
    "gather_outputs_and_unpad",
    "gather_seq_scatter_heads",
    "get_ulysses_sequence_parallel_group",
    "get_ulysses_sequence_parallel_rank",
    "get_ulysses_sequence_parallel_world_size",
    "set_ulysses_sequence_parallel_group",
    "ulysses_group",
    "ulysses_pad_and_slice_inputs",
]

_ULYSSES_SEQUENCE_PARALLEL_GROUP: Any = None


def set_ulysses_sequence_parallel_group(group: Any) -> None:
    """Set the process group used by Ulysses attention and gathers (None disables SP)."""
    global _ULYSSES_SEQUENCE_PARALLEL_GROUP
    _ULYSSES_SEQUENCE_PARALLEL_GROUP = group


@contextmanager
def ulysses_group(group: Any) -> Iterator[None]:
    """Use ``group`` as the Ulysses group inside the ``with`` block, then restore the previous one.

    Args:
        group: SP process group, or None for no sequence parallelism.
    """
    previous = _ULYSSES_SEQUENCE_PARALLEL_GROUP
    set_ulysses_sequence_parallel_group(group)
    try:
        yield
    finally:
        set_ulysses_sequence_parallel_group(previous)


def checkpoint_context_fn() -> tuple[Any, Any]:
    """``context_fn`` for non-reentrant activation checkpointing under Ulysses SP.

    Called when a checkpointed layer runs forward: the recomputation in backward then runs inside the SP
    group that was active during that forward (the ``ulysses_group`` block of the forward has exited by
    the time backward recomputes the layer; without this the recomputed attention would skip its
    all-to-all and save different tensors).

    Returns:
        ``(forward context, recompute context)`` for ``torch.utils.checkpoint.checkpoint``.
    """
    return nullcontext(), ulysses_group(_ULYSSES_SEQUENCE_PARALLEL_GROUP)


def get_ulysses_sequence_parallel_group() -> Any:
    """The Ulysses process group, or None when SP is off."""
    return _ULYSSES_SEQUENCE_PARALLEL_GROUP


def get_ulysses_sequence_parallel_world_size(group: Any = None) -> int:
    """Size of ``group`` (default: the Ulysses group); 1 when there is none."""
    group = group if group is not None else _ULYSSES_SEQUENCE_PARALLEL_GROUP
    return 1 if group is None else dist.get_world_size(group)


def get_ulysses_sequence_parallel_rank(group: Any = None) -> int:
    """Rank in ``group`` (default: the Ulysses group); 0 when there is none."""
    group = group if group is not None else _ULYSSES_SEQUENCE_PARALLEL_GROUP
    return 0 if group is None else dist.get_rank(group)


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Split ``x`` in ``world`` chunks along ``scatter_dim``, send chunk i to rank i, concat along ``gather_dim``."""
    world = dist.get_world_size(group)
    if x.shape[scatter_dim] % world != 0:
        raise ValueError(
            f"dim {scatter_dim} of size {x.shape[scatter_dim]} is not divisible by the SP size {world}"
        )
    inputs = [chunk.contiguous() for chunk in torch.tensor_split(x, world, dim=scatter_dim)]
    outputs = [torch.empty_like(chunk) for chunk in inputs]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim)


class SeqAllToAll(torch.autograd.Function):
    """Differentiable all-to-all; its backward is the all-to-all with the two dims swapped."""

    @staticmethod
    def forward(ctx: Any, group: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        return None, _all_to_all(grad_output, ctx.gather_dim, ctx.scatter_dim, ctx.group), None, None


def gather_seq_scatter_heads(x: torch.Tensor, seq_dim: int, head_dim: int, group: Any = None) -> torch.Tensor:
    """All-to-all from a local sequence slice with all heads to the full sequence with ``heads / sp`` heads.

    Args:
        x: e.g. (b, heads, s_local, d) with ``seq_dim=2, head_dim=1``.
        seq_dim: sequence axis (gathered).
        head_dim: head axis (scattered; must be divisible by the SP size).
        group: process group (default: the Ulysses group).

    Returns:
        e.g. (b, heads / sp, s_local * sp, d); rank ``r`` keeps heads ``[r * heads / sp, (r + 1) * heads / sp)``.
    """
    group = group if group is not None else _ULYSSES_SEQUENCE_PARALLEL_GROUP
    if get_ulysses_sequence_parallel_world_size(group) == 1:
        return x
    return SeqAllToAll.apply(group, x, head_dim, seq_dim)


def gather_heads_scatter_seq(x: torch.Tensor, head_dim: int, seq_dim: int, group: Any = None) -> torch.Tensor:
    """Inverse of :func:`gather_seq_scatter_heads`.

    Args:
        x: e.g. (b, heads / sp, s_full, d) with ``head_dim=1, seq_dim=2``.
        head_dim: head axis (gathered).
        seq_dim: sequence axis (scattered; must be divisible by the SP size).
        group: process group (default: the Ulysses group).

    Returns:
        e.g. (b, heads, s_full / sp, d), this rank's contiguous sequence slice.
    """
    group = group if group is not None else _ULYSSES_SEQUENCE_PARALLEL_GROUP
    if get_ulysses_sequence_parallel_world_size(group) == 1:
        return x
    return SeqAllToAll.apply(group, x, seq_dim, head_dim)


class _GatherKeepSliceGrad(torch.autograd.Function):
    """All-gather along ``dim``; the backward keeps this rank's slice of the gradient (times ``sp`` if scaled)."""

    @staticmethod
    def forward(ctx: Any, group: Any, x: torch.Tensor, dim: int, grad_scale: bool) -> torch.Tensor:
        world = dist.get_world_size(group)
        ctx.group, ctx.dim, ctx.grad_scale, ctx.local = group, dim, grad_scale, x.shape[dim]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        grad = grad_output.narrow(ctx.dim, rank * ctx.local, ctx.local)
        if ctx.grad_scale:
            grad = grad * world
        return None, grad.contiguous(), None, None


def gather_outputs_and_unpad(
    x: torch.Tensor,
    gather_dim: int,
    unpad_dim: int | None = None,
    padding_size: int = 0,
    group: Any = None,
    grad_scale: bool = True,
) -> torch.Tensor:
    """All-gather per-token outputs over the SP group and drop the SP padding.

    Args:
        x: local outputs, e.g. (1, s_local) log-probs or (s_local, vocab) logits.
        gather_dim: sequence axis of ``x``.
        unpad_dim: axis to trim ``padding_size`` trailing entries from (usually ``gather_dim``); None: no trim.
        padding_size: pad size returned by :func:`ulysses_pad_and_slice_inputs`.
        group: process group (default: the Ulysses group).
        grad_scale: multiply the kept gradient slice by ``sp`` (see the module docstring for the rule).

    Returns:
        The full outputs, ``x.shape[gather_dim] * sp - padding_size`` long on ``unpad_dim``.
    """
    group = group if group is not None else _ULYSSES_SEQUENCE_PARALLEL_GROUP
    if get_ulysses_sequence_parallel_world_size(group) > 1:
        x = _GatherKeepSliceGrad.apply(group, x, gather_dim, grad_scale)
    if unpad_dim is not None and padding_size > 0:
        x = x.narrow(unpad_dim, 0, x.shape[unpad_dim] - padding_size)
    return x


def ulysses_pad_and_slice_inputs(
    input_ids_rmpad: torch.Tensor,
    position_ids_rmpad: torch.Tensor | None,
    sp_size: int,
    sp_rank: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Pad a packed row to a multiple of ``sp_size`` and return this rank's slice.

    Args:
        input_ids_rmpad: (1, total) packed token ids (or any (1, total, ...) per-token tensor).
        position_ids_rmpad: (1, total) packed positions, or None.
        sp_size: Ulysses sequence-parallel size.
        sp_rank: rank in the SP group (default: rank in the Ulysses group).

    Returns:
        input_ids: (1, total_padded / sp_size) this rank's slice (padding ids are 0).
        position_ids: (1, total_padded / sp_size) slice of the positions (padding positions ``0, 1, ...``,
            a separate sequence), or None.
        pad_size: number of padding tokens appended at the end of the full row.
    """
    if sp_size < 1:
        raise ValueError(f"ulysses_sequence_parallel_size must be >= 1, got {sp_size}")
    rank = get_ulysses_sequence_parallel_rank() if sp_rank is None else sp_rank
    if not 0 <= rank < sp_size:
        raise ValueError(f"sp_rank={rank} is outside [0, {sp_size})")
    total = input_ids_rmpad.shape[1]
    pad_size = (-total) % sp_size
    if pad_size:
        pad_shape = (input_ids_rmpad.shape[0], pad_size, *input_ids_rmpad.shape[2:])
        input_ids_rmpad = torch.cat([input_ids_rmpad, input_ids_rmpad.new_zeros(pad_shape)], dim=1)
        if position_ids_rmpad is not None:
            pad_pos = torch.arange(pad_size, dtype=position_ids_rmpad.dtype, device=position_ids_rmpad.device)
            pad_pos = pad_pos.expand(position_ids_rmpad.shape[0], pad_size)
            position_ids_rmpad = torch.cat([position_ids_rmpad, pad_pos], dim=1)
    local = input_ids_rmpad.shape[1] // sp_size
    input_ids = input_ids_rmpad[:, rank * local : (rank + 1) * local]
    if position_ids_rmpad is not None:
        position_ids_rmpad = position_ids_rmpad[:, rank * local : (rank + 1) * local]
    return input_ids, position_ids_rmpad, pad_size
