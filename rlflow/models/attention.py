"""Packed-sequence attention for remove-padding and Ulysses sequence parallelism.

Importing this module registers :data:`PACKED_ATTENTION` (``"rlflow_packed"``) in transformers'
``AttentionInterface`` and ``AttentionMaskInterface``. Build the model with
``attn_implementation="rlflow_packed"`` (or call :func:`set_packed_attention` before wrapping it with FSDP);
the same model then serves three kinds of forward:

* **Packed rows** (``attention_mask=None``, ``position_ids`` restarting at 0 per sequence, as produced by
  ``rlflow.models.padding.unpad_micro_batch``): the sequences are found from ``position_ids`` (a new
  sequence wherever the position does not grow by exactly 1, the rule transformers and flash-attn use) and
  attention stays inside each sequence. Exact with or without a cache.
* **Shared prompts** (``rlflow.models.padding.unpad_shared_prompts``): a sequence whose first position is
  ``p > 0`` is a *branch* of the latest sequence that started at 0 (its *root*): it attends to the root's
  first ``p`` tokens and then causally to itself, exactly as if those ``p`` tokens preceded it. The ``n``
  samples of a prompt are packed as one root (prompt and first response) and ``n - 1`` branches, so the
  prompt runs once. Causal attention only.
* **Ulysses SP** (an SP group set with ``rlflow.parallel.ulysses.ulysses_group``): each rank holds a slice of
  the packed row; q, k, v go through an all-to-all (gather sequence, scatter heads), every rank attends over
  the full sequence for ``heads / sp`` heads, and the inverse all-to-all brings back its own slice.
  DeepSpeed-Ulysses: Jacobs et al. 2023, arXiv:2309.14509.
* **Padded batches** (a 2-D ``attention_mask`` with zeros) and cached decoding: the registered mask function
  builds transformers' usual SDPA mask and the call is forwarded to transformers' ``sdpa`` attention.

Kernels. transformers 5.20 already detects packing for ``"sdpa"`` when ``use_cache=False``, but that path
materialises a dense ``(s, s)`` block-diagonal mask, i.e. ``O(total_tokens**2)`` work over the whole packed
row, and cannot see the full row under Ulysses. Here the CPU/CUDA path runs one causal SDPA call per
sequence (``O(sum len_i**2)``). On CUDA with fp16/bf16 and flash-attn installed (the optional ``gpu`` extra),
``flash_attn_varlen_func`` with ``cu_seqlens`` is used instead. flex_attention has no CPU backward and
``torch.nn.attention.varlen`` no CPU kernel (torch 2.13).
"""

from __future__ import annotations

import importlib.util
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlflow.models.cpu_attention import onednn_attention_applies, packed_onednn_attention
from rlflow.parallel.ulysses import (
    gather_heads_scatter_seq,
    gather_outputs_and_unpad,
    gather_seq_scatter_heads,
    get_ulysses_sequence_parallel_group,
    get_ulysses_sequence_parallel_world_size,
)

__all__ = [
    "GENERATION_ATTENTION",
    "PACKED_ATTENTION",
    "PACKED_ATTENTION_ALIASES",
    "check_ulysses_heads",
    "cu_seqlens_from_position_ids",
    "generation_attention_forward",
    "packed_attention_forward",
    "packed_sequence_lengths",
    "packed_sequences",
    "register_packed_attention",
    "set_packed_attention",
]

PACKED_ATTENTION = "rlflow_packed"
# transformers' SDPA attention for KV-cached decoding, without per-step copies of the cache (GQA)
GENERATION_ATTENTION = "rlflow_generate"
# the same function under the name an earlier draft used (rlflow.models.loader accepts it)
PACKED_ATTENTION_ALIASES = ("ulysses_sdpa",)
_HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


def packed_sequences(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """The sequences packed in each row (a new one wherever the position step is not 1).

    Args:
        position_ids: (b, s) packed positions, ``0, 1, ...`` for each sequence (a branch of a shared prompt
            starts at its prefix length instead, see the module docstring).

    Returns:
        For each of the ``b`` rows, ``(length, first position)`` of its sequences in order (the lengths sum
        to ``s``).
    """
    starts = torch.diff(position_ids, dim=-1, prepend=position_ids[..., :1] - 1) != 1
    starts[..., 0] = True
    s = position_ids.shape[-1]
    out = []
    for row, pos in zip(starts.cpu(), position_ids.cpu()):
        idx = torch.nonzero(row).flatten().tolist()
        firsts = pos[idx].tolist()
        out.append([(b - a, f) for (a, b), f in zip(itertools.pairwise([*idx, s]), firsts)])
    return out


def packed_sequence_lengths(position_ids: torch.Tensor) -> list[list[int]]:
    """Lengths of the sequences packed in each row (a new one wherever the position step is not 1).

    Args:
        position_ids: (b, s) packed positions, ``0, 1, ...`` for each sequence.

    Returns:
        For each of the ``b`` rows, the lengths of its sequences in order (they sum to ``s``).
    """
    return [[length for length, _ in row] for row in packed_sequences(position_ids)]


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cumulative sequence lengths of one packed row, for varlen kernels.

    Args:
        position_ids: (1, s) packed positions.

    Returns:
        cu_seqlens: (n_seqs + 1,) int32 on the device of ``position_ids``, from 0 to ``s``.
        max_seqlen: the longest sequence.
    """
    lengths = packed_sequence_lengths(position_ids[:1])[0]
    cu = torch.tensor([0, *lengths], dtype=torch.int32, device=position_ids.device).cumsum(
        0, dtype=torch.int32
    )
    return cu, max(lengths)


def check_ulysses_heads(num_attention_heads: int, num_key_value_heads: int, sp_size: int) -> None:
    """Raise ValueError unless the heads can be split over ``sp_size`` Ulysses ranks.

    Args:
        num_attention_heads: query heads; must be divisible by ``sp_size``.
        num_key_value_heads: key/value heads; must be divisible by ``sp_size`` or divide it (then each kv
            head is repeated ``sp_size / num_key_value_heads`` times before the all-to-all).
        sp_size: ``ulysses_sequence_parallel_size``.
    """
    if sp_size < 1:
        raise ValueError(f"ulysses_sequence_parallel_size must be >= 1, got {sp_size}")
    if num_attention_heads % sp_size != 0:
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp_size} must divide num_attention_heads={num_attention_heads}"
        )
    if num_key_value_heads % sp_size != 0 and sp_size % num_key_value_heads != 0:
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp_size} must divide num_key_value_heads={num_key_value_heads} "
            f"or be a multiple of it"
        )


@dataclass
class _PackedLayout:
    """Sequence lengths of the full packed rows, shared by all layers of one forward."""

    key: weakref.ref
    group: Any
    position_ids: torch.Tensor
    sequences: list[list[tuple[int, int]]]
    cu_seqlens: dict[str, Any] = field(default_factory=dict)
    branch_masks: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict)
    # derived once per forward, read by every layer
    lengths: list[list[int]] = field(init=False)
    has_branches: bool = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = [[length for length, _ in row] for row in self.sequences]
        self.has_branches = any(first > 0 for row in self.sequences for _, first in row)


_LAYOUT: _PackedLayout | None = None


def _packed_layout(position_ids: torch.Tensor, group: Any) -> _PackedLayout:
    """Layout of the full rows (position_ids all-gathered over the SP group), computed once per forward.

    Every decoder layer receives the same local ``position_ids`` tensor object (also when gradient
    checkpointing recomputes a layer), so the layout is reused while that object is alive (weak reference).
    """
    global _LAYOUT
    if _LAYOUT is None or _LAYOUT.key() is not position_ids or _LAYOUT.group is not group:
        with torch.no_grad():
            full = gather_outputs_and_unpad(position_ids, gather_dim=-1, group=group)
        _LAYOUT = _PackedLayout(weakref.ref(position_ids), group, full, packed_sequences(full))
    return _LAYOUT


def _flash_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: _PackedLayout, **kw: Any
) -> torch.Tensor:
    """flash-attn varlen on one packed row: q (1, h, s, d), k/v (1, h_kv, s, d) -> (1, h, s, d)."""
    from flash_attn import flash_attn_varlen_func

    if "cu" not in layout.cu_seqlens:
        layout.cu_seqlens["cu"] = cu_seqlens_from_position_ids(layout.position_ids)
    cu, max_len = layout.cu_seqlens["cu"]
    q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
    out = flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, **kw)
    return out.transpose(0, 1)[None]


def _per_sequence_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: _PackedLayout,
    dropout: float,
    scaling: Any,
    causal: bool,
) -> torch.Tensor:
    """One SDPA call per packed sequence: q (b, h, s, d), k/v (b, h_kv, s, d) -> (b, h, s, d)."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    rows = []
    for b, lengths in enumerate(layout.lengths):
        parts = zip(*(t[b : b + 1].split(lengths, dim=2) for t in (q, k, v)))
        outs = [
            F.scaled_dot_product_attention(qi, ki, vi, dropout_p=dropout, is_causal=causal, scale=scaling)
            for qi, ki, vi in parts
        ]
        rows.append(torch.cat(outs, dim=2))
    return torch.cat(rows, dim=0)


def _branch_mask(branches: list[tuple[int, int]], prefix: int, device: torch.device) -> torch.Tensor:
    """Boolean mask (tokens of the branches, prefix + tokens of the branches) for branches of one root:
    a token of branch ``j`` (length ``l_j``, prefix ``p_j``) sees the root's first ``p_j`` keys and the
    tokens of branch ``j`` up to itself."""
    lengths = torch.tensor([length for length, _ in branches], device=device)
    prefixes = torch.tensor([first for _, first in branches], device=device)
    seg = torch.repeat_interleave(torch.arange(len(branches), device=device), lengths)
    idx = torch.arange(seg.shape[0], device=device)
    sees_prefix = torch.arange(prefix, device=device)[None, :] < prefixes[seg][:, None]
    sees_branch = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
    return torch.cat([sees_prefix, sees_branch], dim=1)


def _root_groups(sequences: list[tuple[int, int]], row: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """``(root length, its branches)`` for the sequences of one packed row, checked."""
    groups: list[tuple[int, list[tuple[int, int]]]] = []
    for length, first in sequences:
        if first == 0:
            groups.append((length, []))
        elif not groups:
            raise ValueError(
                f"packed row {row}: a sequence starting at position {first} follows no sequence that starts "
                "at 0 (shared-prompt branches need their root before them)"
            )
        elif first > groups[-1][0]:
            raise ValueError(
                f"packed row {row}: a branch shares {first} prompt tokens of a {groups[-1][0]}-token sequence"
            )
        else:
            groups[-1][1].append((length, first))
    return groups


def _shared_prefix_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: _PackedLayout,
    dropout: float,
    scaling: Any,
) -> torch.Tensor:
    """Causal attention over packed rows holding roots and their branches (see the module docstring):
    per root, one causal SDPA call over the root and one masked call over all its branches (their
    queries against the root's shared prefix and their own keys). q (b, h, s, d), k/v (b, h, s, d).

    Each row is cut with one ``split`` (its backward is one concatenation, where a slice per sequence
    would scatter into a zero tensor of the whole row each)."""
    rows = []
    for b, sequences in enumerate(layout.sequences):
        groups = _root_groups(sequences, b)
        spans = [n for root, branches in groups for n in (root, sum(length for length, _ in branches))]
        chunks = list(zip(*(t[b : b + 1].split(spans, dim=2) for t in (q, k, v))))
        outs = []
        for g, (_, branches) in enumerate(groups):
            (qr, kr, vr), (qb, kb, vb) = chunks[2 * g], chunks[2 * g + 1]
            outs.append(
                F.scaled_dot_product_attention(qr, kr, vr, dropout_p=dropout, is_causal=True, scale=scaling)
            )
            if not branches:
                continue
            prefix = max(first for _, first in branches)
            key = (b, g, str(q.device))
            if key not in layout.branch_masks:
                layout.branch_masks[key] = _branch_mask(branches, prefix, q.device)
            kb, vb = torch.cat([kr[:, :, :prefix], kb], dim=2), torch.cat([vr[:, :, :prefix], vb], dim=2)
            outs.append(
                F.scaled_dot_product_attention(
                    qb, kb, vb, attn_mask=layout.branch_masks[key], dropout_p=dropout, scale=scaling
                )
            )
        rows.append(torch.cat(outs, dim=2))
    return torch.cat(rows, dim=0)


def _packed_attention(
    module: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: _PackedLayout,
    dropout: float,
    scaling: Any,
    causal: bool,
) -> torch.Tensor:
    """Attention inside each full packed sequence: q (b, h, s, d), k/v (b, h_kv, s, d) -> (b, h, s, d)."""
    if layout.has_branches:
        if not causal:
            raise ValueError(
                "shared-prompt packing (sequences that branch off a prompt) needs causal attention"
            )
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return _shared_prefix_sdpa(q, k, v, layout, dropout, scaling)
    if _HAS_FLASH_ATTN and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[0] == 1:
        return _flash_varlen(q, k, v, layout, dropout_p=dropout, softmax_scale=scaling, causal=causal)
    if onednn_attention_applies(module, q, k, dropout, layout.lengths):
        return packed_onednn_attention(q, k, v, layout.lengths, scaling, causal)
    return _per_sequence_sdpa(q, k, v, layout, dropout, scaling, causal)


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function for packed rows, sequence-parallel over the Ulysses group.

    Args:
        module: the attention module (its ``is_causal`` is the default for ``is_causal``).
        query: (b, heads, s_local, d).
        key: (b, kv_heads, s_kv, d).
        value: (b, kv_heads, s_kv, d).
        attention_mask: None for packed rows; a 4-D mask (padded batch or cached decoding) sends the call
            to transformers' SDPA attention (only without SP).
        dropout: attention dropout probability.
        scaling: softmax scale (default ``d ** -0.5``).
        is_causal: causal attention inside each sequence.
        sliding_window: must be None on the packed path (not supported).
        **kwargs: must hold ``position_ids`` (b, s_local), this rank's slice of the packed positions.

    Returns:
        (b, s_local, heads, d) attention output and None (no attention weights).
    """
    group = get_ulysses_sequence_parallel_group()
    sp_size = get_ulysses_sequence_parallel_world_size(group)
    if attention_mask is not None or key.shape[2] != query.shape[2]:
        if sp_size > 1:
            raise ValueError(
                f"{PACKED_ATTENTION}: ulysses_sequence_parallel_size={sp_size} needs packed inputs "
                f"(use_remove_padding=True, attention_mask=None, no cache)"
            )
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError(f"{PACKED_ATTENTION} needs position_ids to find the packed sequences")
    if position_ids.shape[0] == 1 and query.shape[0] > 1:
        # a (b, s) batch called without positions: transformers passes one row for all; every row is then
        # one sequence of its own
        position_ids = position_ids.expand(query.shape[0], -1)
    if sliding_window is not None:
        raise ValueError(f"{PACKED_ATTENTION} does not support sliding_window={sliding_window}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if sp_size > 1:
        check_ulysses_heads(query.shape[1], key.shape[1], sp_size)
        if key.shape[1] < sp_size:
            key = key.repeat_interleave(sp_size // key.shape[1], dim=1)
            value = value.repeat_interleave(sp_size // value.shape[1], dim=1)
        query, key, value = (
            gather_seq_scatter_heads(t, seq_dim=2, head_dim=1, group=group) for t in (query, key, value)
        )
    layout = _packed_layout(position_ids, group)
    out = _packed_attention(module, query, key, value, layout, dropout, scaling, causal)
    out = gather_heads_scatter_seq(out, head_dim=1, seq_dim=2, group=group)
    return out.transpose(1, 2).contiguous(), None


def generation_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention for KV-cached decoding, without copying the cache per query head.

    With grouped-query attention transformers' ``sdpa`` repeats every cached key/value head
    ``heads / kv_heads`` times before each call whenever there is a mask (always, with left-padded
    prompts), copying the whole cache on every decoding step of every layer. Here a decoding step (one
    query token) folds the query heads that share a KV head into the query axis, ``(b, h, 1, d) ->
    (b, kv_heads, h / kv_heads, d)``: they see the same keys and the same mask row, so one SDPA call over
    the un-repeated cache gives the same outputs (with or without a mask). A prefill with a mask uses SDPA's
    ``enable_gqa`` on the CPU (on CUDA that combination runs the math kernel, so transformers' repeat is
    kept there). Everything else (no GQA, a causal prefill without a mask, position biases, paged caches,
    per-head masks) is transformers' own ``sdpa`` attention.

    Args:
        module: the attention module.
        query: (b, heads, q_len, d).
        key / value: (b, kv_heads, kv_len, d).
        attention_mask: transformers' 4-D SDPA mask (b, 1, q_len, kv_len) or None.
        dropout / scaling / is_causal: as for ``sdpa``.

    Returns:
        (b, q_len, heads, d) attention output and None.
    """
    b, heads, q_len, d = query.shape
    kv_heads = key.shape[1]
    per_row_mask = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1] == 1)
    plain = (
        heads == kv_heads
        or heads % kv_heads
        or not per_row_mask
        or (attention_mask is None and q_len > 1)  # a causal prefill: transformers' own call
        # CUDA SDPA with enable_gqa and a mask is the math kernel
        or (q_len > 1 and query.device.type != "cpu")
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or key.shape[-1] != value.shape[-1]
    )
    if plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    mask = None if attention_mask is None else attention_mask[:, :, :, : key.shape[2]]
    if q_len == 1:
        # also without a mask (no left padding): SDPA's enable_gqa path for one query token is ~5x slower
        # than the folded call on the CPU in bf16 (docs/benchmarks.md)
        folded = query.reshape(b, kv_heads, heads // kv_heads, d)
        out = F.scaled_dot_product_attention(
            folded, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
        )
        out = out.reshape(b, heads, 1, d)
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
    return out.transpose(1, 2).contiguous(), None


def _packed_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """Mask interface: no mask for packed full-sequence forwards, transformers' SDPA mask otherwise."""
    if kwargs.get("attention_mask") is None and kwargs.get("q_length") == kwargs.get("kv_length"):
        return None
    return sdpa_mask(*args, **kwargs)


def register_packed_attention() -> str:
    """Register the packed attention and its mask function as ``"rlflow_packed"`` and aliases, and the
    decoding attention as ``"rlflow_generate"`` with transformers' SDPA mask (idempotent).

    Returns:
        The registered name, :data:`PACKED_ATTENTION`.
    """
    for name in (PACKED_ATTENTION, *PACKED_ATTENTION_ALIASES):
        AttentionInterface.register(name, packed_attention_forward)
        AttentionMaskInterface.register(name, _packed_mask)
    AttentionInterface.register(GENERATION_ATTENTION, generation_attention_forward)
    AttentionMaskInterface.register(GENERATION_ATTENTION, sdpa_mask)
    return PACKED_ATTENTION


def set_packed_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a Hugging Face model to ``"rlflow_packed"`` attention (call before FSDP wrapping).

    Args:
        model: a ``PreTrainedModel``.

    Returns:
        The same model.
    """
    register_packed_attention()
    model.set_attn_implementation(PACKED_ATTENTION)
    return model


register_packed_attention()
