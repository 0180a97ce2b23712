"""Checks of the FP8 keys (`rlflow.models.fp8`): ``<role>.fsdp_config.fp8.{format,recipe}`` of the actor and
the critic, and ``actor_rollout_ref.rollout.quantization``, used by `rlflow.config.validate.validate_config`."""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig

from rlflow.config.checks import value_at
from rlflow.models.fp8 import FP8_FORMATS, FP8_RECIPES

logger = logging.getLogger(__name__)

__all__ = ["ROLLOUT_QUANTIZATIONS", "check_fp8", "fp8_forward", "rollout_fp8_forward"]

ROLLOUT_QUANTIZATIONS = (None, "fp8")
"""``rollout.quantization`` values: off, or verl's FP8 rollout (block scaling)."""

_ROLES = {"actor_rollout_ref.actor": "actor_rollout_ref.model", "critic": "critic.model"}
_ROLLOUT = "actor_rollout_ref.rollout"


def _get(cfg: Any, key: str) -> Any:
    """``key`` of the composed (``DictConfig``) or the typed config."""
    if isinstance(cfg, DictConfig):
        return value_at(cfg, key)
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def fp8_forward(cfg: Any, prefix: str = "actor_rollout_ref.actor") -> str | None:
    """The FP8 recipe of the role's forward (None = off): the format changes only the gradients."""
    fmt = _get(cfg, f"{prefix}.fsdp_config.fp8.format")
    return None if fmt is None else str(_get(cfg, f"{prefix}.fsdp_config.fp8.recipe"))


def rollout_fp8_forward(cfg: Any) -> str | None:
    """The FP8 recipe the rollout decodes with: ``blockwise`` (E4M3) under ``quantization=fp8``, else None."""
    return "blockwise" if _get(cfg, f"{_ROLLOUT}.quantization") == "fp8" else None


def check_fp8(cfg: DictConfig) -> None:
    """Each role's ``fp8.format`` in None | e4m3 | hybrid and ``fp8.recipe`` one of `FP8_RECIPES` (always
    checked); FP8 is refused beside LoRA adapters on the same role (their layers would stay in the compute
    dtype); ``rollout.quantization`` None or ``fp8``, ``fp8`` on the hf engine only. An FP8 rollout whose
    numerics the actor's forward does not share is logged with verl's advice (a rollout correction)."""
    for prefix, model in _ROLES.items():
        section = f"{prefix}.fsdp_config.fp8"
        fmt, recipe = value_at(cfg, f"{section}.format"), value_at(cfg, f"{section}.recipe")
        if recipe not in FP8_RECIPES:
            raise ValueError(f"{section}.recipe={recipe!r}: choose one of {list(FP8_RECIPES)}")
        if fmt is None:
            continue
        if fmt not in FP8_FORMATS:
            raise ValueError(f"{section}.format={fmt!r}: choose null (off) or one of {list(FP8_FORMATS)}")
        rank = value_at(cfg, f"{model}.lora_rank") or 0
        if int(rank) > 0 or (prefix != "critic" and value_at(cfg, f"{model}.lora_adapter_path") is not None):
            raise ValueError(
                f"{section}.format={fmt} with LoRA adapters on the same role ({model}.lora_rank / "
                "lora_adapter_path): the adapted layers would compute in the compute dtype, not FP8; set "
                f"{section}.format=null or train without adapters"
            )
    quantization = value_at(cfg, f"{_ROLLOUT}.quantization")
    if quantization not in ROLLOUT_QUANTIZATIONS:
        raise ValueError(
            f"{_ROLLOUT}.quantization={quantization!r}: null or fp8 (verl's FP8 rollout: 128 x 128 weight "
            "blocks, 1 x 128 activation blocks)"
        )
    if quantization is None:
        return
    name = value_at(cfg, f"{_ROLLOUT}.name")
    if name != "hf":
        raise ValueError(
            f"{_ROLLOUT}.quantization=fp8 with {_ROLLOUT}.name={name}: rlflow's FP8 rollout is the hf engine's "
            "(block scaling, the numerics of the actor's fsdp_config.fp8 recipe=blockwise); for vLLM's own FP8 "
            f"pass {_ROLLOUT}.engine_kwargs.vllm.quantization=fp8 and set quantization=null"
        )
    if fp8_forward(cfg) != rollout_fp8_forward(cfg):
        logger.warning(
            "%s.quantization=fp8 while the actor's forward is %s: the rollout's log-probs differ from the "
            "trainer's by the quantization; verl pairs an FP8 rollout with a rollout correction "
            "(algorithm.rollout_correction.rollout_is=token), or set actor_rollout_ref.actor.fsdp_config.fp8 "
            "format=e4m3 recipe=blockwise for the same numerics on both sides",
            _ROLLOUT,
            "not FP8" if fp8_forward(cfg) is None else f"FP8 recipe={fp8_forward(cfg)}",
        )
