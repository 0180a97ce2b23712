"""The actor's full weights as a rollout engine takes them: gathered in buckets, LoRA adapters folded in."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rlflow.models.lora import lora_modules, merge_lora_stream
from rlflow.models.mtp import is_mtp_name
from rlflow.parallel.sharded import clean_param_name
from rlflow.parallel.weight_buckets import iter_full_param_buckets

__all__ = ["full_weights"]


def full_weights(module: nn.Module, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` of every parameter of the FSDP2 ``module`` (collective: one all-gather
    per bucket of at most ``bucket_bytes``, `iter_full_param_buckets`), in order; an adapted linear
    layer's ``weight`` comes merged (``W + s B A``) and its ``lora_A`` / ``lora_B`` do not come; the MTP
    layers (`rlflow.models.mtp`, gathered with their bucket) do not come: the rollout decodes without them."""
    adapted = {clean_param_name(name): scaling for name, scaling in lora_modules(module).items()}
    pairs = (
        item
        for bucket in iter_full_param_buckets(module, bucket_bytes)
        for item in bucket
        if not is_mtp_name(item[0])
    )
    return merge_lora_stream(pairs, adapted) if adapted else pairs
