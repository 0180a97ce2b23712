"""Tiled MLP (verl's ``model.tiled_mlp.enabled`` / ``num_shards``): each decoder layer's MLP runs over the
tokens in ``num_shards`` pieces, each under non-reentrant activation checkpointing.

A dense MLP block (``down(act(gate(x)) * up(x))``) keeps three ``tokens x intermediate_size`` activations
for its backward, several times the ``tokens x hidden_size`` the rest of the layer keeps: for long
sequences they are the largest part of a layer's activation memory. Tiled, a piece's activations live only
while that piece is computed, in the forward and again in the backward, which recomputes each piece's
forward first; what the backward keeps of the MLP is its input. The cost is one more MLP forward per
training step.

The MLP is token-wise, so the pieces compute what the whole would, up to the row blocking of the
matrix products; the weight gradients are sums over the pieces. Without autograd (the reference's and the
critic's forwards) the pieces run one after another without checkpointing: only peak memory changes.
The layer's parameter names are kept (the block's own ``forward`` is wrapped in place), so checkpoints,
the HF export and the rollout's weights are those of the untiled model. Mixture-of-experts blocks are
refused: their forward routes tokens across experts and returns router state as well.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlflow.parallel.fsdp import find_decoder_layers

__all__ = ["install_tiled_mlp", "tiled_forward"]


def tiled_forward(
    forward: Callable[[torch.Tensor], torch.Tensor], num_shards: int, hidden_states: torch.Tensor
) -> torch.Tensor:
    """``forward(hidden_states)`` over the tokens in up to ``num_shards`` pieces.

    Shapes: hidden_states (..., tokens, hidden) -> (..., tokens, hidden'); the pieces split ``tokens``
    (dim -2) into chunks of ``ceil(tokens / num_shards)``.
    """
    tokens = hidden_states.shape[-2]
    if num_shards <= 1 or tokens <= 1:
        return forward(hidden_states)
    pieces = hidden_states.split(math.ceil(tokens / num_shards), dim=-2)
    if torch.is_grad_enabled():
        outs = [checkpoint(forward, piece, use_reentrant=False) for piece in pieces]
    else:
        outs = [forward(piece) for piece in pieces]
    return torch.cat(outs, dim=-2)


def install_tiled_mlp(model: nn.Module, num_shards: int, key: str) -> int:
    """Tile the ``mlp`` block of every decoder layer of ``model`` in place; returns how many.

    Call it before sharding and before gradient checkpointing is enabled (either order works: the layer's
    checkpoint recomputes the tiled block, whose pieces checkpoint again).

    Args:
        model: a HF model whose decoder layers hold their MLP as ``mlp``.
        num_shards: pieces per forward (>= 1).
        key: the config section (``actor_rollout_ref.model.tiled_mlp``...) for error messages.

    Raises:
        ValueError: a layer without an ``mlp`` block, or a mixture-of-experts block.
    """
    if num_shards < 1:
        raise ValueError(f"{key}.num_shards={num_shards} must be >= 1")
    layers = find_decoder_layers(model)
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        if not isinstance(mlp, nn.Module):
            raise ValueError(
                f"{key}.enabled=true: {type(layer).__name__} has no 'mlp' block to tile; set it to false"
            )
        if hasattr(mlp, "experts"):
            raise ValueError(
                f"{key}.enabled=true: {type(mlp).__name__} is a mixture-of-experts block, which rlflow does "
                "not tile (its forward routes tokens across experts); set it to false"
            )
        if "forward" in vars(mlp):  # tiled already (the instance's own forward)
            continue
        mlp.forward = functools.partial(tiled_forward, mlp.forward, int(num_shards))
    return len(layers)
