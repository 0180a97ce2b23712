"""Readers of config values that raise ``ValueError`` naming the key path; used by `config_validate`.

Each ``check``-style reader takes the config and a dotted key, resolves interpolations, checks one thing
and returns the value, so a validation rule reads as one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "KL_ESTIMATORS",
    "at_least",
    "choice",
    "every_or_never",
    "fixed_micro_size",
    "flag",
    "in_range",
    "kl_name",
    "number",
    "optional_flag",
    "positive",
    "value_at",
]

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""Names `rlflow.trainer.ppo.core_algos.kl_penalty` accepts (each also with a ``+`` suffix)."""

_ABSENT = object()


# --------------------------------------------------------------------------- value access


def value_at(cfg: DictConfig, key: str) -> Any:
    """The value at dotted ``key``, interpolations resolved (ValueError naming the key otherwise)."""
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=True)
    except Exception as err:  # interpolation / missing-value errors of several types
        raise ValueError(f"{key}: cannot read the value ({err})") from err
    if value is _ABSENT:
        raise ValueError(f"{key}: missing from the config")
    return value


def number(cfg: DictConfig, key: str, integer: bool = False, allow_none: bool = False) -> Any:
    """``key``'s value, checked to be a number (an integer with ``integer``; None with ``allow_none``)."""
    value = value_at(cfg, key)
    if value is None and allow_none:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{key}={value!r} must be {kind}{' or null' if allow_none else ''}")
    return value


def at_least(
    cfg: DictConfig, key: str, minimum: float, integer: bool = True, allow_none: bool = False
) -> Any:
    """``key``'s value, checked to be a number >= ``minimum`` (see `number`)."""
    value = number(cfg, key, integer, allow_none)
    if value is not None and value < minimum:
        raise ValueError(f"{key}={value!r} must be >= {minimum}")
    return value


def fixed_micro_size(cfg: DictConfig, micro_key: str, dynamic_key: str) -> int:
    """The micro-batch size of fixed batching: null (verl's default) is refused naming both ways out."""
    if value_at(cfg, micro_key) is None:
        raise ValueError(
            f"{micro_key}=None: fixed micro-batches need a size; set it (or verl's global form without "
            f"_per_gpu), or {dynamic_key}=true for token-budget micro-batches"
        )
    return at_least(cfg, micro_key, 1)


def positive(cfg: DictConfig, key: str, allow_none: bool = False) -> Any:
    """``key``'s value, checked to be a number > 0 (or None with ``allow_none``)."""
    value = number(cfg, key, allow_none=allow_none)
    if value is not None and not value > 0:
        raise ValueError(f"{key}={value!r} must be > 0")
    return value


def in_range(cfg: DictConfig, key: str, low: float, high: float, high_open: bool = False) -> float:
    """``key``'s value, checked to lie in ``[low, high]`` (``[low, high)`` with ``high_open``)."""
    value = number(cfg, key)
    if not (low <= value < high if high_open else low <= value <= high):
        raise ValueError(f"{key}={value!r} must be in [{low}, {high}{')' if high_open else ']'}")
    return value


def every_or_never(cfg: DictConfig, key: str) -> int:
    """``key``'s value, a frequency: -1 (never) or a positive integer."""
    value = number(cfg, key, integer=True)
    if value != -1 and value < 1:
        raise ValueError(f"{key}={value!r} must be -1 (never) or >= 1")
    return value


def flag(cfg: DictConfig, key: str) -> bool:
    """``key``'s value, checked to be a bool."""
    value = value_at(cfg, key)
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} must be true or false")
    return value


def optional_flag(cfg: DictConfig, key: str, null_means: str = "") -> bool | None:
    """``key``'s value, checked to be a bool or null; ``null_means`` says what null does, in the error."""
    value = value_at(cfg, key)
    if value is not None and not isinstance(value, bool):
        meaning = f" (null: {null_means})" if null_means else ""
        raise ValueError(f"{key}={value!r} must be true, false or null{meaning}")
    return value


def choice(cfg: DictConfig, key: str, choices: Sequence[str]) -> str:
    """``key``'s value, checked to be one of ``choices``."""
    value = value_at(cfg, key)
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not one of {sorted(choices)}")
    return value


def kl_name(cfg: DictConfig, key: str) -> str:
    """``key``'s value, checked to be a KL estimator name (`KL_ESTIMATORS`, optionally with ``+``)."""
    value = value_at(cfg, key)
    if not isinstance(value, str) or value.removesuffix("+") not in KL_ESTIMATORS:
        raise ValueError(
            f"{key}={value!r} is not a KL estimator: one of {list(KL_ESTIMATORS)}, optionally + '+'"
        )
    return value
