"""Rollout engines, selected by ``actor_rollout_ref.rollout.name``.

* ``"hf"`` (default): `rlflow.rollout.hf.HFRollout`, runs everywhere (CPU included).
* ``"vllm"``: `rlflow.rollout.vllm.VLLMRollout`, the GPU extra (``pip install rlflow[vllm]``).

Engines are imported lazily by `get_rollout_class`, so selecting ``hf`` never imports vLLM.
"""

from __future__ import annotations

import importlib

from rlflow.rollout.base import BaseRollout, SamplingParams

__all__ = [
    "ROLLOUT_CLASSES",
    "BaseRollout",
    "SamplingParams",
    "get_rollout_class",
]

ROLLOUT_CLASSES: dict[str, tuple[str, str]] = {
    "hf": ("rlflow.rollout.hf", "HFRollout"),
    "vllm": ("rlflow.rollout.vllm", "VLLMRollout"),
}
"""``rollout.name`` → (module, class name)."""


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The rollout engine class for ``actor_rollout_ref.rollout.name``, imported on first use.

    Args:
        name: ``"hf"`` or ``"vllm"``.

    Returns:
        The class (``HFRollout`` / ``VLLMRollout``).

    Raises:
        ValueError: for an unknown name (the message names ``actor_rollout_ref.rollout.name``).
    """
    if name not in ROLLOUT_CLASSES:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={name!r} is not a known rollout engine; "
            f"choose one of {sorted(ROLLOUT_CLASSES)}"
        )
    module_name, class_name = ROLLOUT_CLASSES[name]
    return getattr(importlib.import_module(module_name), class_name)
