"""Small torch helpers shared by the PPO algorithms and the rollout: masked statistics, response masks,
padding, log-probs and entropy.

Shapes follow the rest of rlflow: ``(bs, response_len)`` for per-token quantities and
``(..., vocab)`` for logits. Masks are 0/1 tensors (bool, int or float) of the same shape as the values.

The masked statistics use the definitions of verl's ``verl.utils.torch_functional`` (same names and
arguments) so that code written against verl gives the same numbers; ``masked_var`` is the
Bessel-corrected sample variance and ``masked_whiten`` is ``(x - mean) / sqrt(var + 1e-8)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from rlflow.utils.logit_blocks import kernels

__all__ = [
    "clip_by_value",
    "entropy_from_logits",
    "get_response_mask",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pad_2d_list_to_length",
    "pad_sequence_to_length",
]

# Largest number of logit elements that the log-prob / entropy kernels upcast or exponentiate at once
# (2**24 fp32 elements = 64 MiB). Rows are processed in blocks of at most this many elements.
_CHUNK_ELEMS = 1 << 24


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1.

    Args:
        values: any shape, e.g. ``(bs, response_len)``.
        mask: same shape as ``values`` (0/1, bool/int/float).
        axis: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        ``sum(values * mask)`` over ``axis``; masked-out entries never contribute, even if non-finite.
    """
    contrib = torch.where(mask != 0, values * mask.to(values.dtype), torch.zeros_like(values))
    return contrib.sum() if axis is None else contrib.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is 1.

    Args:
        values: any shape, e.g. ``(bs, response_len)``.
        mask: same shape as ``values``.
        axis: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        ``sum(values * mask) / sum(mask)`` over ``axis``. Where the mask sums to 0 the result is 0
        (not NaN, and with a zero — not NaN — gradient).
    """
    total = masked_sum(values, mask, axis)
    count = mask.to(values.dtype).sum() if axis is None else mask.to(values.dtype).sum(dim=axis)
    return total / torch.where(count > 0, count, torch.ones_like(count))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the entries where ``mask`` is 1 (a scalar).

    Args:
        values: any shape, e.g. ``(bs, response_len)``.
        mask: same shape as ``values``.
        unbiased: apply Bessel's correction ``n / (n - 1)`` (sample variance), as verl does.

    Returns:
        Scalar tensor ``mean((x - mean(x))**2)`` over valid entries, times ``n / (n - 1)`` if unbiased.

    Raises:
        ValueError: no valid entry, or (unbiased) only one valid entry — the variance is undefined.
    """
    count = float(mask.to(torch.float64).sum().item())
    if count == 0:
        raise ValueError("masked_var: the mask selects no element; the variance is undefined")
    if unbiased and count < 2:
        raise ValueError(
            f"masked_var: the mask selects {count:g} element(s); the unbiased variance needs at least 2 "
            "(e.g. whitening advantages of a batch with a single valid response token)"
        )
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance using statistics of the valid entries only.

    Args:
        values: any shape, e.g. advantages ``(bs, response_len)``.
        mask: same shape as ``values``.
        shift_mean: if False, the mean is added back (only the scale is normalised).

    Returns:
        ``(values - mean) / sqrt(var + 1e-8)`` (same shape as ``values``); mean and unbiased var are
        over valid entries. Masked entries are transformed too (callers multiply by the mask).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor | float, tensor_max: torch.Tensor | float):
    """Element-wise ``min(max(x, tensor_min), tensor_max)``; the bounds may be tensors or floats.

    Args:
        x: any shape.
        tensor_min: lower bound, broadcastable to ``x``.
        tensor_max: upper bound, broadcastable to ``x``.

    Returns:
        Tensor of the shape of ``x``.
    """
    lo = torch.as_tensor(tensor_min, dtype=x.dtype, device=x.device)
    hi = torch.as_tensor(tensor_max, dtype=x.dtype, device=x.device)
    return torch.minimum(torch.maximum(x, lo), hi)


def get_response_mask(
    response_id: torch.Tensor, eos_token: int | Sequence[int] = 2, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Mask of the tokens of each response up to and including its first EOS.

    Args:
        response_id: ``(bs, response_len)`` generated token ids (any leading shape; the last dim is time).
        eos_token: one EOS id or a list of ids; any of them ends a response.
        dtype: dtype of the returned mask.

    Returns:
        ``(bs, response_len)`` mask: 1 up to and including the first EOS, 0 after it; all 1 if a row has
        no EOS. Example: ids ``[5, 2, 7, 2]`` with ``eos_token=2`` give ``[1, 1, 0, 0]``.
    """
    ids = [eos_token] if isinstance(eos_token, int) else list(eos_token)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(
            f"get_response_mask: eos_token must be an int or a non-empty list of ints, got {eos_token!r}"
        )
    is_eos = torch.isin(response_id, torch.tensor(ids, device=response_id.device, dtype=response_id.dtype))
    eos_seen_before = torch.cumsum(is_eos.to(torch.int64), dim=-1) - is_eos.to(torch.int64)
    return (eos_seen_before == 0).to(dtype)


def pad_2d_list_to_length(
    response: Sequence[Sequence[int]], pad_token_id: int, max_length: int | None = None
) -> torch.Tensor:
    """Right-pad a list of token-id lists into one ``(bs, length)`` tensor.

    Args:
        response: ``bs`` lists of token ids (e.g. generated responses), possibly of different lengths.
        pad_token_id: id written after the end of each shorter list.
        max_length: pad to this length when it exceeds the longest list; the longest list is never cut
            (as verl), so ``length = max(max_length, longest)``.

    Returns:
        ``(bs, length)`` int64 tensor. Example: ``[[1, 2], [3]]`` with pad 0 gives ``[[1, 2], [3, 0]]``.
    """
    rows = [list(row) for row in response]
    if not rows:
        raise ValueError("pad_2d_list_to_length: response is empty; need at least one row")
    length = max(len(row) for row in rows)
    if max_length is not None:
        length = max(length, int(max_length))
    return torch.tensor([row + [pad_token_id] * (length - len(row)) for row in rows], dtype=torch.int64)


def pad_sequence_to_length(
    tensors: torch.Tensor, max_seq_len: int, pad_token_id: int | float, left_pad: bool = False
) -> torch.Tensor:
    """Pad the last dimension of ``tensors`` to ``max_seq_len`` with ``pad_token_id``.

    Args:
        tensors: ``(bs, seq_len)`` (any leading shape; the last dim is padded).
        max_seq_len: target length; a tensor already at least this long is returned unchanged (not cut).
        pad_token_id: fill value.
        left_pad: pad on the left (prompts) instead of the right (responses).

    Returns:
        ``(bs, max(seq_len, max_seq_len))`` tensor of the input dtype.
    """
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return F.pad(tensors, (missing, 0) if left_pad else (0, missing), mode="constant", value=pad_token_id)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types, else the input float dtype (float32 / float64)."""
    return torch.promote_types(dtype, torch.float32)


def _row_blocks(t: torch.Tensor, max_rows: int, start: int = 0) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield ``(row_start, row_end, block)`` covering ``t`` of shape ``(..., vocab)`` as 2-D row blocks.

    Row indices are positions in ``t.reshape(-1, vocab)``. Blocks are *views* of ``t`` (no copy), also
    when ``t`` is a non-contiguous slice such as ``logits[:, :-1]``.
    """
    vocab = t.shape[-1]
    try:
        flat = t.view(-1, vocab)
    except RuntimeError:  # not viewable as 2-D: walk the leading dim, each slice has one fewer dim
        rows_per_item = t[0].numel() // vocab if t.shape[0] > 0 else 0
        for i in range(t.shape[0]):
            yield from _row_blocks(t[i], max_rows, start + i * rows_per_item)
        return
    for s in range(0, flat.shape[0], max_rows):
        block = flat[s : s + max_rows]
        yield start + s, start + s + block.shape[0], block


def _max_rows(vocab: int) -> int:
    return max(1, _CHUNK_ELEMS // max(vocab, 1))


class _LogprobsFromLogits(torch.autograd.Function):
    """log softmax(logits)[label] with a backward that recomputes softmax block by block."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, compiled: bool) -> torch.Tensor:
        cdtype = _compute_dtype(logits.dtype)
        lse = torch.empty(labels.shape, dtype=cdtype, device=logits.device)
        lse_flat, lse_block = lse.view(-1), kernels(compiled).lse
        for s, e, block in _row_blocks(logits, _max_rows(logits.shape[-1])):
            lse_flat[s:e] = lse_block(block, cdtype)
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1).to(cdtype)
        ctx.save_for_backward(logits, labels, lse)
        ctx.compiled = compiled
        return picked - lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat, g_flat = grad.view(-1, logits.shape[-1]), grad_out.reshape(-1).to(lse.dtype)
        lse_flat, labels_flat = lse.view(-1), labels.reshape(-1)
        grad_block = kernels(ctx.compiled).logprob_grad
        for s, e, block in _row_blocks(logits, _max_rows(logits.shape[-1])):
            # d/dx_j [x_label - logsumexp(x)] = 1[j == label] - softmax(x)_j
            grad_flat[s:e] = grad_block(block, lse_flat[s:e], g_flat[s:e], labels_flat[s:e])
        return grad, None, None


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True, compiled: bool = False
) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``, memory-light.

    Computed as ``logits[label] - logsumexp(logits)`` in row blocks of at most ``_CHUNK_ELEMS``
    elements. Unlike ``log_softmax(logits).gather(...)``, no full ``(..., vocab)`` log-softmax is kept
    for backward: only ``logits`` itself (already alive in the model graph) and the ``(...)`` log-normaliser
    are saved, and the backward recomputes ``softmax`` block by block. Half-precision logits are
    upcast to float32 one block at a time.

    Args:
        logits: ``(bs, seq, vocab)``, packed ``(n, vocab)``, or any ``(..., vocab)``; may be a
            non-contiguous slice.
        labels: ``(bs, seq)`` / ``(n,)`` integer token ids, ``logits.shape[:-1]``.
        inplace_backward: accepted for compatibility with verl's signature; the backward here always
            writes the logits gradient into one freshly allocated buffer, block by block.
        compiled: run the block kernels through ``torch.compile`` (`rlflow.utils.logit_blocks`).

    Returns:
        ``logits.shape[:-1]`` log-probs in ``promote_types(logits.dtype, float32)`` (float32 for bf16).
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"logprobs_from_logits: labels shape {tuple(labels.shape)} must equal logits.shape[:-1] "
            f"{tuple(logits.shape[:-1])}"
        )
    return _LogprobsFromLogits.apply(logits, labels.long(), bool(compiled))


class _EntropyFromLogits(torch.autograd.Function):
    """Categorical entropy with a backward that recomputes softmax block by block.

    Works on ``x' = x - max(x)`` per row, so that ``H = logsumexp(x') - E_p[x']`` subtracts two
    numbers of the size of H rather than of the logits (no cancellation for peaked distributions).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, compiled: bool) -> torch.Tensor:
        cdtype = _compute_dtype(logits.dtype)
        shape = logits.shape[:-1]
        row_max, lse, mean_shifted = (
            torch.empty(shape, dtype=cdtype, device=logits.device) for _ in range(3)
        )
        max_flat, lse_flat, mean_flat = row_max.view(-1), lse.view(-1), mean_shifted.view(-1)
        stats_block = kernels(compiled).entropy_stats
        for s, e, block in _row_blocks(logits, _max_rows(logits.shape[-1])):
            max_flat[s:e], lse_flat[s:e], mean_flat[s:e] = stats_block(block, cdtype)
        ctx.save_for_backward(logits, row_max, lse, mean_shifted)
        ctx.compiled = compiled
        return lse - mean_shifted

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, row_max, lse, mean_shifted = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat, g_flat = grad.view(-1, logits.shape[-1]), grad_out.reshape(-1).to(lse.dtype)
        max_flat, lse_flat, mean_flat = row_max.view(-1), lse.view(-1), mean_shifted.view(-1)
        grad_block = kernels(ctx.compiled).entropy_grad
        for s, e, block in _row_blocks(logits, _max_rows(logits.shape[-1])):
            # dH/dx_j = p_j * (E_p[x] - x_j), unchanged by the shift
            grad_flat[s:e] = grad_block(block, max_flat[s:e], lse_flat[s:e], mean_flat[s:e], g_flat[s:e])
        return grad, None


def entropy_from_logits(logits: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` along the last dim, memory-light.

    ``H = logsumexp(x) - sum(softmax(x) * x)`` (computed on max-shifted logits). The softmax is formed one
    row block at a time and is not kept for backward: only ``logits`` (a reference) and three ``(...)``
    statistics are saved, and the backward ``dH/dx = p * (E_p[x] - x)`` recomputes ``p`` block by block.
    ``-inf`` logits (banned tokens) contribute 0 to the entropy and get a zero gradient.

    Args:
        logits: ``(bs, seq, vocab)``, ``(n, vocab)`` or any ``(..., vocab)``.
        compiled: run the block kernels through ``torch.compile`` (`rlflow.utils.logit_blocks`).

    Returns:
        ``logits.shape[:-1]`` entropies (nats) in ``promote_types(logits.dtype, float32)``.
    """
    return _EntropyFromLogits.apply(logits, bool(compiled))
