"""Checks of the low-precision keys, used by `rlflow.config.validate.validate_config`: FP8
(`rlflow.models.fp8`: ``<role>.fsdp_config.fp8.{format,recipe}`` of the actor and the critic,
``actor_rollout_ref.rollout.quantization``) and the actor's quantization-aware training
(``actor_rollout_ref.actor.qat``, `rlflow.models.qat`)."""

from __future__ import annotations

import logging
import re
from typing import Any

from omegaconf import DictConfig, ListConfig

from rlflow.config.checks import value_at
from rlflow.models.fp8 import FP8_FORMATS, FP8_RECIPES
from rlflow.models.qat import QAT_MODES

logger = logging.getLogger(__name__)

__all__ = ["ROLLOUT_QUANTIZATIONS", "check_fp8", "check_qat", "fp8_forward", "rollout_fp8_forward"]

ROLLOUT_QUANTIZATIONS = (None, "fp8")
"""``rollout.quantization`` values: off, or verl's FP8 rollout (block scaling)."""

_ROLES = {"actor_rollout_ref.actor": "actor_rollout_ref.model", "critic": "critic.model"}
_ROLLOUT = "actor_rollout_ref.rollout"


def fp8_forward(cfg: Any) -> str | None:
    """The FP8 recipe of the actor's forward (None = off; the format changes only the gradients), from the
    composed or the typed config."""
    fp8 = cfg.actor_rollout_ref.actor.fsdp_config.fp8
    return None if fp8.format is None else str(fp8.recipe)


def rollout_fp8_forward(cfg: Any) -> str | None:
    """The FP8 recipe the rollout decodes with: ``blockwise`` (E4M3) under ``quantization=fp8``, else None."""
    return "blockwise" if cfg.actor_rollout_ref.rollout.quantization == "fp8" else None


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


_QAT = "actor_rollout_ref.actor.qat"


def check_qat(cfg: DictConfig) -> None:
    """``actor.qat``: ``mode`` one of `QAT_MODES` (verl's w4a4, which quantizes activations with observed
    scales, refused), ``group_size`` 16 (NVFP4's block), ``ignore_patterns`` a list of names whose ``re:``
    entries compile, ``activation_observer`` (w4a4's) and ``quantization_config_path`` (vLLM's) at their
    defaults; with QAT on, no LoRA adapters on the actor (their layers would stay in full precision)."""
    mode = value_at(cfg, f"{_QAT}.mode")
    if mode == "w4a4":
        raise ValueError(
            f"{_QAT}.mode=w4a4: quantizing activations with scales observed during training is not supported; "
            "w4a16 quantizes the weights (NVFP4), mxfp4_experts the routed experts' (MXFP4)"
        )
    if mode not in QAT_MODES:
        raise ValueError(f"{_QAT}.mode={mode!r}: choose one of {list(QAT_MODES)}")
    if value_at(cfg, f"{_QAT}.group_size") != 16:
        raise ValueError(
            f"{_QAT}.group_size={value_at(cfg, f'{_QAT}.group_size')}: NVFP4's block is 16 elements (MXFP4's, "
            "of mxfp4_experts, is 32 by its format); keep 16"
        )
    patterns = value_at(cfg, f"{_QAT}.ignore_patterns")
    if not isinstance(patterns, ListConfig | list) or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"{_QAT}.ignore_patterns={patterns!r} must be a list of module-name patterns")
    for pattern in patterns:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as err:
                raise ValueError(
                    f"{_QAT}.ignore_patterns: {pattern!r} is not a regular expression ({err})"
                ) from None
    if value_at(cfg, f"{_QAT}.activation_observer") != "static_minmax":
        raise ValueError(
            f"{_QAT}.activation_observer={value_at(cfg, f'{_QAT}.activation_observer')!r}: only w4a4 observes "
            "activation scales, and it is not supported; keep static_minmax"
        )
    if value_at(cfg, f"{_QAT}.quantization_config_path") is not None:
        raise ValueError(
            f"{_QAT}.quantization_config_path: verl's vLLM quantization config is not read; the rollout gets the "
            "quantized weights at each weight sync: set null"
        )
    if not value_at(cfg, f"{_QAT}.enable"):
        return
    model = "actor_rollout_ref.model"
    if (
        int(value_at(cfg, f"{model}.lora_rank") or 0) > 0
        or value_at(cfg, f"{model}.lora_adapter_path") is not None
    ):
        raise ValueError(
            f"{_QAT}.enable=true with LoRA adapters on the actor ({model}.lora_rank / lora_adapter_path): the "
            "adapted layers would stay in full precision; train without adapters or set enable=false"
        )
