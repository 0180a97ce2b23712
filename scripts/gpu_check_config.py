"""The typed trainer config without Hydra or OmegaConf (`plain_config`), for ``scripts/gpu_check.py`` on a
machine that may lack them: the schema's defaults, dotted overrides, and OmegaConf's ``${...}``
interpolations resolved by hand."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from rlflow.config.schema import PPOTrainerConfig

__all__ = ["plain_config"]

_INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _target(path: str, root: Any, node_path: str) -> tuple[Any, str]:
    """The value ``${path}`` names, written in the node at ``node_path``, and its absolute path
    (OmegaConf's relative ``${.key}`` is a sibling; each further dot goes one node up)."""
    if path.startswith("."):
        key, parts = path.lstrip("."), node_path.split(".") if node_path else []
        up = len(path) - len(key) - 1
        if up > len(parts):
            raise ValueError(f"${{{path}}} in {node_path or 'the root'} points above the root")
        path = ".".join([*parts[: len(parts) - up], key])
    return _get(root, path), path


def _resolved(value: Any, root: Any, node_path: str = "", seen: frozenset = frozenset()) -> Any:
    """``value`` (held by the node at ``node_path``) with its ``${a.b}`` / ``${.b}`` interpolations
    resolved (a whole-string one keeps the target's type)."""
    if not isinstance(value, str) or "${" not in value:
        return value

    def one(path: str) -> Any:
        target, absolute = _target(path, root, node_path)
        if absolute in seen:
            raise ValueError(f"interpolation cycle through {absolute}")
        return _resolved(target, root, absolute.rpartition(".")[0], seen | {absolute})

    whole = _INTERPOLATION.fullmatch(value)
    if whole:
        return one(whole.group(1))
    return _INTERPOLATION.sub(lambda m: str(one(m.group(1))), value)


def _resolve(obj: Any, root: Any, node_path: str = "") -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _resolve(value, root, f"{node_path}.{f.name}" if node_path else f.name)
        else:
            setattr(obj, f.name, _resolved(value, root, node_path))


def plain_config(overrides: Mapping[str, Any]) -> PPOTrainerConfig:
    """The typed trainer config from the schema's defaults (the YAML's, a test checks it) and dotted
    ``overrides``, with ``${...}`` interpolations resolved: what ``to_typed(load_config(...))`` gives,
    without Hydra.

    Raises:
        AttributeError: an override names a key the schema does not have.
    """
    cfg = PPOTrainerConfig()
    for key, value in overrides.items():
        parent, _, name = key.rpartition(".")
        section = _get(cfg, parent) if parent else cfg
        if not hasattr(section, name):
            raise AttributeError(f"{key} is not a config key")
        setattr(section, name, value)
    _resolve(cfg, cfg)
    return cfg
