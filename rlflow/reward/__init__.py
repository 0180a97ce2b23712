"""Rewards: rule scorers (GSM8K, synthetic tasks, code tasks in a SandboxFusion service), the naive, DAPO
and prime reward managers, custom and model rewards.

Names are imported lazily, so a scoring process that only needs a score function does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CustomRewardFunction": "custom",
    "get_custom_reward_fn": "custom",
    "load_custom_reward_fn": "custom",
    "DAPORewardManager": "dapo",
    "OverlongBuffer": "dapo",
    "default_compute_score": "default",
    "NaiveRewardManager": "naive",
    "PrimeRewardManager": "prime",
    "check_score": "naive",
    "ScoringPool": "pool",
    "BUILTIN_REWARD_MANAGERS": "registry",
    "REWARD_MANAGER_REGISTRY": "registry",
    "get_reward_manager_cls": "registry",
    "register_reward_manager": "registry",
    "compute_rm_score": "reward_model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
