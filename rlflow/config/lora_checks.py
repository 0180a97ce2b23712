"""Checks of the LoRA keys of the actor (``actor_rollout_ref.model.lora_*``) and the critic
(``critic.model.lora_rank`` / ``lora_alpha`` / ``target_modules``), used by `config_validate`; what they
select on each model is checked by `rlflow.config.architecture_checks`."""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig

from rlflow.config.checks import at_least, flag, positive, value_at
from rlflow.models.peft_adapter import check_peft_adapter

__all__ = ["CRITIC_MODEL", "MODEL", "check_lora"]

MODEL = "actor_rollout_ref.model"
CRITIC_MODEL = "critic.model"


def _module_names(cfg: DictConfig, key: str, allow_all: bool) -> None:
    value = value_at(cfg, key)
    if isinstance(value, str):
        if not value or (value == "all-linear" and not allow_all):
            raise ValueError(f"{key}={value!r}: give module-name suffixes or a regular expression")
        return
    if (
        isinstance(value, ListConfig | list | tuple)
        and value
        and all(isinstance(v, str) and v for v in value)
    ):
        return
    raise ValueError(
        f"{key}={value!r} must be {'all-linear, ' if allow_all else ''}a non-empty list of module-name "
        "suffixes (e.g. [q_proj,v_proj]) or one regular expression"
    )


def check_lora(cfg: DictConfig) -> None:
    """The actor's ``lora_rank`` >= 0; with adapters on (``lora_rank > 0`` or a ``lora_adapter_path``): a
    readable PEFT LoRA adapter at the path (`rlflow.models.peft_adapter.check_peft_adapter`, before Ray
    starts), else ``lora_alpha`` > 0 and the module selections well-formed; and no reference sync (the
    reference holds no adapters to move). The critic's: ``lora_rank`` >= 0 and, when > 0, ``lora_alpha`` >
    0 and ``target_modules`` well-formed."""
    if at_least(cfg, f"{CRITIC_MODEL}.lora_rank", 0) > 0:
        positive(cfg, f"{CRITIC_MODEL}.lora_alpha")
        _module_names(cfg, f"{CRITIC_MODEL}.target_modules", allow_all=True)
    rank = at_least(cfg, f"{MODEL}.lora_rank", 0)
    path = value_at(cfg, f"{MODEL}.lora_adapter_path")
    if path is not None:
        if not isinstance(path, str) or not path:
            raise ValueError(f"{MODEL}.lora_adapter_path={path!r} must be a directory path or null")
        rank = check_peft_adapter(os.path.expanduser(path)).rank
    if rank == 0:
        return
    if path is None:
        positive(cfg, f"{MODEL}.lora_alpha")
        _module_names(cfg, f"{MODEL}.target_modules", allow_all=True)
        if value_at(cfg, f"{MODEL}.exclude_modules") is not None:
            _module_names(cfg, f"{MODEL}.exclude_modules", allow_all=False)
    if flag(cfg, "actor_rollout_ref.ref.sync_ref_model"):
        raise ValueError(
            f"actor_rollout_ref.ref.sync_ref_model=true with LoRA adapters on the actor ({MODEL}.lora_rank="
            f"{rank}{'' if path is None else ', from lora_adapter_path'}): the reference is the "
            "base model and the actor trains only its adapters, so there is nothing to move into the "
            "reference; set sync_ref_model=false (or lora_rank=0)"
        )
