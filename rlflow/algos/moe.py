"""Router losses of mixture-of-experts layers, as Megatron-LM adds them to the loss
(``moe_aux_loss_coeff``, ``moe_z_loss_coeff``), computed from the router logits a Hugging Face MoE model
returns with ``output_router_logits=True``.

For one MoE layer with router logits ``z: (T, E)`` over ``T`` tokens and ``E`` experts, routing each token
to its ``k`` largest probabilities ``p = softmax(z)``:

* load balancing (Switch Transformer, Fedus et al. 2021, Eq. 4, with Megatron's scaling):
  ``aux = E * sum_e f_e * P_e`` with ``f_e`` the fraction of the ``T * k`` routing slots that went to expert
  ``e`` and ``P_e = mean_t p_te``: 1 for a perfectly even router, up to ``E`` when every token is routed
  with certainty to the same experts. Hugging Face's ``load_balancing_loss_func`` is ``k`` times this for
  one layer;
* router z-loss (ST-MoE, Zoph et al. 2022, Eq. 5): ``z = mean_t logsumexp(z_t)^2``.

Each is summed over the layers (Megatron adds every layer's term to the loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["router_losses"]


def router_losses(
    router_logits: Sequence[torch.Tensor], top_k: int, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load-balancing and z-losses of the router logits of every MoE layer, summed over layers.

    Args:
        router_logits: one ``(T, E)`` tensor per MoE layer (the tokens of the forward, flattened).
        top_k: experts each token is routed to.
        valid: ``(T,)`` bool, the tokens that count (padding excluded); None = all.

    Returns:
        ``(aux, z)`` scalars (float32, differentiable through ``router_logits``; the routing choice itself
        is not differentiated, as in Megatron).

    Raises:
        ValueError: no layers, or ``top_k`` outside ``[1, E]``.
    """
    if not router_logits:
        raise ValueError("router_losses: no router logits (is the model a mixture of experts?)")
    aux = torch.zeros((), dtype=torch.float32, device=router_logits[0].device)
    z = torch.zeros_like(aux)
    for logits in router_logits:
        logits = logits.float()
        if valid is not None:
            logits = logits[valid]
        tokens, experts = logits.shape
        if tokens == 0:
            continue
        if not 1 <= top_k <= experts:
            raise ValueError(f"router_losses: top_k={top_k} must be in [1, {experts}]")
        probs = torch.softmax(logits, dim=-1)
        chosen = torch.topk(probs, top_k, dim=-1).indices
        load = torch.zeros(experts, dtype=probs.dtype, device=probs.device)
        ones = torch.ones(chosen.numel(), dtype=probs.dtype, device=probs.device)
        load.scatter_add_(0, chosen.reshape(-1), ones)
        fraction = load / (tokens * top_k)
        aux = aux + experts * (fraction * probs.mean(0)).sum()
        z = z + torch.logsumexp(logits, dim=-1).square().mean()
    return aux, z
