"""The typed trainer config: schema dataclasses, loading (Hydra) and validation, one owner per knob.

Command line (Hydra)::

    python -m rlflow.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4

Library / notebook::

    from rlflow.config import load_config, validate_config
    cfg = load_config(["trainer.total_training_steps=5"], config_name="demo")   # the embedded CPU demo
    validate_config(cfg, num_attention_heads=4, num_key_value_heads=2)

* `schema` — the dataclasses (registered with Hydra's ConfigStore); workers receive them typed.
* `loading` — where the YAML lives, composing it, the critic config file.
* `aliases` — verl's spellings of keys rlflow names differently.
* `validate` / `checks` — cross-key rules, raising ``ValueError`` naming the key path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlflow.config.schema import SCHEMA_NAME, PPOTrainerConfig, register_configs

if TYPE_CHECKING:
    from rlflow.config.correction_checks import resolve_bypass_mode
    from rlflow.config.loading import (
        CONFIG_NAME,
        DEMO_CONFIG_NAME,
        apply_critic_config_file,
        config_dir,
        config_section,
        load_config,
        resolve_critic_config_path,
        to_typed,
    )
    from rlflow.config.validate import (
        need_critic,
        need_reference_policy,
        needed_roles,
        update_is_on_policy,
        validate_config,
    )

# Loading and validation need Hydra / OmegaConf; the schema does not, so a worker-only environment (a GPU
# machine without Hydra, scripts/gpu_check.py) can import the workers. They are imported on first use.
_HYDRA_SIDE = {
    **dict.fromkeys(
        (
            "CONFIG_NAME",
            "DEMO_CONFIG_NAME",
            "apply_critic_config_file",
            "config_dir",
            "config_section",
            "load_config",
            "resolve_critic_config_path",
            "to_typed",
        ),
        "loading",
    ),
    **dict.fromkeys(
        ("need_critic", "need_reference_policy", "needed_roles", "update_is_on_policy", "validate_config"),
        "validate",
    ),
    "resolve_bypass_mode": "correction_checks",
}

__all__ = [
    "CONFIG_NAME",
    "DEMO_CONFIG_NAME",
    "SCHEMA_NAME",
    "PPOTrainerConfig",
    "apply_critic_config_file",
    "config_dir",
    "config_section",
    "load_config",
    "need_critic",
    "need_reference_policy",
    "needed_roles",
    "register_configs",
    "resolve_bypass_mode",
    "resolve_critic_config_path",
    "to_typed",
    "update_is_on_policy",
    "validate_config",
]


def __getattr__(name: str) -> Any:
    if name in _HYDRA_SIDE:
        return getattr(importlib.import_module(f"rlflow.config.{_HYDRA_SIDE[name]}"), name)
    raise AttributeError(f"module 'rlflow.config' has no attribute {name!r}")
