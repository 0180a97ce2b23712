"""Checks of ``algorithm.rollout_correction`` (part of `rlflow.config.validate.validate_config`)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlflow.algos.rejection import RS_OPTIONS, is_rs_option_list, parse_rejection
from rlflow.algos.rollout_correction import IS_LEVELS, RS_LEVELS
from rlflow.config.checks import flag, number, optional_flag, positive, value_at

__all__ = ["check_rollout_correction", "resolve_bypass_mode", "rollout_correction_active"]

RC = "algorithm.rollout_correction"
_FP32 = ("fp32", "float32")


def rollout_correction_active(cfg: Any) -> bool:
    """True when ``algorithm.rollout_correction`` computes weights, rejection or a veto.

    Args:
        cfg: the composed config (``DictConfig``) or the typed `PPOTrainerConfig`.
    """
    rc = cfg.algorithm.rollout_correction
    return (
        rc.rollout_is is not None or rc.rollout_rs is not None or rc.rollout_token_veto_threshold is not None
    )


def resolve_bypass_mode(cfg: Any) -> tuple[bool, str]:
    """Whether the rollout's log-probs stand for the old policy's (no ``compute_log_prob`` pass), and why.

    ``bypass_mode: true`` / ``false`` decide it. ``null`` (the default) bypasses exactly when the pass
    would recompute what the rollout already computed, to float rounding:

    * the ``hf`` engine: it decodes with the actor's own weights, synced before every call, in the
      actor's compute dtype;
    * fp32 throughout (``fsdp_config.model_dtype``, ``mixed_precision.param_dtype``, ``rollout.dtype``):
      the two computations then agree to about 1e-6 (`tests/rollout/test_hf_rollout.py`), where bf16
      rounding alone moves a log-prob by 1e-2;
    * nothing compares the two: no ``rollout_is`` / ``rollout_rs`` / veto / ``use_policy_gradient``,
      ``actor.tis_imp_ratio_cap <= 0`` and ``rollout.calculate_log_probs=false`` (set it to see the
      agreement as ``training/rollout_probs_diff_*``, which needs the pass);
    * the pass would run: not an on-policy update (`update_is_on_policy`), whose own forward gives the
      old log-probs exactly.

    The rollout then also returns each token's entropy, logged as ``actor/entropy`` as the pass would.

    Args:
        cfg: the composed config (``DictConfig``) or the typed `PPOTrainerConfig`.

    Returns:
        ``(bypass, reason)``: the decision and the setting or condition that made it.
    """
    from rlflow.config.quantization_checks import fp8_forward, rollout_fp8_forward
    from rlflow.config.validate import update_is_on_policy

    rc = cfg.algorithm.rollout_correction
    if rc.bypass_mode is not None:
        return bool(rc.bypass_mode), f"{RC}.bypass_mode={str(bool(rc.bypass_mode)).lower()}"
    arr = cfg.actor_rollout_ref
    fsdp, rollout = arr.actor.fsdp_config, arr.rollout
    param_dtype = fsdp.mixed_precision.param_dtype if fsdp.mixed_precision is not None else "fp32"
    unequal = [
        (rollout.name != "hf", f"rollout.name={rollout.name} (another engine's numerics)"),
        (str(fsdp.model_dtype) not in _FP32, f"actor fsdp_config.model_dtype={fsdp.model_dtype}"),
        (str(param_dtype) not in _FP32, f"actor mixed_precision.param_dtype={param_dtype}"),
        (rollout.dtype is not None and str(rollout.dtype) not in _FP32, f"rollout.dtype={rollout.dtype}"),
        (rollout_correction_active(cfg) or bool(rc.use_policy_gradient), f"{RC} compares the two"),
        (float(arr.actor.tis_imp_ratio_cap) > 0, "actor.tis_imp_ratio_cap compares the two"),
        (bool(rollout.calculate_log_probs), "rollout.calculate_log_probs=true (the agreement is logged)"),
        (update_is_on_policy(cfg), "an on-policy update (its own forward gives them exactly)"),
        (
            fp8_forward(cfg) != rollout_fp8_forward(cfg),
            "the actor's fsdp_config.fp8 and rollout.quantization differ (FP8 numerics on one side)",
        ),
        (
            str(arr.actor.router_replay.mode) == "R2",
            "actor.router_replay.mode=R2 (the pass records the routing the update replays)",
        ),
    ]
    for hit, why in unequal:
        if hit:
            return False, f"{RC}.bypass_mode=null: {why}"
    return True, f"{RC}.bypass_mode=null: hf engine in fp32, nothing compares them"


def _level(cfg: DictConfig, key: str, levels: tuple[str, ...]) -> str | None:
    value = value_at(cfg, key)
    if value is not None and value not in levels:
        raise ValueError(f"{key}={value!r} is not one of {list(levels)} or null")
    return value


def check_rollout_correction(cfg: DictConfig) -> None:
    """Levels and thresholds of ``algorithm.rollout_correction``; the rollout's log-probs when it is on."""
    rollout_is = _level(cfg, f"{RC}.rollout_is", IS_LEVELS)
    rollout_rs = value_at(cfg, f"{RC}.rollout_rs")
    threshold = positive(cfg, f"{RC}.rollout_is_threshold")
    flag(cfg, f"{RC}.rollout_is_batch_normalize")
    if rollout_rs is not None and rollout_rs not in RS_LEVELS:
        _check_rs_options(cfg, str(rollout_rs))
    elif isinstance(value_at(cfg, f"{RC}.rollout_rs_threshold"), str):
        raise ValueError(
            f"{RC}.rollout_rs_threshold={value_at(cfg, f'{RC}.rollout_rs_threshold')!r}: a string of bounds goes "
            f"with verl's current rollout_rs options ({list(RS_OPTIONS)}); with rollout_rs="
            f"{rollout_rs!r} give a number (and rollout_rs_threshold_lower)"
        )
    legacy = rollout_rs is None or rollout_rs in RS_LEVELS
    upper = positive(cfg, f"{RC}.rollout_rs_threshold", allow_none=True) if legacy else None
    lower = positive(cfg, f"{RC}.rollout_rs_threshold_lower", allow_none=True)
    if rollout_rs in RS_LEVELS:
        upper_used = threshold if upper is None else upper
        lower_used = 1.0 / upper_used if lower is None else lower
        if not lower_used < upper_used:
            raise ValueError(
                f"{RC}.rollout_rs_threshold_lower={lower_used!r} must be below the upper bound {upper_used!r} "
                f"({RC}.rollout_rs_threshold, or rollout_is_threshold when it is null)"
            )
    veto = number(cfg, f"{RC}.rollout_token_veto_threshold", allow_none=True)
    if veto is not None and not 0 < veto < 1:
        raise ValueError(f"{RC}.rollout_token_veto_threshold={veto!r} must be in (0, 1) or null")
    # null never needs calculate_log_probs: the trainer asks the hf engine itself
    bypass = bool(optional_flag(cfg, f"{RC}.bypass_mode", "bypass when equal"))
    if flag(cfg, f"{RC}.use_policy_gradient"):
        _check_policy_gradient(cfg, bypass)
    active = rollout_is is not None or rollout_rs is not None or veto is not None
    if (active or bypass) and not value_at(cfg, "actor_rollout_ref.rollout.calculate_log_probs"):
        key = f"{RC}.bypass_mode" if bypass else f"{RC}.{'rollout_is' if rollout_is else 'rollout_rs'}"
        if veto is not None and not (bypass or rollout_is or rollout_rs):
            key = f"{RC}.rollout_token_veto_threshold"
        raise ValueError(
            f"{key} needs the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    cap = value_at(cfg, "actor_rollout_ref.actor.tis_imp_ratio_cap")
    if rollout_is is not None and cap is not None and cap > 0:
        raise ValueError(
            f"{RC}.rollout_is={rollout_is!r} and actor_rollout_ref.actor.tis_imp_ratio_cap={cap!r} both weight the "
            f"policy loss: keep one (tis_imp_ratio_cap=x is rollout_is=token with rollout_is_threshold=x)"
        )


def _check_rs_options(cfg: DictConfig, rollout_rs: str) -> None:
    """verl's current ``rollout_rs`` options and their ``rollout_rs_threshold`` (`rlflow.algos.rejection`)."""
    if not is_rs_option_list(rollout_rs):
        raise ValueError(
            f"{RC}.rollout_rs={rollout_rs!r} is not one of {list(RS_LEVELS)}, null, or verl's options "
            f"{list(RS_OPTIONS)} (comma-separated)"
        )
    if value_at(cfg, f"{RC}.rollout_rs_threshold_lower") is not None:
        raise ValueError(
            f"{RC}.rollout_rs_threshold_lower goes with rollout_rs=token / sequence / geometric; with "
            f"rollout_rs={rollout_rs!r} write the bounds as {RC}.rollout_rs_threshold='L_U'"
        )
    threshold = value_at(cfg, f"{RC}.rollout_rs_threshold")
    if isinstance(threshold, bool):
        raise ValueError(f"{RC}.rollout_rs_threshold={threshold!r}: expected a number or 'L_U' bounds")
    parse_rejection(rollout_rs, threshold, key=f"{RC}.rollout_rs")


def _check_policy_gradient(cfg: DictConfig, bypass: bool) -> None:
    """``use_policy_gradient=true``: the REINFORCE loss of bypass mode (`rlflow.algos.reinforce_loss`)."""
    key = f"{RC}.use_policy_gradient=true"
    if not bypass:
        raise ValueError(
            f"{key} is the policy-gradient loss of bypass mode (verl reads it only then): set "
            f"{RC}.bypass_mode=true, or keep it false and weight the PPO loss with {RC}.rollout_is"
        )
    if flag(cfg, f"{RC}.rollout_is_batch_normalize"):
        raise ValueError(
            f"{key} recomputes the weights in every micro-batch, so {RC}.rollout_is_batch_normalize=true would "
            f"normalise them by a micro-batch's mean (the loss would depend on the split): set it false"
        )
    mode = value_at(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode")
    if mode != "vanilla":
        raise ValueError(
            f"{key} replaces the policy loss by REINFORCE, so actor_rollout_ref.actor.policy_loss.loss_mode="
            f"{mode!r} would be ignored: keep loss_mode=vanilla, or set use_policy_gradient=false for {mode!r}"
        )
    cap = value_at(cfg, "actor_rollout_ref.actor.tis_imp_ratio_cap")
    if cap is not None and cap > 0:
        raise ValueError(
            f"{key} and actor_rollout_ref.actor.tis_imp_ratio_cap={cap!r} both weight the policy loss: set "
            f"tis_imp_ratio_cap=0 and use {RC}.rollout_is=token with rollout_is_threshold={cap!r}"
        )
