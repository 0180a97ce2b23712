"""Megatron's low-precision keys read onto rlflow's (`rlflow.config.megatron_layout` calls these):
``override_transformer_config.fp8`` / ``fp8_recipe`` onto ``<role>.fsdp_config.fp8`` (`rlflow.models.fp8`)
and ``megatron.qat.*`` onto ``actor_rollout_ref.actor.qat`` (`rlflow.models.qat`)."""

from __future__ import annotations

import logging
from dataclasses import fields

from rlflow.config.override_syntax import NULL_SPELLINGS, note_once, parse_bool, split_override
from rlflow.config.schema import QATConfig
from rlflow.models.fp8 import FP8_FORMATS, FP8_RECIPES

logger = logging.getLogger(__name__)

__all__ = ["check_fp8_recipe_given", "fp8_key", "qat_key"]

_ACTOR = "actor_rollout_ref.actor"
_FP8_KEY = {_ACTOR: f"{_ACTOR}.fsdp_config.fp8", "critic": "critic.fsdp_config.fp8"}


def _note(key: str, message: str) -> None:
    note_once(logger, key, "%s", message)


_QAT_KEYS = tuple(f.name for f in fields(QATConfig))  # verl's QAT section


def qat_key(role: str, sub: str, value: str) -> list[str]:
    """``<role>.megatron.qat.<sub>``: the actor's onto ``actor_rollout_ref.actor.qat.<sub>`` (`rlflow.models.
    qat`); ModelOpt's ``bypass_te_fp8_assert`` dropped; the reference's and critic's off only."""
    key = f"{role}.megatron.qat.{sub}"
    if sub == "bypass_te_fp8_assert":
        parse_bool(key, value)
        _note(
            key,
            f"config key {key}={value} changes nothing: ModelOpt's guard against quantizers under Transformer "
            "Engine's FP8; rlflow's FP8 layers quantize the QAT weight as they are",
        )
        return []
    if sub not in _QAT_KEYS:
        raise ValueError(f"{key}: not one of verl's QAT keys ({list(_QAT_KEYS)}, bypass_te_fp8_assert)")
    if role == _ACTOR:
        return [f"{_ACTOR}.qat.{sub}={value}"]
    if sub == "enable" and parse_bool(key, value):
        raise ValueError(
            f"{key}=true: QAT is the actor's (actor_rollout_ref.actor.qat); the reference quantizes its weights "
            "as the actor does, and the critic trains in full precision: drop the key"
        )
    _note(key, f"config key {key}={value} changes nothing: QAT is the actor's (actor_rollout_ref.actor.qat)")
    return []


def fp8_key(role: str, sub: str, key: str, value: str) -> list[str]:
    """``override_transformer_config.fp8`` / ``fp8_recipe`` onto ``<role>.fsdp_config.fp8.format`` /
    ``recipe`` (`rlflow.models.fp8`: Transformer Engine's recipes, emulated)."""
    if value.lower() in (*NULL_SPELLINGS, "false"):
        return []
    if role not in _FP8_KEY:
        raise ValueError(
            f"{key}={value}: rlflow's FP8 numerics are the actor's and the critic's (fsdp_config.fp8); the "
            "reference computes in its dtype: drop the key"
        )
    if sub == "fp8":
        if value not in FP8_FORMATS:
            raise ValueError(f"{key}={value}: the FP8 formats rlflow emulates are {list(FP8_FORMATS)}")
        _note(key, f"{key}={value} is read as {_FP8_KEY[role]}.format={value} (FP8 numerics, emulated)")
        return [f"{_FP8_KEY[role]}.format={value}"]
    if value == "delayed":
        raise ValueError(
            f"{key}=delayed: Transformer Engine's delayed scaling (scales from an amax history of earlier "
            "iterations) is not emulated; set tensorwise (current scaling), blockwise or mxfp8"
        )
    if value not in FP8_RECIPES:
        raise ValueError(f"{key}={value}: the FP8 recipes rlflow emulates are {list(FP8_RECIPES)}")
    return [f"{_FP8_KEY[role]}.recipe={value}"]


def check_fp8_recipe_given(out: list[str], roles: list[str]) -> None:
    """Megatron's ``fp8_recipe`` defaults to ``delayed``, which rlflow does not emulate: a role given an FP8
    format by Megatron's ``fp8`` key needs the recipe on the command line too."""
    keys = {split_override(item)[1] for item in out if "=" in item}
    for role in roles:
        if f"{_FP8_KEY[role]}.recipe" not in keys:
            raise ValueError(
                f"{role}.megatron.override_transformer_config.fp8 without fp8_recipe: Megatron's default "
                "recipe is delayed scaling, which rlflow does not emulate; set "
                f"{role}.megatron.override_transformer_config.fp8_recipe to tensorwise, blockwise or mxfp8"
            )
