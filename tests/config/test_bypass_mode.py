"""``algorithm.rollout_correction.bypass_mode``: true / false as set; null (the default) skips the
old-log-prob pass exactly where the hf rollout's log-probs equal it to float rounding
(`rlflow.config.resolve_bypass_mode`)."""

from __future__ import annotations

import pytest

from rlflow.config import load_config, resolve_bypass_mode, validate_config

RC = "algorithm.rollout_correction"


def _resolve(*overrides: str) -> tuple[bool, str]:
    return resolve_bypass_mode(load_config(list(overrides), config_name="demo"))


def test_default_bypasses_the_hf_engine_in_fp32():
    # the demo: hf engine, fp32, 4 mini-batches per step (not on-policy), nothing compares the two
    assert _resolve() == (True, f"{RC}.bypass_mode=null: hf engine in fp32, nothing compares them")
    assert _resolve("algorithm.use_kl_in_reward=true")[0]  # the PPO benches' setting


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ((f"{RC}.bypass_mode=false",), f"{RC}.bypass_mode=false"),
        (("actor_rollout_ref.rollout.name=vllm",), "rollout.name=vllm"),
        (("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",), "param_dtype=bf16"),
        (("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",), "model_dtype=bf16"),
        (("actor_rollout_ref.rollout.dtype=bf16",), "rollout.dtype=bf16"),
        (("actor_rollout_ref.rollout.calculate_log_probs=true",), "calculate_log_probs=true"),
        (
            ("actor_rollout_ref.rollout.calculate_log_probs=true", f"{RC}.rollout_is=token"),
            "compares the two",
        ),
        (("actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",), "tis_imp_ratio_cap"),
        (("actor_rollout_ref.actor.ppo_mini_batch_size=16",), "on-policy update"),
    ],
)
def test_null_keeps_the_pass_where_the_two_differ_or_are_compared(overrides, why):
    bypass, reason = _resolve(*overrides)
    assert not bypass
    assert why in reason


def test_explicit_true_and_bad_values():
    assert _resolve(f"{RC}.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=true") == (
        True,
        f"{RC}.bypass_mode=true",
    )
    validate_config(load_config([], config_name="demo"))  # null needs no calculate_log_probs
    with pytest.raises(ValueError, match=r"rollout_correction.bypass_mode needs the rollout's log-probs"):
        validate_config(load_config([f"{RC}.bypass_mode=true"], config_name="demo"))
    with pytest.raises(Exception, match=r"algorithm.rollout_correction.bypass_mode"):
        load_config([f"{RC}.bypass_mode=auto"], config_name="demo")  # the typed schema: bool or null
