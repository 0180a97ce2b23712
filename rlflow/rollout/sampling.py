"""Sampling for the rollout engines: counter-based random numbers, top-k / top-p, the next token.

``logits / temperature`` → top-k → top-p (nucleus, Holtzman et al. 2019, arXiv:1904.09751) →
inverse-CDF sampling with one uniform per row and step. The uniforms come from a counter-based hash (the
idea of Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") of ``(seed, step id, row
index in the whole batch, token position)``: a row's samples do not depend on which other rows share its
micro-batch or its rank, so neither ``micro_batch_size`` nor the data-parallel size changes the output.
"""

from __future__ import annotations

import torch

from rlflow.rollout.base import SamplingParams

__all__ = ["apply_top_k", "apply_top_p", "counter_uniform", "row_keys", "sample_next_token"]

# ------------------------------------------------------------------------------------- counter-based RNG

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)`` without int64 overflow (split ``c`` in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (xorshift-multiply rounds; constants from C. Wellons' hash prospector)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _combine(h: torch.Tensor, value: int | torch.Tensor) -> torch.Tensor:
    """Hash ``value`` into the running 32-bit hash ``h``."""
    return _mix32(
        h ^ _mix32((torch.as_tensor(value, dtype=torch.int64, device=h.device) + 0x9E3779B9) & _M32)
    )


def row_keys(
    seed: int, step: int, first_row: int, num_rows: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """32-bit sampling keys of rows ``first_row .. first_row + num_rows - 1`` of one step's batch.

    A key depends on the row's index in the *whole* batch (after the ``n`` repeat), not on the rank
    that decodes it, so any data-parallel split of the batch samples the same tokens.

    Args:
        seed: ``actor_rollout_ref.rollout.seed`` (any Python int; its low and high 32 bits are used).
        step: step id of the call (``global_steps`` or the call counter).
        first_row: index of this call's first row in the whole batch (``dp_rank × rows per rank``).
        num_rows: rows of the call after the ``n`` repeat.
        device: device of the keys.

    Returns:
        ``(num_rows,)`` int64 keys in ``[0, 2**32)``.
    """
    h = torch.zeros((), dtype=torch.int64, device=device)
    for part in (seed & _M32, (seed >> 32) & _M32, step & _M32):
        h = _combine(h, part)
    rows = torch.arange(first_row, first_row + num_rows, device=device)
    return _combine(h.expand(num_rows), rows)


def counter_uniform(keys: torch.Tensor, position: int) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` with 53 random bits, a pure function of ``(key, position)``.

    Args:
        keys: ``(rows,)`` int64 row keys from `row_keys`.
        position: index of the generated token.

    Returns:
        ``(rows,)`` float64.
    """
    h1 = _combine(keys, position)
    h2 = _combine(h1, 0x5BD1E995)
    bits = (h1 << 21) | (h2 >> 11)  # 32 + 21 = 53 bits, exact in float64
    return bits.to(torch.float64) * (2.0**-53)


# ------------------------------------------------------------------------------------- sampling


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set every logit below the ``top_k``-th largest of its row to ``-inf`` (ties kept; ``<= 0`` = off).

    Args:
        logits: ``(rows, vocab)``.
        top_k: tokens to keep per row.

    Returns:
        ``(rows, vocab)`` filtered logits.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the most likely tokens until their mass reaches ``top_p`` (Holtzman et al. 2019).

    A token is kept when the mass of the tokens ranked strictly above it is below ``top_p``, so the
    token that crosses the threshold is kept and the top token always is.

    Args:
        logits: ``(rows, vocab)``.
        top_p: mass in ``(0, 1]``; 1.0 = off.

    Returns:
        ``(rows, vocab)`` filtered logits.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_above >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    keys: torch.Tensor,
    position: int,
    banned: torch.Tensor | None = None,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Pick the next token of every row and its log-prob under ``log_softmax(logits / T)``.

    Args:
        logits: ``(rows, vocab)`` float32 next-token logits.
        params: sampling parameters (greedy when ``params.greedy``).
        keys: ``(rows,)`` row keys (`row_keys`); unused when greedy.
        position: index of the token being generated (selects the uniform).
        banned: token ids that may not be picked (``min_tokens``: the EOS ids); their probability goes to
            the others for the pick only, the returned log-probs are of the full distribution.
        entropy: also return the entropy of that full distribution, from the same ``log_softmax``.

    Returns:
        ``tokens``: ``(rows,)`` int64; ``log_probs``: ``(rows,)`` float32, log-prob of each token under
        ``logits / params.logprob_temperature`` before top-k / top-p; ``entropy``: ``(rows,)`` float32,
        or None unless asked for.
    """
    scaled = logits / params.logprob_temperature
    allowed = scaled
    if banned is not None and banned.numel():
        allowed = scaled.index_fill(-1, banned, float("-inf"))
    if params.greedy:
        tokens = allowed.argmax(dim=-1)
    else:
        filtered = apply_top_p(apply_top_k(allowed, params.top_k), params.top_p)
        cdf = filtered.softmax(dim=-1).to(torch.float64).cumsum(dim=-1)
        target = counter_uniform(keys, position).unsqueeze(-1) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    log_softmax = scaled.log_softmax(dim=-1)
    log_probs = log_softmax.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return tokens, log_probs, None
    probs = log_softmax.exp()
    return tokens, log_probs, -torch.special.xlogy(probs, probs).sum(dim=-1)  # 0 log 0 = 0
