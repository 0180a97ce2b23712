"""Remove padding: pack the valid tokens of a padded batch into one row, and scatter outputs back.

A padded micro-batch ``input_ids: (bs, seqlen)`` with ``attention_mask: (bs, seqlen)`` (prompts left-padded,
responses right-padded, so the mask may hold zeros on both sides of each row) becomes one packed row
``(1, total_tokens)`` holding only valid tokens, in row-major order. Its ``position_ids`` are the original ones
at the kept tokens, so every sequence restarts at 0 (the usual ``clamp(cumsum(attention_mask) - 1, 0)``
positions) and left-padded prompts keep correct positions.

Running a Hugging Face model on the packed row (``attention_mask=None``) gives exactly the per-sequence
outputs only if attention stays inside each sequence:

* ``attn_implementation="rlflow_packed"`` (``rlflow.models.attention``) finds the sequences itself from
  ``position_ids`` (a new sequence wherever the position does not grow by 1) and also runs Ulysses SP.
* ``"sdpa"`` / ``"eager"``: transformers 5.x detects packing from ``position_ids``
  (``masking_utils.find_packed_sequence_indices``) **only when there is no cache**: pass ``use_cache=False``
  (checked on transformers 5.20: with the default ``use_cache`` sequences attend to each other).
* ``"flash_attention_2"`` (GPU, optional extra) uses varlen kernels from ``position_ids``.

Recurrent layers (Mamba, linear attention: Nemotron-H, Qwen3-Next, Jamba ...) carry a state along the
token axis that no attention implementation resets, so a packed row leaks each sequence's state into the
next. `keeps_packed_sequences_apart` tells them apart; `rlflow.models.forward` runs their forwards padded.

No flash-attn dependency: everything here is plain torch indexing, differentiable through autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "PackedMicroBatch",
    "gather_response_outputs",
    "index_first_axis",
    "keeps_packed_sequences_apart",
    "pad_input",
    "shared_prompt_items",
    "unpad_input",
    "unpad_micro_batch",
    "unpad_shared_prompts",
]


# layer kinds whose state runs along the sequence (config.layer_types / layers_block_type entries)
_RECURRENT_LAYER_KINDS = ("linear_attention", "mamba", "mamba2", "ssm", "recurrent", "conv")
_RECURRENT_MODEL_TYPES = ("mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "zamba", "zamba2", "rwkv")


def keeps_packed_sequences_apart(config: object) -> bool:
    """Whether a model with this HF config computes each sequence of a packed row as it would alone
    (given attention that keeps them apart): False when it has recurrent layers (Mamba, linear attention),
    read from ``layer_types`` / ``layers_block_type`` / ``model_type``."""
    config = getattr(config, "get_text_config", lambda: config)()
    if str(getattr(config, "model_type", "")) in _RECURRENT_MODEL_TYPES:
        return False
    kinds = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None) or ()
    return not any(any(r in str(kind).lower() for r in _RECURRENT_LAYER_KINDS) for kind in kinds)


def _check_mask(attention_mask: torch.Tensor, batch: int, seqlen: int) -> None:
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, seqlen):
        raise ValueError(
            f"attention_mask must have shape (bs, seqlen)=({batch}, {seqlen}), got {tuple(attention_mask.shape)}"
        )


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Select rows of ``x`` along dim 0 (differentiable; the backward scatters into zeros).

    Args:
        x: (n, ...) tensor.
        indices: (k,) long tensor of row indices into ``x``.

    Returns:
        (k, ...) tensor ``x[indices]``.
    """
    return x.index_select(0, indices)


def unpad_input(
    hidden_or_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Drop the padded positions of a batch.

    Args:
        hidden_or_ids: (bs, seqlen, ...) token ids or hidden states.
        attention_mask: (bs, seqlen) with 1 (or True) at valid tokens.

    Returns:
        unpadded: (total_tokens, ...) the valid entries in row-major order.
        indices: (total_tokens,) long indices of the valid entries into the flattened ``(bs * seqlen)`` axis.
        cu_seqlens: (bs + 1,) int32 cumulative valid lengths, starting at 0.
        max_seqlen: the largest number of valid tokens in a row.
    """
    batch, seqlen = hidden_or_ids.shape[:2]
    _check_mask(attention_mask, batch, seqlen)
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max().item()) if batch > 0 else 0
    flat = hidden_or_ids.reshape(batch * seqlen, *hidden_or_ids.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen


def pad_input(unpadded: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of :func:`unpad_input`: scatter packed entries back into a zero-filled padded batch.

    Args:
        unpadded: (total_tokens, ...) packed values.
        indices: (total_tokens,) indices into the flattened ``(batch * seqlen)`` axis, from :func:`unpad_input`.
        batch: number of rows of the padded batch.
        seqlen: padded sequence length.

    Returns:
        (batch, seqlen, ...) tensor; padded positions hold 0.
    """
    if unpadded.shape[0] != indices.shape[0]:
        raise ValueError(f"unpadded has {unpadded.shape[0]} rows but indices has {indices.shape[0]} entries")
    out = unpadded.new_zeros((batch * seqlen, *unpadded.shape[1:]))
    out = out.index_put((indices,), unpadded)
    return out.reshape(batch, seqlen, *unpadded.shape[1:])


@dataclass
class PackedMicroBatch:
    """A padded micro-batch packed into one row, plus what is needed to scatter outputs back.

    Attributes:
        input_ids: (1, total_tokens) valid token ids.
        position_ids: (1, total_tokens) original positions of those tokens (restart at 0 per sequence).
        labels: (1, total_tokens) next-token labels, ``input_ids`` rolled by -1. At the last token of each
            sequence the label is the first token of the next sequence: meaningless, and it lands on a
            position that :func:`gather_response_outputs` maps to a padded (masked) response slot.
        indices: (total_tokens,) indices into the flattened ``(batch_size * seqlen)`` padded axis.
        cu_seqlens: (batch_size + 1,) int32 cumulative sequence lengths.
        max_seqlen: longest valid sequence.
        batch_size: rows of the padded batch.
        seqlen: padded length.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch_size: int
    seqlen: int


def _packed(
    ids: torch.Tensor,
    pos: torch.Tensor,
    indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    batch: int,
    seqlen: int,
) -> PackedMicroBatch:
    """The one packed row of ``ids`` / ``pos`` (total_tokens,), with next-token labels."""
    return PackedMicroBatch(
        input_ids=ids.unsqueeze(0),
        position_ids=pos.unsqueeze(0),
        labels=torch.roll(ids, shifts=-1, dims=0).unsqueeze(0),
        indices=indices,
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        batch_size=batch,
        seqlen=seqlen,
    )


def _check_consecutive(pos_rmpad: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    """Raise unless the packed positions of every row are ``0, 1, ..., len - 1`` (what packed attention reads)."""
    seqlens = torch.diff(cu_seqlens).long()
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), seqlens)
    expected = torch.arange(pos_rmpad.shape[0], device=pos_rmpad.device) - starts
    bad = torch.nonzero(pos_rmpad != expected).flatten()
    if bad.numel():
        row = int(torch.searchsorted(cu_seqlens.long(), bad[:1], right=True).item()) - 1
        raise ValueError(
            f"position_ids of row {row} are not 0, 1, 2, ... on its valid tokens (attention_mask == 1); "
            f"packed attention would split or merge sequences"
        )


def unpad_micro_batch(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> PackedMicroBatch:
    """Pack a padded micro-batch into a single row for a remove-padding forward.

    Args:
        input_ids: (bs, seqlen) token ids.
        attention_mask: (bs, seqlen) 1 at valid tokens.
        position_ids: (bs, seqlen) positions; at the valid tokens of each row they must be ``0, 1, 2, ...``.

    Returns:
        A :class:`PackedMicroBatch`; run the model with ``input_ids=packed.input_ids,
        position_ids=packed.position_ids, attention_mask=None, use_cache=False``.
    """
    batch, seqlen = input_ids.shape
    if position_ids.shape != input_ids.shape:
        raise ValueError(
            f"position_ids must have shape (bs, seqlen)={tuple(input_ids.shape)}, got {tuple(position_ids.shape)}"
        )
    ids_rmpad, indices, cu_seqlens, max_seqlen = unpad_input(input_ids, attention_mask)
    pos_rmpad = index_first_axis(position_ids.reshape(-1), indices)
    _check_consecutive(pos_rmpad, cu_seqlens)
    return _packed(ids_rmpad, pos_rmpad, indices, cu_seqlens, max_seqlen, batch, seqlen)


def _prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> list[list[int]]:
    """Rows with identical prompt columns (ids and mask), grouped in order of first appearance."""
    key = torch.cat(
        [input_ids[:, :prompt_len] * attention_mask[:, :prompt_len], attention_mask[:, :prompt_len]], 1
    )
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(inverse.tolist()):
        groups.setdefault(g, []).append(row)
    return list(groups.values())


def _can_share(attention_mask: torch.Tensor, prompt_len: int) -> bool:
    """Every row's last prompt column is a token and every prompt has two or more (else nothing to share)."""
    valid = attention_mask.bool()
    return bool(valid[:, prompt_len - 1].all()) and int(valid[:, :prompt_len].sum(-1).min()) >= 2


def shared_prompt_items(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int, max_tokens: int
) -> tuple[list[list[int]], list[int]] | None:
    """Rows that shared-prompt packing runs together, as the items of token-budget micro-batching.

    Each item is a group of rows with the same prompt (`unpad_shared_prompts`), cut into consecutive
    pieces of at most ``max_tokens`` packed tokens (a piece repeats the prompt); its size is what the
    shared packing feeds the model: the first row's tokens, then one prompt token plus the response for
    each other row. Balancing these items keeps the samples of a prompt in one micro-batch.

    Args:
        input_ids / attention_mask: (bs, seqlen), prompts left-padded and responses right-padded.
        response_length: response columns at the end of each row.
        max_tokens: the micro-batch token budget.

    Returns:
        ``(items, tokens)``: row lists in order of first appearance and their packed sizes; None when the
        batch would be packed without sharing (see `unpad_shared_prompts`).
    """
    prompt_len = input_ids.shape[1] - response_length
    if not 0 < prompt_len < input_ids.shape[1] or not _can_share(attention_mask, prompt_len):
        return None
    row_tokens = attention_mask.sum(-1).tolist()
    branch_tokens = (attention_mask[:, prompt_len:].sum(-1) + 1).tolist()
    items: list[list[int]] = []
    tokens: list[int] = []
    for rows in _prompt_groups(input_ids, attention_mask, prompt_len):
        items.append([rows[0]])
        tokens.append(int(row_tokens[rows[0]]))
        for row in rows[1:]:
            if tokens[-1] + branch_tokens[row] > max_tokens:
                items.append([row])
                tokens.append(int(row_tokens[row]))
            else:
                items[-1].append(row)
                tokens[-1] += int(branch_tokens[row])
    return items, tokens


def unpad_shared_prompts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> PackedMicroBatch | None:
    """Pack a padded micro-batch into one row with each distinct prompt once (the ``n`` samples of a prompt).

    For each group of rows with the same prompt columns, the first row is packed whole (its *root*: prompt
    and response), and every other row as a *branch*: its last prompt token (which predicts the first
    response token) followed by its response tokens, at their own positions. The branch starts at position
    ``p = prompt tokens - 1 > 0``, which is how ``"rlflow_packed"`` attention knows it shares the root's
    first ``p`` tokens (`rlflow.models.attention`); every packed token then computes what it computes in
    its own sequence, and the prompt's forward and backward run once per group instead of once per row.

    The result is read like :func:`unpad_micro_batch`'s: ``labels`` are the next packed token (the first
    response token after a branch's prompt token), and :func:`gather_response_outputs` with its
    ``indices`` gives the same ``(bs, response_len)`` outputs. ``cu_seqlens`` / ``max_seqlen`` count each
    row's packed tokens in packing order.

    Args:
        input_ids: (bs, seqlen) token ids: prompts left-padded, responses right-padded.
        attention_mask: (bs, seqlen) 1 at valid tokens.
        position_ids: (bs, seqlen) positions, ``0, 1, 2, ...`` on the valid tokens of each row.
        response_length: response columns at the end of each row.

    Returns:
        The packed micro-batch, or None when no two rows share a prompt, a row's last prompt column is
        padding, or a prompt is a single token (nothing to share): pack it with :func:`unpad_micro_batch`.
    """
    batch, seqlen = input_ids.shape
    _check_mask(attention_mask, batch, seqlen)
    prompt_len = seqlen - response_length
    if not 0 < prompt_len < seqlen:
        raise ValueError(f"response_length must be in (0, seqlen={seqlen}), got {response_length}")
    if not _can_share(attention_mask, prompt_len):
        return None
    valid = attention_mask.bool()
    groups = _prompt_groups(input_ids, attention_mask, prompt_len)
    if len(groups) == batch:
        return None
    base = torch.arange(batch, device=input_ids.device)[:, None] * seqlen
    cols = torch.arange(seqlen, device=input_ids.device)[None, :].expand(batch, seqlen)
    branch = valid.clone()
    branch[:, : prompt_len - 1] = False  # a branch keeps its last prompt token and its response
    parts = []
    for rows in groups:
        parts.append(cols[rows[0]][valid[rows[0]]] + base[rows[0]])
        parts.extend(cols[r][branch[r]] + base[r] for r in rows[1:])
    indices = torch.cat(parts)
    seqlens = torch.tensor([len(p) for p in parts], dtype=torch.int32, device=input_ids.device)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    ids = input_ids.reshape(-1)[indices]
    pos = position_ids.reshape(-1)[indices]
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), seqlens.long())
    expected = pos[starts] + torch.arange(pos.shape[0], device=pos.device) - starts
    # a root starts at 0, a branch at its last prompt token's position: the prompt's length - 1
    prompt_tokens = valid[:, :prompt_len].sum(-1).tolist()
    firsts = [p for rows in groups for p in (0, *(prompt_tokens[r] - 1 for r in rows[1:]))]
    firsts_ok = pos[cu_seqlens[:-1].long()] == torch.tensor(firsts, device=pos.device)
    if bool((pos != expected).any()) or not bool(firsts_ok.all()):
        raise ValueError(
            "position_ids are not 0, 1, 2, ... on the valid tokens of every row (attention_mask == 1); "
            "packed attention would split or merge sequences"
        )
    return _packed(ids, pos, indices, cu_seqlens, int(seqlens.max()), batch, seqlen)


def gather_response_outputs(
    packed_outputs: torch.Tensor, indices: torch.Tensor, batch_size: int, seqlen: int, response_length: int
) -> torch.Tensor:
    """Scatter per-token outputs of a packed forward back to (bs, seqlen) and keep the response part.

    Convention (verl's): the output read for response token ``k`` sits at the position *before* it, i.e. the
    padded slice ``[:, -response_length - 1 : -1]``.

    * Actor log-prob / entropy: the logits at position ``t - 1`` predict token ``t``. With packed
      ``labels = roll(input_ids, -1)``, ``logprobs_from_logits(logits, labels)[j]`` is the log-prob of the
      token after ``j``; after padding, column ``k`` of the slice is ``log p(response[k] | prefix)``.
    * Critic values: ``values[:, -response_length - 1 : -1]``, i.e. the value of the state (prompt plus
      response tokens ``< k``) before response token ``k`` is generated.

    Padded response slots (``response_mask == 0``) hold 0 or, at the slot right after a sequence's last valid
    token, an output computed with a meaningless cross-sequence label: callers must mask with
    ``response_mask``.

    Args:
        packed_outputs: (total_tokens, ...) per-token outputs of the packed row (log-probs, entropy, values).
        indices: (total_tokens,) from :func:`unpad_input` / :class:`PackedMicroBatch`.
        batch_size: rows of the padded batch.
        seqlen: padded length (prompt + response).
        response_length: number of response columns at the end of the padded sequence.

    Returns:
        (batch_size, response_length, ...) outputs aligned with the response tokens.
    """
    if not 0 < response_length < seqlen:
        raise ValueError(f"response_length must be in (0, seqlen={seqlen}), got {response_length}")
    padded = pad_input(packed_outputs, indices, batch_size, seqlen)
    return padded[:, -response_length - 1 : -1]
