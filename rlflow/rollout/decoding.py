"""The embedded engine's decoding loop (`decode`): one prefill over the left-padded prompts, then one forward
per new token over a KV cache allocated once, sampling with counter-based keys (`rlflow.rollout.sampling`).
`rlflow.rollout.hf.HFRollout` runs it per micro-batch; the module docstring there says how a call runs."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlflow.models.router_replay import RouterReplay
from rlflow.rollout.base import SamplingParams
from rlflow.rollout.fast_decode import FastDecoder, fast_decoder_for
from rlflow.rollout.kv_cache import PreallocatedCache, supports_preallocated_cache
from rlflow.rollout.sampling import sample_next_token

__all__ = ["DecodeRouting", "decode"]


def _trim_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the padding columns that every row of a left-padded batch shares."""
    leading = (attention_mask.cumsum(dim=-1) == 0).sum(dim=-1)
    if bool((leading == attention_mask.shape[-1]).any()):
        row = int((leading == attention_mask.shape[-1]).nonzero()[0])
        raise ValueError(
            f"prompt row {row} has an all-zero attention_mask (an empty prompt cannot be continued)"
        )
    start = int(leading.min())
    return input_ids[:, start:], attention_mask[:, start:], position_ids[..., start:]


def _drop_finished_rows(finished: torch.Tensor, cache: Any, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Keep only unfinished rows: of the KV cache (in place) and of each tensor (returned, same order)."""
    keep = (~finished).nonzero().squeeze(-1)
    layers = getattr(cache, "layers", None) or []
    if any(not hasattr(layer, "batch_select_indices") for layer in layers):
        # recurrent (Mamba / linear-attention) state layers select rows through their beam-search reorder
        for layer in layers:
            select = getattr(layer, "batch_select_indices", None) or layer.reorder_cache
            select(keep)
    else:
        cache.batch_select_indices(keep)
    return [t[keep] for t in tensors]


@dataclasses.dataclass
class DecodeRouting:
    """A mixture-of-experts model's routing, recorded while `decode` runs (``rollout.enable_rollout_routing_replay``).

    Attributes:
        replay: the decoding model's `RouterReplay`.
        routed: set by `decode`: ``(rows * repeats, prompt_len + response_length, moe_layers, top_k)`` int16,
            the experts each prompt and fed response token went through, -1 elsewhere (padding, tokens after
            a row's EOS, the last sampled token, which no step fed back).
    """

    replay: RouterReplay
    routed: torch.Tensor | None = None


@torch.no_grad()
def decode(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    params: SamplingParams,
    keys: torch.Tensor,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    repeats: int = 1,
    fast: bool | FastDecoder = True,
    entropy: bool = False,
    routing: DecodeRouting | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Generate up to ``params.response_length`` tokens for one micro-batch with the KV cache (allocated
    once, `rlflow.rollout.kv_cache.PreallocatedCache`, for full-attention decoders).

    With ``repeats > 1`` each prompt row stands for ``repeats`` consecutive output rows (``n`` samples per
    prompt, as ``DataProto.repeat(n, interleave=True)`` lays them out). The prompt is then run through the
    model once and its KV cache and last logits are repeated, instead of prefilling ``repeats`` identical
    copies: the prefill costs ``1 / repeats`` of its FLOPs (the samples draw with their own ``keys`` from the
    first token on). A cache that cannot be repeated in place (not a `PreallocatedCache`) gets repeated
    prompts, i.e. the plain path.

    A row that produces an EOS leaves the batch (its KV-cache rows are dropped), so later steps cost
    only what the unfinished rows need; its remaining tokens are the pad id. Decoding stops when every
    row has finished or after ``response_length`` tokens. ``params.ignore_eos``: no row finishes early;
    ``params.min_tokens``: the EOS ids are not sampled before that many tokens.

    Args:
        model: an HF causal LM (unsharded) on the device of the inputs.
        input_ids: ``(rows, prompt_len)`` left-padded prompt ids.
        attention_mask: ``(rows, prompt_len)`` 1 on prompt tokens.
        position_ids: ``(rows, prompt_len)`` positions (0 at each row's first real token).
        params: sampling parameters.
        keys: ``(rows * repeats,)`` sampling keys of the output rows.
        eos_token_ids: ids that end a response (may be empty: always full length).
        pad_token_id: id written after a row's EOS.
        repeats: output rows per prompt row (consecutive).
        fast: the decoding steps after the prefill run through a `FastDecoder` (this one, or one built for
            the call when True and the architecture has one); False = transformers' forward every step.
        entropy: also return the entropy of each step's full distribution at the log-prob temperature
            (what the trainer's ``compute_log_prob`` reports as ``actor/entropy``).
        routing: record the routers' choice of every forward into ``routing.routed`` (a mixture-of-experts
            model; the steps then run through transformers' forward).

    Returns:
        ``responses``: ``(rows * repeats, steps)`` int64, ``log_probs``: ``(rows * repeats, steps)``
        float32 (0 after EOS), with ``steps <= params.response_length`` the number of decoding steps run,
        and the entropies (same shape and zeros; None unless ``entropy``).
    """
    if repeats < 1:
        raise ValueError(f"decode: repeats={repeats} must be >= 1")
    record = routing.replay.record() if routing is not None else contextlib.nullcontext()
    if routing is not None:
        fast = False  # the steps go through transformers' forward, whose routers record
    with record:
        width = input_ids.shape[1]
        input_ids, attention_mask, position_ids = _trim_left_padding(input_ids, attention_mask, position_ids)
        offset = width - input_ids.shape[1]  # the left-padding columns every row shared
        config = getattr(model, "config", None)
        shared_prefill = config is not None and supports_preallocated_cache(config)
        if repeats > 1 and not shared_prefill:
            input_ids, attention_mask, position_ids = (
                t.repeat_interleave(repeats, dim=0) for t in (input_ids, attention_mask, position_ids)
            )
            repeats = 1
        rows, length, device = input_ids.shape[0] * repeats, params.response_length, input_ids.device
        if keys.shape[0] != rows:
            raise ValueError(f"decode: {keys.shape[0]} sampling keys for {rows} output rows")
        responses = torch.full((rows, length), pad_token_id, dtype=torch.int64, device=device)
        log_probs = torch.zeros((rows, length), dtype=torch.float32, device=device)
        entropies = torch.zeros((rows, length), dtype=torch.float32, device=device) if entropy else None
        eos = torch.tensor(list(eos_token_ids), dtype=torch.int64, device=device)
        stop = eos[:0] if params.ignore_eos else eos
        active = torch.arange(rows, device=device)  # original row of each row still decoding
        cache = (
            PreallocatedCache(
                config.get_text_config(decoder=True).num_hidden_layers, input_ids.shape[1] + length
            )
            if shared_prefill
            else None
        )
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, position, logits = out.past_key_values, position_ids[..., -1:], out.logits[:, -1, :]
        if routing is not None:
            prompt = routing.replay.pop_forward().view(*input_ids.shape, routing.replay.num_layers, -1)
            prompt[~attention_mask.bool()] = -1
            routed = torch.full(
                (rows, width + length, *prompt.shape[2:]), -1, dtype=torch.int16, device=device
            )
            routed[:, offset:width] = prompt.repeat_interleave(repeats, dim=0) if repeats > 1 else prompt
            routing.routed = routed
        if fast is True:
            fast = fast_decoder_for(model) if isinstance(cache, PreallocatedCache) else None
        fast_step = (
            fast.step if isinstance(fast, FastDecoder) and isinstance(cache, PreallocatedCache) else None
        )
        if repeats > 1:
            cache.batch_repeat_interleave(repeats)
            logits, attention_mask, position = (
                t.repeat_interleave(repeats, dim=0) for t in (logits, attention_mask, position)
            )
        for t in range(length):
            banned = eos if t < params.min_tokens else None
            token, log_prob, token_entropy = sample_next_token(
                logits.float(), params, keys, t, banned, entropy
            )
            responses[active, t] = token
            log_probs[active, t] = log_prob
            if entropies is not None:
                entropies[active, t] = token_entropy
            finished = torch.isin(token, stop)
            if t + 1 == length or bool(finished.all()):
                return (
                    responses[:, : t + 1],
                    log_probs[:, : t + 1],
                    None if entropies is None else entropies[:, : t + 1],
                )
            if bool(finished.any()):
                active, token, keys, attention_mask, position = _drop_finished_rows(
                    finished, cache, active, token, keys, attention_mask, position
                )
            attention_mask = torch.cat(
                [attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=-1
            )
            position = position + 1
            if fast_step is not None:
                logits = fast_step(token, position, attention_mask, cache)
                continue
            out = model(
                input_ids=token.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]
            if routing is not None:  # the experts of response token t, fed at column width + t
                routing.routed[active, width + t] = routing.replay.pop_forward()
        # only reached when response_length == 0 (rejected by the config)
        return responses, log_probs, entropies
