"""Helpers shared by the PPO-family algorithm modules (``advantages``, ``losses``, ``kl``)."""

from __future__ import annotations

import torch

__all__ = ["LOG_RATIO_BOUND", "Count", "check_shapes", "clamped_log_ratio"]

Count = int | float | torch.Tensor
"""A token or sequence count: a Python number or a scalar tensor."""

LOG_RATIO_BOUND = 20.0
"""Bound on a log-ratio of probabilities before it is exponentiated (the ratio's overflow guard, as verl's)."""


def clamped_log_ratio(log_prob: torch.Tensor, other_log_prob: torch.Tensor) -> torch.Tensor:
    """``log_prob - other_log_prob`` clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]`` (any shape)."""
    return torch.clamp(log_prob - other_log_prob, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)


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
