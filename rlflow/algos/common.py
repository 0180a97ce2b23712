"""Helpers shared by the PPO-family algorithm modules (``advantages``, ``losses``, ``kl``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Count", "config_get"]

Count = int | float | torch.Tensor


def config_get(config: Any, key: str, default: Any = None) -> Any:
    """``config.key`` for a dataclass / DictConfig / namespace / dict; ``default`` when absent or None."""
    if config is None:
        return default
    value = config.get(key, None) if isinstance(config, Mapping) else getattr(config, key, None)
    return default if value is None else value


_cfg = config_get


def _check_shapes(fn_name: str, response_mask: torch.Tensor, **tensors: torch.Tensor | None) -> None:
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
