"""Routing replay for Hugging Face mixture-of-experts models (verl's ``actor.router_replay.mode`` R2 / R3).

A MoE router picks each token's ``top_k`` experts from its scores. Two forwards with the same weights can
pick differently when their float rounding differs (the rollout's cached decoding against the trainer's
packed forward) and, during an update, one optimizer step can move a near tie. Routing replay records the
choice of one forward and makes later forwards use it: only the discrete choice is replayed; the gating
weights are the live router's scores at the replayed experts, so the router still gets gradients.

* **R2** (verl's "vanilla routing replay"): the old-log-prob pass records the choice, the update's
  forwards replay it, so ``pi_theta / pi_old`` compares the same experts.
* **R3** ("rollout routing replay"): the rollout records the choice while it samples, the old-log-prob
  pass and the update replay it, so the trainer scores each token through the experts that generated it.

The routing travels in the batch as :data:`ROUTED_EXPERTS`: ``(bs, seqlen, moe_layers, top_k)`` int16
expert ids aligned with ``input_ids``; ``-1`` marks a token with nothing recorded (padding, the last
sampled token, which no forward read), whose routing stays live.

How it hooks in: :func:`moe_routers` finds the router modules through the model's own
``_can_record_outputs["router_logits"]`` class (every transformers MoE architecture declares it), and
:class:`RouterReplay` wraps each router's ``forward``. While recording or replaying, a
``TorchFunctionMode`` inside the router intercepts its ``torch.topk`` over the experts: recording keeps
the live indices, replaying returns the recorded ones and the scores gathered at them (whatever the
router then does with them -- renormalise, scale, softmax -- runs unchanged). Routers that pick with
more than one top-k over their experts are refused when first run.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rlflow.models.mtp import is_mtp_name

__all__ = [
    "REPLAY_MODES",
    "ROUTED_EXPERTS",
    "RouterReplay",
    "moe_routers",
    "place_prompt_routing",
    "routing_to_tokens",
    "tokens_to_routing",
]

ROUTED_EXPERTS = "routed_experts"
"""Batch key of the recorded routing: ``(bs, seqlen, moe_layers, top_k)`` int16, -1 = not recorded."""

REPLAY_MODES = ("disabled", "R2", "R3")

_NOT_RECORDED = -1
_TOPK = (torch.topk, torch.Tensor.topk)


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE router modules in forward order (empty for a dense model).

    A router is a module of the class the model records its ``router_logits`` from
    (``_can_record_outputs``); it must expose ``top_k`` and its number of experts. The routers of the
    multi-token-prediction layers (`rlflow.models.mtp`) are not among them: the rollout runs without those
    layers, so their routing is always live.
    """
    classes: set[type] = set()
    for module in model.modules():
        recorder = (getattr(type(module), "_can_record_outputs", None) or {}).get("router_logits")
        target = getattr(recorder, "target_class", recorder)
        if isinstance(target, type):
            classes.add(target)
    if not classes:
        return []
    return [m for n, m in model.named_modules() if isinstance(m, tuple(classes)) and not is_mtp_name(n)]


def _num_experts(router: nn.Module) -> int:
    for name in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = getattr(router, name, None)
        if isinstance(value, int):
            return value
    weight = getattr(router, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    raise ValueError(f"router replay: cannot tell the number of experts of {type(router).__name__}")


class _TopKChoice(TorchFunctionMode):
    """Inside one router call: record or replace the ``topk`` over its ``num_experts`` scores."""

    def __init__(self, replay: RouterReplay, layer: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.replay, self.layer, self.num_experts, self.top_k = replay, layer, num_experts, top_k
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _TOPK:
            return func(*args, **kwargs)
        scores = args[0]
        k = args[1] if len(args) > 1 else kwargs.get("k")
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        if scores.shape[-1] != self.num_experts or k != self.top_k or dim not in (-1, scores.dim() - 1):
            return func(*args, **kwargs)
        self.calls += 1
        if self.calls > 1:
            raise ValueError(
                f"router replay: {self.replay.router_names[self.layer]} takes more than one top-{k} over its "
                f"{self.num_experts} experts per call; routing replay supports routers that choose once"
            )
        live = func(*args, **kwargs)
        return self.replay._choose(self.layer, scores, live)


class RouterReplay:
    """Records or replays the expert choice of every MoE router of one model.

    Build it once per model (:meth:`of` returns the one already installed). ``record()`` collects each
    router call's choice until :meth:`pop_forward` takes them; ``replay(targets)`` makes every router
    use ``targets`` until the next ``replay`` or ``stop`` -- it stays set through the backward, so
    gradient checkpointing's recomputation picks the same experts.

    Args:
        model: a Hugging Face MoE model (plain, FSDP-wrapped, or with adapters).

    Raises:
        ValueError: the model has no MoE router.
    """

    def __init__(self, model: nn.Module) -> None:
        routers = moe_routers(model)
        if not routers:
            raise ValueError(
                f"router replay needs a mixture-of-experts model; {type(model).__name__} has no router module "
                "(no router_logits in its _can_record_outputs)"
            )
        self.router_names = [type(r).__name__ + f"[{i}]" for i, r in enumerate(routers)]
        self.top_k = int(routers[0].top_k)
        self.num_experts = _num_experts(routers[0])
        for i, router in enumerate(routers):
            if int(router.top_k) != self.top_k:
                raise ValueError(f"router replay: routers choose {router.top_k} and {self.top_k} experts")
            router.forward = functools.partial(_routed_forward, self, i, _num_experts(router), router.forward)
            router._rlflow_router_replay = self
        self.num_layers = len(routers)
        self.mode: str | None = None
        self._records: list[list[torch.Tensor]] = [[] for _ in routers]
        self._targets: torch.Tensor | None = None
        self._counted: list[bool] = [False] * self.num_layers
        self._mismatch: list[torch.Tensor] = []  # per replayed call: (mismatched, replayed) token counts

    @classmethod
    def of(cls, model: nn.Module) -> RouterReplay:
        """The model's controller, installing one on first use."""
        for module in moe_routers(model)[:1]:
            existing = getattr(module, "_rlflow_router_replay", None)
            if existing is not None:
                return existing
        return cls(model)

    # ---- recording ---------------------------------------------------------------------------------------

    @contextmanager
    def record(self) -> Iterator[RouterReplay]:
        """Collect every router call's choice (take them with :meth:`pop_forward`)."""
        self.mode, self._records = "record", [[] for _ in range(self.num_layers)]
        try:
            yield self
        finally:
            self.mode, self._records = None, [[] for _ in range(self.num_layers)]

    def pop_forward(self) -> torch.Tensor:
        """The choice of the one forward run since the last call: ``(tokens, moe_layers, top_k)`` int16.

        Raises:
            RuntimeError: not recording, or a router ran other than once.
        """
        if self.mode != "record":
            raise RuntimeError("RouterReplay.pop_forward outside record()")
        calls = [len(r) for r in self._records]
        if calls != [1] * self.num_layers:
            raise RuntimeError(
                f"router replay: expected one call per MoE layer since the last forward, got {calls}"
            )
        out = torch.stack([r[0] for r in self._records], dim=1)
        self._records = [[] for _ in range(self.num_layers)]
        return out

    # ---- replaying ---------------------------------------------------------------------------------------

    def replay(self, targets: torch.Tensor) -> None:
        """Route the next forward's tokens (and its recomputation) through ``targets``.

        Args:
            targets: ``(tokens, moe_layers, top_k)`` expert ids in the forward's token order; a token whose
                first entry is -1 keeps its live choice.
        """
        if targets.dim() != 3 or tuple(targets.shape[1:]) != (self.num_layers, self.top_k):
            raise ValueError(
                f"router replay: targets of shape {tuple(targets.shape)}, expected (tokens, {self.num_layers}, "
                f"{self.top_k})"
            )
        self.mode, self._targets = "replay", targets.long()
        self._counted = [False] * self.num_layers

    def stop(self) -> None:
        """Back to live routing."""
        self.mode, self._targets = None, None

    def take_mismatch(self) -> tuple[int, int]:
        """``(mismatched, replayed)`` token-layer choices since the last call: how many replayed expert sets
        differ from what the live router would have picked."""
        counts, self._mismatch = self._mismatch, []
        if not counts:
            return 0, 0
        total = torch.stack([c.cpu() for c in counts]).sum(dim=0)
        return int(total[0]), int(total[1])

    # ---- inside a router call ----------------------------------------------------------------------------

    def _choose(self, layer: int, scores: torch.Tensor, live: Any) -> Any:
        if self.mode == "record":
            self._records[layer].append(live.indices.detach().reshape(-1, self.top_k).to(torch.int16))
            return live
        targets = self._targets[:, layer]
        rows = scores.numel() // scores.shape[-1]
        if targets.shape[0] != rows:
            raise ValueError(
                f"router replay: {targets.shape[0]} recorded tokens for a router call over {rows} tokens "
                "(the replayed batch is not the recorded one)"
            )
        targets = targets.to(live.indices.device).reshape(*live.indices.shape)
        keep = targets[..., :1] >= 0
        indices = torch.where(keep, targets, live.indices)
        if not self._counted[layer]:  # once per forward, not again in a checkpoint's recomputation
            self._counted[layer] = True
            differs = (indices.sort(dim=-1).values != live.indices.sort(dim=-1).values).any(dim=-1)
            self._mismatch.append(torch.stack([(differs & keep[..., 0]).sum(), keep.sum()]))
        return torch.return_types.topk((scores.gather(-1, indices), indices))


def _routed_forward(
    replay: RouterReplay, layer: int, num_experts: int, forward: Any, *args: Any, **kwargs: Any
):
    if replay.mode is None:
        return forward(*args, **kwargs)
    with _TopKChoice(replay, layer, num_experts, replay.top_k):
        return forward(*args, **kwargs)


# ---- layouts -------------------------------------------------------------------------------------------------


def routing_to_tokens(routing: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
    """The forward's token order from the batch layout.

    Args:
        routing: ``(bs, seqlen, moe_layers, top_k)`` recorded routing.
        indices: the packed tokens' indices into the flattened ``(bs * seqlen)`` axis
            (`rlflow.models.padding`); None = the padded forward's tokens, all of them.

    Returns:
        ``(tokens, moe_layers, top_k)`` long.
    """
    flat = routing.reshape(-1, *routing.shape[2:]).long()
    return flat if indices is None else flat.index_select(0, indices)


def tokens_to_routing(
    tokens: torch.Tensor,
    bs: int,
    seqlen: int,
    indices: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inverse of :func:`routing_to_tokens`: ``(bs, seqlen, moe_layers, top_k)`` int16, -1 off the valid tokens.

    Args:
        tokens: ``(tokens, moe_layers, top_k)`` in the forward's order.
        bs, seqlen: the padded batch's shape.
        indices: as in :func:`routing_to_tokens` (None: ``tokens`` covers every position).
        mask: ``(bs, seqlen)`` valid tokens (padded forward: the others become -1).
    """
    if indices is None:
        out = tokens.reshape(bs, seqlen, *tokens.shape[1:]).to(torch.int16).clone()
    else:
        out = tokens.new_full((bs * seqlen, *tokens.shape[1:]), _NOT_RECORDED, dtype=torch.int16)
        out[indices] = tokens.to(torch.int16)
        out = out.reshape(bs, seqlen, *tokens.shape[1:])
    if mask is not None:
        out[~mask.bool()] = _NOT_RECORDED
    return out


def place_prompt_routing(
    per_row: Sequence[Any],
    prompt_lengths: Sequence[int],
    prompt_width: int,
    response_length: int,
    num_layers: int,
    top_k: int,
) -> torch.Tensor:
    """Routing an inference engine returns per sequence (prompt tokens, then generated ones, in order), laid
    out as the batch's left-padded prompt and right-padded response.

    Args:
        per_row: per row a ``(n_tokens, moe_layers, top_k)`` array-like (None: nothing recorded); entries past
            ``prompt_length + response_length`` tokens are dropped.
        prompt_lengths: each row's number of prompt tokens.
        prompt_width: columns of the left-padded prompt.
        response_length: columns of the right-padded response.
        num_layers, top_k: the model's MoE layers and experts per token.

    Returns:
        ``(rows, prompt_width + response_length, moe_layers, top_k)`` int16, -1 where nothing was recorded.
    """
    out = torch.full(
        (len(per_row), prompt_width + response_length, num_layers, top_k), _NOT_RECORDED, dtype=torch.int16
    )
    for row, (routed, length) in enumerate(zip(per_row, prompt_lengths)):
        if routed is None:
            continue
        routed = torch.as_tensor(routed)
        if routed.dim() != 3 or tuple(routed.shape[1:]) != (num_layers, top_k):
            raise ValueError(
                f"routed experts of row {row} have shape {tuple(routed.shape)}, expected (tokens, {num_layers}, "
                f"{top_k})"
            )
        start = prompt_width - int(length)
        n = min(routed.shape[0], out.shape[1] - start)
        out[row, start : start + n] = routed[:n].to(torch.int16)
    return out
