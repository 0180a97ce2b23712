"""Moving one sharded model's weights toward another's, shard by shard (the reference-policy sync).

``actor_rollout_ref.ref.sync_ref_model`` (TR-DPO's reference update, Gorbatovski et al. 2024,
arXiv:2404.09656, as TRL and verl spell it) replaces the reference weights every
``ref_model_sync_steps`` steps by ``alpha * actor + (1 - alpha) * reference``. The actor and the
reference are the same model sharded the same way over the same ranks (`rlflow.workers.role_setup.
ref_layout`), so rank ``r`` of the reference needs only rank ``r``'s local shards of the actor: no
parameter is ever gathered. `local_shards` takes them (CPU copies, to travel as a Ray object from the
actor's process to the reference's), `mix_local_shards_` blends them in.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlflow.parallel.sharded import clean_param_name

__all__ = ["local_shards", "mix_local_shards_"]


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param.data


def local_shards(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's part of every parameter (FSDP2: the DTensor's local shard; FSDP1: the flat shard;
    plain: the tensor), as detached CPU copies keyed by the unwrapped parameter name."""
    return {clean_param_name(n): _local(p).detach().to("cpu", copy=True) for n, p in model.named_parameters()}


@torch.no_grad()
def mix_local_shards_(model: nn.Module, shards: dict[str, torch.Tensor], alpha: float) -> None:
    """``p <- alpha * shard + (1 - alpha) * p`` for every local parameter shard of ``model``, in place.

    Args:
        model: the model to move (sharded exactly like the one ``shards`` came from).
        shards: `local_shards` of the same rank of the other model.
        alpha: in (0, 1]; 1 copies the shards.

    Raises:
        ValueError: the two models do not have the same parameters, or not the same local shapes (they
            are sharded differently).
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha={alpha!r} must be in (0, 1]")
    params = {clean_param_name(n): p for n, p in model.named_parameters()}
    if params.keys() != shards.keys():
        missing = sorted(params.keys() ^ shards.keys())
        raise ValueError(f"weight mixing: the two models' parameters differ ({missing[:3]} ...)")
    for name, param in params.items():
        local, source = _local(param), shards[name]
        if tuple(local.shape) != tuple(source.shape):
            raise ValueError(
                f"weight mixing: {name!r} has local shape {tuple(local.shape)} here and {tuple(source.shape)} "
                "in the other model; both must be sharded the same way over the same ranks"
            )
        local.mul_(1 - alpha).add_(source.to(device=local.device, dtype=local.dtype), alpha=alpha)
