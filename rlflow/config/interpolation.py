"""``II``: an interpolation default for the structured-config dataclasses (shared by the schema modules)."""

from __future__ import annotations

__all__ = ["II"]


def II(path: str) -> str:
    """An interpolation default, ``${path}`` (OmegaConf's ``II``; resolved when the config is composed)."""
    return f"${{{path}}}"
