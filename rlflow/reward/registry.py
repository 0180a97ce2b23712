"""Reward managers by name (``reward_model.reward_manager``), verl's ``register`` decorator.

A manager class is built as ``cls(tokenizer=..., num_examine=..., compute_score=..., reward_fn_key=...,
**reward_model.reward_kwargs)`` and called as ``manager(batch, return_dict=True)``, returning
``{"reward_tensor": (bs, response_len), "reward_extra_info": {key: bs values}}``. A user module that
registers one is imported with ``actor_rollout_ref.model.external_lib``::

    from rlflow.reward import register_reward_manager, NaiveRewardManager

    @register_reward_manager("length_bonus")
    class LengthBonus(NaiveRewardManager):
        ...
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "BUILTIN_REWARD_MANAGERS",
    "REWARD_MANAGER_REGISTRY",
    "check_reward_manager_kwargs",
    "get_reward_manager_cls",
    "register_reward_manager",
]

REWARD_MANAGER_REGISTRY: dict[str, type] = {}
"""name -> manager class; the built-in ``naive`` and ``dapo`` are added when first looked up."""

_BUILTIN = {"naive": "rlflow.reward.naive", "dapo": "rlflow.reward.dapo", "prime": "rlflow.reward.prime"}
BUILTIN_REWARD_MANAGERS = tuple(_BUILTIN)
"""The managers rlflow ships (`rlflow.reward.NaiveRewardManager`, `rlflow.reward.DAPORewardManager`,
`rlflow.reward.prime.PrimeRewardManager`): the ones that score in the ``reward_model.num_workers`` process
pool."""
_STANDARD_ARGUMENTS = ("tokenizer", "num_examine", "compute_score", "reward_fn_key")
_VERL_MANAGERS = {
    "batch": (
        "verl's batch manager hands the score function whole lists: rlflow's managers call it per sample; "
        "use reward_manager=naive (reward_model.num_workers=N scores in parallel)"
    ),
    "generative": (
        "a generative (LLM-judge) reward: rlflow has no judge client; use reward_manager=naive with a "
        "custom_reward_function (custom_reward_function.path / name) that queries your judge"
    ),
}
"""verl's manager names rlflow does not register -> what to use instead."""


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator: make the manager available as ``reward_model.reward_manager=<name>``.

    Raises:
        ValueError: ``name`` is already registered to another class.
    """

    def decorator(cls: type) -> type:
        current = REWARD_MANAGER_REGISTRY.get(name)
        if current is not None and current is not cls and current.__qualname__ != cls.__qualname__:
            raise ValueError(f"reward manager {name!r} is already registered ({current.__qualname__})")
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def _load_builtins() -> None:
    for module in _BUILTIN.values():
        importlib.import_module(module)


def get_reward_manager_cls(name: str) -> type:
    """The class registered as ``name``.

    Raises:
        ValueError: naming ``reward_model.reward_manager`` and the registered names.
    """
    _load_builtins()
    if name not in REWARD_MANAGER_REGISTRY and name in _VERL_MANAGERS:
        raise ValueError(f"reward_model.reward_manager={name!r}: {_VERL_MANAGERS[name]}")
    if name not in REWARD_MANAGER_REGISTRY:
        raise ValueError(
            f"reward_model.reward_manager={name!r}: not a registered reward manager (registered: "
            f"{sorted(REWARD_MANAGER_REGISTRY)}); a module that registers one with "
            "rlflow.reward.register_reward_manager is imported with actor_rollout_ref.model.external_lib"
        )
    return REWARD_MANAGER_REGISTRY[name]


def check_reward_manager_kwargs(name: str, cls: type, reward_kwargs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless a user manager's constructor takes the standard arguments plus
    ``reward_kwargs`` (checked before anything starts)."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [a for a in (*_STANDARD_ARGUMENTS, *reward_kwargs) if a not in params]
    if missing:
        raise ValueError(
            f"reward_model.reward_manager={name!r}: {cls.__qualname__}(...) takes no argument(s) {missing} "
            f"(it is built with {list(_STANDARD_ARGUMENTS)} plus reward_model.reward_kwargs)"
        )
