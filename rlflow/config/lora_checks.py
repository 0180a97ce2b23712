"""Checks of the actor's LoRA keys (``actor_rollout_ref.model.lora_*``), used by `config_validate`."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig

from rlflow.config.checks import at_least, flag, positive, value_at

__all__ = ["check_lora"]

MODEL = "actor_rollout_ref.model"


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
    """``lora_rank`` >= 0; with adapters on: ``lora_alpha`` > 0, the module selections well-formed, no
    saved adapter to load, and no reference sync (the reference holds no adapters to move)."""
    rank = at_least(cfg, f"{MODEL}.lora_rank", 0)
    path = value_at(cfg, f"{MODEL}.lora_adapter_path")
    if path is not None:
        raise ValueError(
            f"{MODEL}.lora_adapter_path={path!r}: starting from a saved PEFT adapter is not supported; merge it "
            "into its base model (peft's merge_and_unload, then save_pretrained) and set "
            f"{MODEL}.path to the merged model"
        )
    if rank == 0:
        return
    positive(cfg, f"{MODEL}.lora_alpha")
    _module_names(cfg, f"{MODEL}.target_modules", allow_all=True)
    if value_at(cfg, f"{MODEL}.exclude_modules") is not None:
        _module_names(cfg, f"{MODEL}.exclude_modules", allow_all=False)
    if flag(cfg, "actor_rollout_ref.ref.sync_ref_model"):
        raise ValueError(
            f"actor_rollout_ref.ref.sync_ref_model=true with {MODEL}.lora_rank={rank}: the reference is the "
            "base model and the actor trains only its adapters, so there is nothing to move into the "
            "reference; set sync_ref_model=false (or lora_rank=0)"
        )
