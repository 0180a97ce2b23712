"""One forward for the actor, the critic and the reward model: padded, remove-padding or Ulysses SP.

:func:`forward_micro_batch` runs a Hugging Face model on a padded micro-batch (prompts left-padded,
responses right-padded) and returns per-sample outputs aligned with the response tokens:

* ``output="log_probs"`` (causal LM, actor / reference): ``log_probs: (bs, response_len)`` with
  ``log_probs[i, k] = log softmax(logits[i, t - 1] / temperature)[responses[i, k]]`` where ``t`` is the
  position of response token ``k`` (the logits at position ``t - 1`` predict token ``t``); optionally
  ``entropy: (bs, response_len)`` of the same temperature-scaled distributions.
* ``output="values"`` (token-classification value model with one label, critic): ``values: (bs,
  response_len)``, verl's convention ``values[:, -response_len - 1 : -1]``: the value of the state before
  response token ``k`` is generated.
* ``output="scores"`` (token-classification reward model with one label): ``scores: (bs,)``, the model's
  output at the last valid token of each sequence.

Entries at padded response positions (``response_mask == 0``) are meaningless; callers mask them.

With ``use_remove_padding=True`` the micro-batch is packed into one row (``rlflow.models.padding``; not
for models with recurrent layers, `keeps_packed_sequences_apart`: their forwards stay padded) and the
outputs are scattered back to the padded layout; with an SP group of size > 1 the packed row is also padded
and sliced across the group (``rlflow.parallel.ulysses``), attention runs as Ulysses attention
(``rlflow.models.attention``, the model must use ``attn_implementation="rlflow_packed"``), and the per-token
outputs are all-gathered so every SP rank returns the full micro-batch. The loss computed from them is the
full-sequence loss on every SP rank; the gather's backward makes FSDP's gradient mean over ``dp * sp`` ranks
equal the gradient without SP (see ``rlflow.parallel.ulysses``). ``use_cache=False`` is always passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from rlflow.algos.moe import router_losses
from rlflow.models.attention import PACKED_ATTENTION, PACKED_ATTENTION_ALIASES  # registers "rlflow_packed"
from rlflow.models.fused_head import fused_head_of
from rlflow.models.mtp import depth_streams, predictor_of
from rlflow.models.padding import (
    gather_response_outputs,
    keeps_packed_sequences_apart,
    pad_input,
    unpad_micro_batch,
    unpad_shared_prompts,
)
from rlflow.models.router_replay import ROUTED_EXPERTS, RouterReplay, routing_to_tokens, tokens_to_routing
from rlflow.parallel.ulysses import (
    gather_outputs_and_unpad,
    get_ulysses_sequence_parallel_rank,
    get_ulysses_sequence_parallel_world_size,
    ulysses_group,
    ulysses_pad_and_slice_inputs,
)
from rlflow.utils.torch_functional import entropy_from_logits, logprobs_from_logits

__all__ = [
    "OUTPUT_KINDS",
    "PACKED_ATTN_IMPLEMENTATIONS",
    "MicroBatch",
    "forward_micro_batch",
    "last_valid_index",
    "reads_shared_prompts",
]

MicroBatch = Mapping[str, torch.Tensor] | TensorDictBase

OUTPUT_KINDS = ("log_probs", "values", "scores")
ROUTING_ACTIONS = (None, "record", "replay")
# attention implementations that keep packed sequences apart with use_cache=False and attention_mask=None
PACKED_ATTN_IMPLEMENTATIONS = (
    PACKED_ATTENTION,
    *PACKED_ATTENTION_ALIASES,
    "sdpa",
    "eager",
    "flash_attention_2",
    "flash_attention_3",
)
_ULYSSES_ATTN_IMPLEMENTATIONS = (PACKED_ATTENTION, *PACKED_ATTENTION_ALIASES)


def last_valid_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Column of the last 1 in each row of the mask.

    Args:
        attention_mask: (bs, seqlen) 0/1 mask with at least one 1 per row.

    Returns:
        (bs,) long indices.
    """
    seqlen = attention_mask.shape[-1]
    return seqlen - 1 - attention_mask.flip(-1).long().argmax(dim=-1)


def _token_head(outputs: Any, output: str) -> torch.Tensor:
    """Per-token model output: logits (..., s, vocab) for log-probs, (..., s) values / scores."""
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model returned {type(outputs).__name__}, with no tensor `logits`")
    if output == "log_probs":
        return logits
    if logits.dim() == 3:
        if logits.shape[-1] != 1:
            raise ValueError(
                f"output={output!r} needs a token-classification model with num_labels=1, got logits of shape "
                f"{tuple(logits.shape)}"
            )
        logits = logits.squeeze(-1)
    if logits.dim() != 2:
        raise ValueError(
            f"output={output!r} needs per-token outputs (bs, seqlen[, 1]), got {tuple(logits.shape)}"
        )
    return logits


def _check_inputs(micro_batch: MicroBatch, output: str, temperature: float) -> None:
    if output not in OUTPUT_KINDS:
        raise ValueError(f"output must be one of {OUTPUT_KINDS}, got {output!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    keys = ("input_ids", "attention_mask", "position_ids") + (("responses",) if output != "scores" else ())
    missing = [k for k in keys if k not in micro_batch.keys()]
    if missing:
        raise ValueError(f"micro_batch is missing {missing} (needs {list(keys)})")
    shape = tuple(micro_batch["input_ids"].shape)
    for key in ("attention_mask", "position_ids"):
        if tuple(micro_batch[key].shape) != shape:
            raise ValueError(
                f"micro_batch[{key!r}] has shape {tuple(micro_batch[key].shape)}, expected {shape}"
            )
    if output != "scores":
        responses = micro_batch["responses"]
        if responses.dim() != 2 or responses.shape[0] != shape[0] or not 0 < responses.shape[1] < shape[1]:
            raise ValueError(
                f"micro_batch['responses'] must be (bs, response_len < {shape[1]}), got {tuple(responses.shape)}"
            )


def _check_attn_implementation(module: torch.nn.Module, sp_size: int) -> None:
    impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if impl is None:
        return
    if sp_size > 1 and impl not in _ULYSSES_ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp_size} needs attn_implementation={PACKED_ATTENTION!r}, "
            f"the model uses {impl!r}"
        )
    if impl not in PACKED_ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"use_remove_padding=True needs one of {PACKED_ATTN_IMPLEMENTATIONS} attention, the model uses {impl!r}"
        )


def reads_shared_prompts(module: torch.nn.Module) -> bool:
    """Whether the model's attention keeps shared-prompt branches apart (`rlflow.models.attention`)."""
    impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
    return impl in _ULYSSES_ATTN_IMPLEMENTATIONS


def _fused_outputs(head: torch.Tensor, calculate_entropy: bool) -> dict[str, torch.Tensor]:
    """Split the fused head's ``(..., 2)`` output (`rlflow.models.fused_head`) into the named outputs."""
    result = {"log_probs": head[..., 0]}
    if calculate_entropy:
        result["entropy"] = head[..., 1]
    return result


def _router_kwargs(router_top_k: int | None) -> dict[str, Any]:
    return {"output_router_logits": True} if router_top_k is not None else {}


def _router_outputs(
    outputs: Any, router_top_k: int | None, attention_mask: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """``moe_aux_loss`` / ``moe_z_loss`` of the forward's router logits (`rlflow.algos.moe`), if asked;
    ``attention_mask`` (bs, seqlen) marks the valid tokens of a padded forward (None: all are)."""
    if router_top_k is None:
        return {}
    logits = getattr(outputs, "router_logits", None)
    if not logits:
        raise ValueError(
            "router losses need a mixture-of-experts model that returns router_logits with "
            "output_router_logits=True; this one returned none"
        )
    valid = None if attention_mask is None else attention_mask.reshape(-1).bool()
    aux, z = router_losses(list(logits), router_top_k, valid)
    return {"moe_aux_loss": aux, "moe_z_loss": z}


@contextlib.contextmanager
def _routing(
    module: torch.nn.Module, mb: MicroBatch, action: str | None, packed: Any, sliced: tuple | None = None
) -> Any:
    """Routing replay around one forward (`rlflow.models.router_replay`). ``"replay"``: the micro-batch's
    ``routed_experts`` in the forward's token order (packed, then this SP rank's slice), left set for the
    backward; ``"record"``: yields ``{"routed_experts": (bs, seqlen, layers, top_k)}``, filled when the
    forward returns. ``packed``: the packing (None: the padded forward); ``sliced``: ``(sp_group,
    sp_size, pad)`` under Ulysses SP."""
    if action is None:
        yield {}
        return
    if action not in ROUTING_ACTIONS:
        raise ValueError(f"routing must be one of {ROUTING_ACTIONS}, got {action!r}")
    replay = RouterReplay.of(module)
    bs, seqlen = mb["input_ids"].shape
    indices = None if packed is None else packed.indices
    if action == "replay":
        if ROUTED_EXPERTS not in mb.keys():
            raise ValueError(f"routing replay needs the batch's {ROUTED_EXPERTS!r} (recorded routing)")
        targets = routing_to_tokens(mb[ROUTED_EXPERTS], indices)
        if sliced is not None:  # this rank's slice; the SP padding (filled with 0 + -1 = -1) stays live
            group, sp_size, _ = sliced
            rank = get_ulysses_sequence_parallel_rank(group)
            targets = ulysses_pad_and_slice_inputs((targets + 1).unsqueeze(0), None, sp_size, rank)[0][0] - 1
        replay.replay(targets)
        yield {}
        return
    recorded: dict[str, torch.Tensor] = {}
    with replay.record():
        yield recorded
        tokens = replay.pop_forward()
    if sliced is not None:
        group, _, pad = sliced
        tokens = gather_outputs_and_unpad(
            tokens.int(), gather_dim=0, unpad_dim=0, padding_size=pad, group=group
        )
    mask = mb["attention_mask"] if packed is None else None
    recorded[ROUTED_EXPERTS] = tokens_to_routing(tokens, bs, seqlen, indices, mask)


@contextlib.contextmanager
def _mtp_request(
    module: torch.nn.Module, mb: MicroBatch, packed: Any, mtp: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """With ``mtp``, the model's MTP layers (`rlflow.models.mtp`) run in the forward inside this context on
    the micro-batch's depth streams (packed like the input when ``packed``); the yielded dict then holds
    ``mtp_loss_sums`` and ``mtp_counts``, each (D,)."""
    extra: dict[str, torch.Tensor] = {}
    predictor = predictor_of(module) if mtp else None
    if predictor is None:
        if mtp:
            raise ValueError(
                "an MTP loss was asked for but the model has no MTP layers (actor_rollout_ref.model.mtp)"
            )
        yield extra
        return
    response_len = mb["responses"].shape[1]
    streams = depth_streams(
        mb["input_ids"], mb["attention_mask"], mb["attention_mask"][:, -response_len:], predictor.spec.depths
    )
    if packed is not None:
        streams = tuple([x.reshape(-1)[packed.indices][None] for x in stream] for stream in streams)
    with predictor.request(*streams) as request:
        yield extra
        if request.loss_sums is None:
            raise RuntimeError("the model's forward did not reach its LM head: the MTP layers did not run")
        extra.update(mtp_loss_sums=request.loss_sums, mtp_counts=request.counts)


def _padded_forward(
    module: torch.nn.Module,
    mb: MicroBatch,
    output: str,
    temperature: float,
    calculate_entropy: bool,
    compiled: bool = False,
    router_top_k: int | None = None,
    routing: str | None = None,
    mtp: bool = False,
) -> dict[str, torch.Tensor]:
    """Forward on the padded (bs, seqlen) batch with its 2-D attention mask."""
    fused = fused_head_of(module) if output == "log_probs" else None
    request = contextlib.nullcontext()
    if fused is not None:
        response_len = mb["responses"].shape[1]
        labels = torch.zeros_like(mb["input_ids"])
        labels[:, -response_len - 1 : -1] = mb["responses"]
        request = fused.request(labels, temperature)
    with (
        request,
        _routing(module, mb, routing, None) as recorded,
        _mtp_request(module, mb, None, mtp) as extra,
    ):
        outputs = module(
            input_ids=mb["input_ids"],
            attention_mask=mb["attention_mask"],
            position_ids=mb["position_ids"],
            use_cache=False,
            **_router_kwargs(router_top_k),
        )
    router = {**_router_outputs(outputs, router_top_k, mb["attention_mask"]), **recorded, **extra}
    head = _token_head(outputs, output)
    if fused is not None:
        head = head[:, -response_len - 1 : -1]
        return {**_fused_outputs(head, calculate_entropy), **router}
    if output == "scores":
        rows = torch.arange(head.shape[0], device=head.device)
        return {"scores": head[rows, last_valid_index(mb["attention_mask"])].float()}
    response_len = mb["responses"].shape[1]
    head = head[:, -response_len - 1 : -1]
    if output == "values":
        return {"values": head.float(), **router}
    logits = head / temperature
    result = {"log_probs": logprobs_from_logits(logits, mb["responses"], compiled=compiled)}
    if calculate_entropy:
        result["entropy"] = entropy_from_logits(logits, compiled=compiled)
    return {**result, **router}


def _packed_token_outputs(
    module: torch.nn.Module,
    mb: MicroBatch,
    output: str,
    temperature: float,
    calculate_entropy: bool,
    sp_group: Any,
    compiled: bool = False,
    router_top_k: int | None = None,
    share_prompts: bool = False,
    routing: str | None = None,
    mtp: bool = False,
) -> tuple[dict[str, torch.Tensor], Any, dict[str, torch.Tensor]]:
    """Per-token outputs ``(total_tokens,)`` of the packed (and SP-sliced, then gathered) forward, and its
    router losses (when ``router_top_k`` is set; every packed token is a valid one). ``share_prompts``:
    rows with the same prompt are packed with the prompt once (`unpad_shared_prompts`) when the model's
    attention reads such rows (``"rlflow_packed"``); router losses are means over the packed tokens, so
    they keep the plain packing, as does routing replay."""
    packed = None
    plain = router_top_k is not None or routing is not None or output == "scores" or mtp
    if share_prompts and not plain and reads_shared_prompts(module):
        packed = unpad_shared_prompts(
            mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"].shape[1]
        )
    if packed is None:
        packed = unpad_micro_batch(mb["input_ids"], mb["attention_mask"], mb["position_ids"])
    sp_size = get_ulysses_sequence_parallel_world_size(sp_group)
    ids, pos, labels, pad = packed.input_ids, packed.position_ids, packed.labels, 0
    if sp_size > 1:
        sp_rank = get_ulysses_sequence_parallel_rank(sp_group)
        ids, pos, pad = ulysses_pad_and_slice_inputs(ids, pos, sp_size, sp_rank)
        labels, _, _ = ulysses_pad_and_slice_inputs(labels, None, sp_size, sp_rank)
    fused = fused_head_of(module) if output == "log_probs" else None
    request = fused.request(labels, temperature) if fused is not None else contextlib.nullcontext()
    sliced = (sp_group, sp_size, pad) if sp_size > 1 else None
    with (
        ulysses_group(sp_group if sp_size > 1 else None),
        request,
        _routing(module, mb, routing, packed, sliced) as recorded,
        _mtp_request(module, mb, packed, mtp) as extra,
    ):
        outputs = module(
            input_ids=ids,
            attention_mask=None,
            position_ids=pos,
            use_cache=False,
            **_router_kwargs(router_top_k),
        )
        head = _token_head(outputs, output)[0]
    router = {**_router_outputs(outputs, router_top_k, None), **recorded, **extra}
    if fused is not None:
        local = _fused_outputs(head, calculate_entropy)
    elif output == "log_probs":
        logits = head / temperature
        local = {"log_probs": logprobs_from_logits(logits, labels[0], compiled=compiled)}
        if calculate_entropy:
            local["entropy"] = entropy_from_logits(logits, compiled=compiled)
    else:
        local = {output: head.float()}
    gathered = {
        k: gather_outputs_and_unpad(v, gather_dim=0, unpad_dim=0, padding_size=pad, group=sp_group)
        for k, v in local.items()
    }
    return gathered, packed, router


def forward_micro_batch(
    module: torch.nn.Module,
    micro_batch: MicroBatch,
    *,
    output: str,
    use_remove_padding: bool = False,
    sp_group: Any = None,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    compiled: bool = False,
    router_top_k: int | None = None,
    share_prompts: bool = False,
    routing: str | None = None,
    mtp: bool = False,
) -> dict[str, torch.Tensor]:
    """Run ``module`` on one padded micro-batch and return response-aligned outputs.

    Args:
        module: a Hugging Face model (possibly FSDP-wrapped): a causal LM for ``"log_probs"``, a
            token-classification model with ``num_labels=1`` for ``"values"`` and ``"scores"``.
        micro_batch: dict or TensorDict with ``input_ids``, ``attention_mask``, ``position_ids``: (bs, seqlen)
            and ``responses``: (bs, response_len) (not needed for ``"scores"``). ``position_ids`` must be
            ``0, 1, 2, ...`` on the valid tokens of each row when ``use_remove_padding``.
        output: ``"log_probs"``, ``"values"`` or ``"scores"``.
        use_remove_padding: pack the valid tokens into one row (needs an attention implementation from
            :data:`PACKED_ATTN_IMPLEMENTATIONS`).
        sp_group: Ulysses SP process group (size > 1 needs ``use_remove_padding`` and ``"rlflow_packed"``);
            every rank of the group must pass the same micro-batch.
        temperature: the logits are divided by it before log-probs and entropy (``"log_probs"`` only).
        calculate_entropy: also return ``entropy`` (``"log_probs"`` only).
        compiled: log-probs and entropy from the logits through the ``torch.compile``d block kernels
            (`rlflow.utils.logit_blocks`; ``use_torch_compile``); the fused head has its own kernels.
        router_top_k: a mixture-of-experts model's experts per token: the forward also returns the router
            losses of its valid tokens (`rlflow.algos.moe.router_losses`); None = none. Not with SP > 1.
        share_prompts: with ``use_remove_padding``, rows that share their prompt (the ``n`` samples of a
            prompt) are packed with one copy of it (`rlflow.models.padding.unpad_shared_prompts`): the
            prompt's forward and backward run once per group. The same outputs (to float rounding); used
            with ``"rlflow_packed"`` attention for ``"log_probs"`` and ``"values"`` without router losses
            and without routing replay.
        routing: a mixture-of-experts model's routing replay (`rlflow.models.router_replay`):
            ``"record"`` returns the routers' choice as ``routed_experts`` ``(bs, seqlen, moe_layers,
            top_k)`` int16 (-1 off the valid tokens); ``"replay"`` routes through the micro-batch's
            ``routed_experts`` (kept set for the backward until the model's `RouterReplay` is stopped or
            given the next targets); None = live routing.
        mtp: also run the model's multi-token-prediction layers (`rlflow.models.mtp`) and return each
            depth's cross-entropy summed over the response tokens it predicts, ``mtp_loss_sums`` (D,),
            differentiable, and their number ``mtp_counts`` (D,). Not with SP > 1.

    Returns:
        ``{"log_probs": (bs, response_len)[, "entropy": (bs, response_len)]}``, ``{"values": (bs,
        response_len)}`` or ``{"scores": (bs,)}``; float32 or wider, differentiable; with
        ``router_top_k`` also the scalars ``moe_aux_loss`` and ``moe_z_loss``; with ``routing="record"``
        also ``routed_experts``.
    """
    _check_inputs(micro_batch, output, temperature)
    sp_size = get_ulysses_sequence_parallel_world_size(sp_group)
    if use_remove_padding and not keeps_packed_sequences_apart(getattr(module, "config", None)):
        if sp_size > 1:
            raise ValueError(
                f"ulysses_sequence_parallel_size={sp_size}: {type(module).__name__} has recurrent (Mamba / "
                "linear-attention) layers, whose state cannot be split along the sequence; use SP 1"
            )
        use_remove_padding = False  # a packed row would carry each sequence's state into the next
    if sp_size > 1 and not use_remove_padding:
        raise ValueError(f"ulysses_sequence_parallel_size={sp_size} > 1 needs use_remove_padding=True")
    if sp_size > 1 and mtp:
        raise ValueError(f"the MTP loss with ulysses_sequence_parallel_size={sp_size}: use SP 1")
    if sp_size > 1 and router_top_k is not None:
        raise ValueError(
            f"router losses with ulysses_sequence_parallel_size={sp_size}: each rank would see a slice of the "
            "router's tokens; use SP 1"
        )
    if not use_remove_padding:
        return _padded_forward(
            module, micro_batch, output, temperature, calculate_entropy, compiled, router_top_k, routing, mtp
        )
    _check_attn_implementation(module, sp_size)
    tokens, packed, router = _packed_token_outputs(
        module,
        micro_batch,
        output,
        temperature,
        calculate_entropy,
        sp_group,
        compiled,
        router_top_k,
        share_prompts,
        routing,
        mtp,
    )
    bs, seqlen = packed.batch_size, packed.seqlen
    if output == "scores":
        padded = pad_input(tokens["scores"], packed.indices, bs, seqlen)
        rows = torch.arange(bs, device=padded.device)
        return {"scores": padded[rows, last_valid_index(micro_batch["attention_mask"])]}
    response_len = micro_batch["responses"].shape[1]
    outputs = {
        k: gather_response_outputs(v, packed.indices, bs, seqlen, response_len) for k, v in tokens.items()
    }
    return {**outputs, **router}
