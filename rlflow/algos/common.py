"""Helpers shared by the PPO-family algorithm modules (``advantages``, ``losses``, ``kl``)."""

from __future__ import annotations

import torch

__all__ = ["Count", "check_shapes"]

Count = int | float | torch.Tensor
"""A token or sequence count: a Python number or a scalar tensor."""


def check_shapes(fn_name: str, response_mask: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Raise ValueError naming the argument whose shape differs from ``response_mask`` (bs, response_len)."""
    if response_mask.dim() != 2:
        raise ValueError(
            f"{fn_name}: response_mask must be (bs, response_len), got shape {tuple(response_mask.shape)}"
        )
    for key, tensor in tensors.items():
        if tensor is not None and tensor.shape != response_mask.shape:
            raise ValueError(
                f"{fn_name}: {key} has shape {tuple(tensor.shape)} but response_mask has "
                f"{tuple(response_mask.shape)}; both must be (bs, response_len)"
            )
