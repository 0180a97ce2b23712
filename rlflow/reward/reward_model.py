"""Scores from a sequence-classification reward model, placed on the last valid response token.

The reward model reads ``(prompt, response)`` as one sequence: the policy's tokens, or (with
``reward_model.model.input_tokenizer``) the conversation re-tokenized with the reward model's own tokenizer and
chat template (`rlflow.reward.retokenize`). Its score is
the classification head applied to the hidden state of the last token with ``attention_mask == 1``; this
does not rely on the pad token, so it also works when pad == eos. Load the model with
:func:`rlflow.models.loader.load_reward_model`.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["compute_rm_score", "last_valid_index", "place_on_last_token", "sequence_scores"]


def last_valid_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 of each row of ``attention_mask`` (bs, seq_len) -> (bs,) long."""
    seq_len = attention_mask.shape[-1]
    return seq_len - 1 - torch.argmax(attention_mask.flip(-1).to(torch.long), dim=-1)


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level tensor with ``scores[i]`` at the last valid response token of row ``i``, 0 elsewhere.

    Args:
        scores: (bs,) sequence scores.
        response_mask: (bs, response_len) 1 on valid response tokens (each row has at least one).

    Returns:
        (bs, response_len) float32.
    """
    if bool((response_mask.sum(-1) == 0).any()):
        bad = torch.nonzero(response_mask.sum(-1) == 0).flatten().tolist()
        raise ValueError(f"reward model: samples {bad} have no valid response token")
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=scores.device)
    rows = torch.arange(response_mask.shape[0], device=scores.device)
    out[rows, last_valid_index(response_mask)] = scores.to(torch.float32)
    return out


@torch.no_grad()
def sequence_scores(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    use_remove_padding: bool = False,
) -> torch.Tensor:
    """The reward model's score of each sequence: its head on the hidden state of the last valid token.

    With ``use_remove_padding`` the valid tokens of the micro-batch are packed into one row
    (`rlflow.models.padding.unpad_micro_batch`), as the actor's and the critic's forwards do, and the
    model must use ``attn_implementation="rlflow_packed"`` (`rlflow.models.attention.set_packed_attention`);
    the head then reads the hidden state at each sequence's last packed token. Without it the padded
    batch runs with its attention mask.

    Args:
        model: e.g. ``Qwen2ForSequenceClassification`` with one label (a ``score`` linear head).
        input_ids: (bs, seq_len) token ids (any padding side).
        attention_mask: same shape, 1 on real tokens.
        position_ids: same shape.
        use_remove_padding: pack the valid tokens into one row.

    Returns:
        (bs,) scores in the head's dtype.
    """
    backbone = getattr(model, model.base_model_prefix)
    head = getattr(model, "score", None)
    if head is None:
        raise ValueError(f"reward model {type(model).__name__} has no 'score' head")
    if use_remove_padding:
        from rlflow.models.padding import unpad_micro_batch

        packed = unpad_micro_batch(input_ids, attention_mask, position_ids)
        hidden = backbone(
            input_ids=packed.input_ids, attention_mask=None, position_ids=packed.position_ids, use_cache=False
        ).last_hidden_state[0]
        last_hidden = hidden[(packed.cu_seqlens[1:].long() - 1).to(hidden.device)]
    else:
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        last_hidden = hidden[rows, last_valid_index(attention_mask)]
    return head(last_hidden).squeeze(-1)


@torch.no_grad()
def compute_rm_score(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    use_remove_padding: bool = False,
) -> torch.Tensor:
    """Token-level scores (``rm_scores``) of the policy's own sequences (`sequence_scores`).

    Args:
        input_ids: (bs, prompt_len + response_len) left-padded prompt, right-padded response.
        attention_mask, position_ids: same shape.
        response_length: ``response_len``.

    Returns:
        (bs, response_len) float32: the sequence score on the last valid response token, 0 elsewhere.
    """
    scores = sequence_scores(model, input_ids, attention_mask, position_ids, use_remove_padding)
    return place_on_last_token(scores, attention_mask[:, -response_length:])
