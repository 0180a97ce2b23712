"""The actor's full weights as a rollout engine takes them: gathered in buckets, LoRA adapters folded in."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rlflow.models.lora import LoRALinear, lora_modules, merge_lora_stream, merge_lora_weights
from rlflow.parallel.sharded import clean_param_name
from rlflow.parallel.weight_buckets import iter_full_param_buckets

__all__ = ["full_weights", "merged_tensor"]


def full_weights(module: nn.Module, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` of every parameter of the FSDP2 ``module`` (collective: one all-gather
    per bucket of at most ``bucket_bytes``, `iter_full_param_buckets`), in order; an adapted linear
    layer's ``weight`` comes merged (``W + s B A``) and its ``lora_A`` / ``lora_B`` do not come."""
    adapted = {clean_param_name(name): scaling for name, scaling in lora_modules(module).items()}
    pairs = (item for bucket in iter_full_param_buckets(module, bucket_bytes) for item in bucket)
    return merge_lora_stream(pairs, adapted) if adapted else pairs


def merged_tensor(module: nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (the full value of ``module``'s ``name``, e.g. inside FSDP1's ``summon_full_params``),
    merged with its layer's adapters when ``name`` is the weight of a `LoRALinear`."""
    prefix, _, leaf = name.rpartition(".")
    if leaf != "weight" or not prefix:
        return tensor
    owner: object = module
    for part in prefix.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return tensor
    if not isinstance(owner, LoRALinear):
        return tensor
    return merge_lora_weights(tensor, owner.lora_A, owner.lora_B, float(owner.lora_scaling))
