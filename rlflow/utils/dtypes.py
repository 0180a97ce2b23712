"""The one table of dtype names rlflow accepts in configs (``fp32``, ``bf16``, ``float16``, ...)."""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "to_torch_dtype"]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
"""Config name -> torch dtype."""


def to_torch_dtype(name: str | torch.dtype, key: str = "dtype") -> torch.dtype:
    """The torch dtype of a config name (a torch dtype passes through).

    Args:
        name: one of `DTYPES` or a ``torch.dtype``.
        key: the config key path, for the error message.

    Raises:
        ValueError: naming ``key`` and the accepted names.
    """
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"{key}={name!r} must be one of {sorted(DTYPES)}")
    return DTYPES[name]
