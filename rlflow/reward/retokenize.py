"""The policy's conversations in the reward model's own tokens (``reward_model.model.input_tokenizer``).

A reward model from another model family has its own vocabulary and chat template: it cannot read the
policy's token ids. With ``input_tokenizer`` set (the tokenizer that produced the data: the policy's, as in
verl), each sample is rebuilt as text and re-encoded:

1. the response: the valid response tokens decoded with ``input_tokenizer`` (special tokens dropped);
2. the conversation: the prompt's chat messages (``raw_prompt``, hence ``data.return_raw_chat=true``)
   followed by ``{"role": "assistant", "content": response}``;
3. the reward model's tokens: ``rm_tokenizer.apply_chat_template(conversation)``, left-truncated to
   ``max_length`` tokens when longer (the end of the conversation, where the score is read, is kept; the
   caller logs how many were cut), then left-padded into one batch.

The score of each sequence then goes on the last valid token of the *policy's* response, as without
re-tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["retokenize_conversations"]


def _token_ids(encoded: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns a list, or a mapping with ``input_ids``."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


def retokenize_conversations(
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    raw_prompts: Sequence[Sequence[dict]],
    input_tokenizer: Any,
    rm_tokenizer: Any,
    max_length: int,
) -> tuple[dict[str, torch.Tensor], int]:
    """Re-encode each (prompt messages, response) pair with the reward model's tokenizer.

    Args:
        responses: (bs, response_len) the policy's response ids.
        response_mask: (bs, response_len) 1 on valid response tokens.
        raw_prompts: bs chat-message lists (``role`` / ``content`` dicts).
        input_tokenizer: decodes ``responses`` (the policy's tokenizer).
        rm_tokenizer: the reward model's tokenizer (its chat template).
        max_length: the most tokens one sequence may have; longer ones keep their last ``max_length``.

    Returns:
        ``({"input_ids", "attention_mask", "position_ids"}: (bs, longest) left-padded, int64)`` and the
        number of sequences that were truncated.
    """
    if len(raw_prompts) != responses.shape[0]:
        raise ValueError(f"{len(raw_prompts)} prompts for {responses.shape[0]} responses")
    sequences, truncated = [], 0
    for row, mask, messages in zip(responses, response_mask, raw_prompts):
        text = input_tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=True)
        chat = [dict(m) for m in messages] + [{"role": "assistant", "content": text}]
        ids = _token_ids(rm_tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=False))
        if len(ids) > max_length:
            ids, truncated = ids[-max_length:], truncated + 1
        sequences.append(ids)
    width = max(len(ids) for ids in sequences)
    pad = rm_tokenizer.pad_token_id if rm_tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(sequences), width), int(pad), dtype=torch.int64)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.int64)
    for i, ids in enumerate(sequences):
        input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.int64)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}, truncated
