"""A padded micro-batch for the model tests: left-padded prompts, right-padded responses."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def padded_micro_batch(
    vocab: int, prompt_lens: Sequence[int], response_lens: Sequence[int], seed: int
) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, max prompt + max response) and
    ``responses`` (bs, max response), random tokens in ``[3, vocab)`` (clear of pad / BOS / EOS)."""
    gen = torch.Generator().manual_seed(seed)
    plen, rlen = max(prompt_lens), max(response_lens)
    input_ids = torch.zeros(len(prompt_lens), plen + rlen, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        input_ids[i, plen - p : plen + r] = torch.randint(3, vocab, (p + r,), generator=gen)
        mask[i, plen - p : plen + r] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, plen:],
    }
