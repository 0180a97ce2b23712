"""verl's spellings of config keys that rlflow spells differently, accepted as aliases.

A verl command line ports unchanged: before Hydra composes the config, every override whose key starts
with an alias is rewritten to rlflow's key (and a line is logged once per alias), so the schema keeps one
owner per knob. The same rewrite applies to the keys of a critic config file (``critic.config_path``).

==========================================  ==============================================
verl                                        rlflow
==========================================  ==============================================
``<role>.fsdp_config.strategy``,             ``<role>.strategy``,
``<role>.fsdp_config.ulysses_sequence_       ``<role>.ulysses_sequence_parallel_size`` (actor,
parallel_size`` (verl's engine config)       reference, critic; ``critic.model.fsdp_config.*`` too)
``critic.model.fsdp_config.*``              ``critic.fsdp_config.*``
``critic.fsdp.*`` (verl's engine config)    ``critic.fsdp_config.*``
``actor.fsdp_config.qat.*``                 ``actor.qat.*`` (QAT, `rlflow.models.qat`)
``reward_model.model_path``                 ``reward_model.model.path``
``actor.policy_loss.tau_{pos,neg}`` (a verl  ``actor.tau_pos`` / ``actor.tau_neg`` (SAPO)
SAPO script)
``rollout.enable_sleep_mode`` (vLLM's)       ``rollout.free_cache_engine`` (rlflow's vLLM sleeps
                                            between generations with it)
``reward.*`` (newer verl's reward section):  ``custom_reward_function.*``,
``custom_reward_function.*``,                ``reward_model.reward_manager``,
``reward_manager.name``, ``reward_kwargs.*``, ``reward_model.reward_kwargs.*``,
``num_workers``, ``sandbox_fusion.*``,        ``reward_model.num_workers``,
``reward_model.{enable,model_path,rollout.*}``  ``reward_model.sandbox_fusion.*``,
                                            ``reward_model.{enable,model.path,inference.*}``
``reward_model.rollout.*`` (older verl)     ``reward_model.inference.*``
``ray_kwargs.ray_init.*`` (newer verl)      ``ray_init.*``
``ray_kwargs.timeline_json_file``           ``trainer.ray_timeline_json_file``
``*.model.use_rmpad`` (older verl)          ``*.model.use_remove_padding`` (actor, critic,
                                            reward model)
``rollout.checkpoint_engine.update_weights  ``rollout.update_weights_bucket_megabytes``
_bucket_megabytes`` (newer verl)            (both under ``actor_rollout_ref``)
``algorithm.rollout_correction.loss_type``   ``ppo_clip``: ``rollout_correction.use_policy_gradient=false``;
(newer verl)                                ``reinforce``: ``use_policy_gradient=true``
``actor_rollout_ref.actor.use_gpg_loss``    ``true``: ``actor.policy_loss.loss_mode=gpg``;
                                            ``false``: dropped (the loss mode stays)
``actor_rollout_ref.model.use_prefix_tree``  ``true``: ``model.use_shared_prompts=true`` (a
(verl's prefix-tree packing)                prompt's samples share one copy of it in the update;
                                            ``false``: dropped); ``model.prefix_tree_attention``
                                            (``flex`` | ``magi``) dropped, logged (`INERT_CHOICES`)
``actor_rollout_ref.model.use_liger``       ``true``: ``model.use_fused_kernels=true`` (Liger's
                                            Triton kernels are GPU-only; what rlflow has of
                                            them is the fused, chunked LM head and its loss);
                                            ``false``: dropped
``rollout.engine_kwargs.vllm.<arg>`` for the  ``rollout.<key>`` (``max_model_len``, ``max_num_seqs``,
``vllm.LLM`` arguments rlflow sets itself     ``tensor_parallel_size``: ``tensor_model_parallel_size``,
                                            ... `rollout_checks.VLLM_ENGINE_KWARGS_OWNED`)
``rollout.disable_log_stats`` (vLLM's)       ``rollout.engine_kwargs.vllm.disable_log_stats``
``rollout.max_batch_size`` (TensorRT-LLM's   ``rollout.max_num_seqs`` (the engine's limit on
batch limit)                                sequences per step)
``actor.kl_loss.type`` (early 2025 verl)    ``actor.kl_loss_type``
``actor.kl_loss.coef=c`` (same)             ``actor.kl_loss_coef=c`` and ``use_kl_loss=(c > 0)``
``algorithm.in_reward_kl.type`` (same)      ``algorithm.kl_penalty``
``algorithm.in_reward_kl.kl_ctrl.*`` (same) ``algorithm.kl_ctrl.*``
``algorithm.in_reward_kl.coef=c`` (same)    ``algorithm.kl_ctrl.kl_coef=c`` and ``use_kl_in_reward=(c > 0)``
``actor.optim.clip_grad``, ``critic.optim.  ``actor.grad_clip``, ``critic.grad_clip``
clip_grad`` (verl's optimizer section)
``trainer.val_generations_to_log_to_wandb`` ``trainer.log_val_generations``
(older verl)
``data.enable_thinking`` (verl's GLM / Qwen3  ``data.apply_chat_template_kwargs.enable_thinking``
scripts)                                    (the chat template's switch)
``actor_rollout_ref.ref.param_offload``      ``actor_rollout_ref.ref.fsdp_config.param_offload``
(older verl)
``reward_model.param_offload`` (older verl)   ``reward_model.model.fsdp_config.param_offload``
``reward_model.sandbox_fusion_url`` (older    ``reward_model.sandbox_fusion.url``
verl)
``*.optim.lr_decay_style`` (verl's Megatron   ``*.optim.lr_scheduler_type`` (constant | cosine)
optimizer; actor and critic)
``actor_rollout_ref.model.lora.{rank,alpha,   ``actor_rollout_ref.model.{lora_rank,lora_alpha,
target_modules}`` (verl's Megatron LoRA)    target_modules}``
``actor.entropy_from_logits_with_chunking``,  dropped, logged (`INERT_FLAGS`): rlflow's entropy is always
``entropy_checkpointing`` (actor and ref)   chunked and recomputed in the backward
``ref.fsdp_config.optimizer_offload``         dropped, logged (`INERT_FLAGS`): the reference has no optimizer
``model.use_shm``, ``rollout.layered_summon``  dropped, logged (`INERT_FLAGS`): load / weight-sync speed-ups
``rollout.multi_stage_wake_up`` (SGLang)      dropped, logged (`INERT_FLAGS`): how an engine wakes up
``trainer.logger=console`` (one string)       ``trainer.logger=[console]`` (verl wraps it in a list)
``rollout.load_format``                      dropped, logged (`INERT_CHOICES`): the engine's first weights
``data.filter_overlong_prompts_workers``     dropped, logged (`INERT_COUNTS`): one batched tokenizer call
Megatron's key renames and inert switches     `rlflow.config.megatron_layout` (`MEGATRON_KEY_ALIASES`,
(``<role>.megatron.*``)                      `MEGATRON_INERT_FLAGS`)
``+data.<name>...`` with ``data.custom_cls``  ``data.custom_options.<name>...`` (the dataset class's own
(a dataset class's own options)              options: `rlflow.config.dataset_options`)
``model_engine`` and the VeOmni, Automodel     `rlflow.config.engine_layouts`
and MindSpeed sections (``<role>.veomni.*``,
``automodel_config.*``, ``mindspeed.*``)
verl's switches of features rlflow lacks, at   dropped, logged; another value is refused with what to do
their off value (agent loop, tracing,         (`rlflow.config.verl_defaults_only`)
curriculum sampler, ...)
==========================================  ==============================================

The early-2025 spelling (one verl release, e.g. its ``run_deepseek7b_llm_sp2.sh`` at that time) had no
on/off switch for the two KL terms: a coefficient of 0 (the default) left a term out. rlflow's switches
follow the coefficient, so both terms do exactly what that release computed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from rlflow.config.dataset_options import rewrite_dataset_options
from rlflow.config.engine_layouts import rewrite_engine_overrides
from rlflow.config.megatron_layout import (
    MEGATRON_INERT_FLAGS,
    MEGATRON_KEY_ALIASES,
    rewrite_megatron_overrides,
)
from rlflow.config.override_syntax import note_once, parse_bool, same_value, split_override, unquote
from rlflow.config.profiler_layout import rewrite_profiler_overrides
from rlflow.config.rollout_checks import VLLM_ENGINE_KWARGS_OWNED
from rlflow.config.verl_defaults_only import drop_default_only

logger = logging.getLogger(__name__)

__all__ = [
    "COEF_ALIASES",
    "FLAG_ALIASES",
    "INERT_CHOICES",
    "INERT_COUNTS",
    "INERT_FLAGS",
    "KEY_ALIASES",
    "SCALAR_AS_LIST",
    "canonical_key",
    "rewrite_critic_file_keys",
    "rewrite_overrides",
]

KEY_ALIASES: dict[str, str] = {
    # first match wins: a whole key before the prefix that would otherwise take it
    "actor_rollout_ref.actor.fsdp_config.strategy": "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.ref.fsdp_config.strategy": "actor_rollout_ref.ref.strategy",
    "critic.model.fsdp_config.strategy": "critic.strategy",
    "critic.fsdp_config.strategy": "critic.strategy",
    **{
        f"{role}.fsdp_config.ulysses_sequence_parallel_size": f"{role}.ulysses_sequence_parallel_size"
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    },
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
    "critic.model.fsdp_config": "critic.fsdp_config",
    "critic.fsdp": "critic.fsdp_config",
    "actor_rollout_ref.actor.fsdp_config.qat": "actor_rollout_ref.actor.qat",
    "reward_model.model_path": "reward_model.model.path",
    "reward_model.rollout": "reward_model.inference",
    "ray_kwargs.ray_init": "ray_init",
    "ray_kwargs.timeline_json_file": "trainer.ray_timeline_json_file",
    "actor_rollout_ref.actor.kl_loss.type": "actor_rollout_ref.actor.kl_loss_type",
    "algorithm.in_reward_kl.type": "algorithm.kl_penalty",
    "algorithm.in_reward_kl.kl_ctrl": "algorithm.kl_ctrl",
    "actor_rollout_ref.model.use_rmpad": "actor_rollout_ref.model.use_remove_padding",
    "critic.model.use_rmpad": "critic.model.use_remove_padding",
    "reward_model.model.use_rmpad": "reward_model.model.use_remove_padding",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": (
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes"
    ),
    "actor_rollout_ref.actor.optim.clip_grad": "actor_rollout_ref.actor.grad_clip",
    "critic.optim.clip_grad": "critic.grad_clip",
    "trainer.val_generations_to_log_to_wandb": "trainer.log_val_generations",
    "data.enable_thinking": "data.apply_chat_template_kwargs.enable_thinking",
    "actor_rollout_ref.ref.param_offload": "actor_rollout_ref.ref.fsdp_config.param_offload",
    "reward_model.param_offload": "reward_model.model.fsdp_config.param_offload",
    "reward_model.sandbox_fusion_url": "reward_model.sandbox_fusion.url",
    "actor_rollout_ref.rollout.max_batch_size": "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.actor.optim.lr_decay_style": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "critic.optim.lr_decay_style": "critic.optim.lr_scheduler_type",
    "actor_rollout_ref.model.lora.rank": "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora.alpha": "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.lora.target_modules": "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.actor.policy_loss.tau_pos": "actor_rollout_ref.actor.tau_pos",
    "actor_rollout_ref.actor.policy_loss.tau_neg": "actor_rollout_ref.actor.tau_neg",
    "actor_rollout_ref.rollout.enable_sleep_mode": "actor_rollout_ref.rollout.free_cache_engine",
    "reward.custom_reward_function": "custom_reward_function",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    "reward.num_workers": "reward_model.num_workers",
    "reward.sandbox_fusion": "reward_model.sandbox_fusion",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.reward_model.rollout": "reward_model.inference",
    "actor_rollout_ref.rollout.disable_log_stats": "actor_rollout_ref.rollout.engine_kwargs.vllm.disable_log_stats",
    **{
        f"actor_rollout_ref.rollout.engine_kwargs.vllm.{kwarg}": target
        for kwarg, target in VLLM_ENGINE_KWARGS_OWNED.items()
        if target.startswith("actor_rollout_ref.rollout.") and kwarg != "dtype"
    },
    **MEGATRON_KEY_ALIASES,
}
"""verl key (or key prefix) -> rlflow key."""

FLAG_ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.use_gpg_loss": "actor_rollout_ref.actor.policy_loss.loss_mode=gpg",
    "actor_rollout_ref.model.use_liger": "actor_rollout_ref.model.use_fused_kernels=true",
    "actor_rollout_ref.model.use_prefix_tree": "actor_rollout_ref.model.use_shared_prompts=true",
}
"""verl boolean key -> the rlflow override it stands for when true (dropped when false)."""

VALUE_ALIASES: dict[str, dict[str, str]] = {
    "algorithm.rollout_correction.loss_type": {
        "ppo_clip": "algorithm.rollout_correction.use_policy_gradient=false",
        "reinforce": "algorithm.rollout_correction.use_policy_gradient=true",
    },
}
"""verl key -> {its value: the rlflow override that value stands for}; another value is refused."""

_ENTROPY_ALWAYS = (
    "rlflow always computes the entropy in row blocks of the logits and recomputes the softmax in the "
    "backward (rlflow.utils.torch_functional.entropy_from_logits): what true asks for, at no cost when false"
)
INERT_FLAGS: dict[str, str] = {
    **{
        f"actor_rollout_ref.{role}.{key}": _ENTROPY_ALWAYS
        for role in ("actor", "ref")
        for key in ("entropy_from_logits_with_chunking", "entropy_checkpointing")
    },
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing": _ENTROPY_ALWAYS,
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": (
        "the reference policy has no optimizer (forward only); verl's engine config lists the key for every role"
    ),
    **{
        f"{section}.use_shm": (
            "verl copies the model into /dev/shm to load it faster; rlflow reads model.path once, on rank 0 "
            "(the other ranks receive their shards), with the same result either way"
        )
        for section in ("actor_rollout_ref.model", "critic.model", "reward_model.model")
    },
    "data.use_shm": (
        "verl copies the data files into /dev/shm first; rlflow's driver reads each parquet file once"
    ),
    "data.return_multi_modal_inputs": (
        "rlflow's data is text: a row with an image or video column is refused when the dataset is read"
    ),
    "data.return_raw_input_ids": (
        "a reward model with its own tokenizer re-tokenizes each conversation from its chat messages "
        "(reward_model.model.input_tokenizer with data.return_raw_chat=true), not from the policy's ids"
    ),
    "actor_rollout_ref.rollout.multi_stage_wake_up": (
        "SGLang's staged wake-up (weights first, then the KV cache) bounds its peak memory while it wakes; "
        "rlflow's engines (hf, vllm) receive the weights in buckets of "
        "rollout.update_weights_bucket_megabytes and start the KV cache only when they generate"
    ),
    "actor_rollout_ref.rollout.layered_summon": (
        "verl gathers LoRA weights layer by layer to bound the memory of the sync; rlflow's sync always "
        "gathers in buckets of rollout.update_weights_bucket_megabytes and folds the adapters bucket by bucket"
    ),
    **MEGATRON_INERT_FLAGS,
}
"""verl boolean keys whose both values rlflow's one code path satisfies: checked to be booleans, logged,
and dropped (no schema key would change anything)."""

INERT_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "actor_rollout_ref.model.prefix_tree_attention": (
        ("flex", "magi"),
        "the attention kernel of verl's prefix-tree packing; rlflow's shared-prompt packing "
        "(model.use_shared_prompts) attends each sample's branch to its prompt with its own packed attention",
    ),
    "actor_rollout_ref.rollout.load_format": (
        (
            "dummy",
            "dummy_dtensor",
            "auto",
            "safetensors",
            "hf",
            "pt",
            "dtensor",
            "dummy_hf",
            "dummy_megatron",
        ),
        "how verl's vLLM loads its first weights; rlflow's engine starts on dummy weights and receives the "
        "actor's before every generation, which is what each of these formats ends in",
    ),
}
"""verl keys whose every listed value rlflow's one code path satisfies -> (those values, why): checked,
logged and dropped; another value is refused naming the key."""

INERT_COUNTS: dict[str, str] = {
    "data.filter_overlong_prompts_workers": (
        "verl's processes for measuring prompt lengths; rlflow tokenizes every prompt in one batched call of "
        "the fast tokenizer, which spreads the work over threads itself"
    ),
}
"""verl keys holding a number of workers for work rlflow does another way: checked to be integers >= 1,
logged and dropped."""

SCALAR_AS_LIST = ("trainer.logger",)
"""List keys verl also takes as one string (its tracker wraps ``logger=console`` in a list): a scalar
value is given as a one-element list."""

COEF_ALIASES: dict[str, tuple[str, str]] = {
    "actor_rollout_ref.actor.kl_loss.coef": (
        "actor_rollout_ref.actor.kl_loss_coef",
        "actor_rollout_ref.actor.use_kl_loss",
    ),
    "algorithm.in_reward_kl.coef": ("algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward"),
}
"""early verl coefficient key -> (rlflow's coefficient key, the switch that is on exactly when it is > 0)."""


def canonical_key(key: str) -> str:
    """rlflow's spelling of the dotted ``key`` (unchanged when no alias applies)."""
    for alias, target in KEY_ALIASES.items():
        if key == alias or key.startswith(alias + "."):
            return target + key[len(alias) :]
    return key


def rewrite_overrides(overrides: Iterable[str]) -> list[str]:
    """Rewrite verl-spelled keys in Hydra overrides (``key=value``, ``+key=value``, ``~key``).

    Arguments that are not overrides (``--cfg``, ``job``, ``-m``) and ``hydra.*`` keys pass through.

    Args:
        overrides: the overrides as typed on the command line.

    Returns:
        The same overrides with rlflow's keys: verl's Megatron keys are read onto FSDP2's first
        (`rlflow.config.megatron_layout`), verl's later profiler layout onto rlflow's profiler keys last
        (`rlflow.config.profiler_layout`).
    """
    overrides = rewrite_dataset_options(overrides)
    overrides = rewrite_megatron_overrides(rewrite_engine_overrides(overrides, canonical_key))
    out = []
    renamed: dict[str, str] = {}  # rlflow key -> the verl-spelled override renamed onto it
    for item in overrides:
        if item.startswith("-") or ("=" not in item and not item.startswith("~")):
            out.append(item)
            continue
        prefix, key, rest = split_override(item)
        if key in FLAG_ALIASES:
            out.extend(_flag(key, rest.removeprefix("="), out, overrides))
            continue
        if key in INERT_FLAGS and rest and prefix != "~":
            parse_bool(key, rest.removeprefix("="))
            note_once(logger, key, "config key %s%s changes nothing: %s", key, rest, INERT_FLAGS[key])
            continue
        if key in INERT_COUNTS and rest and prefix != "~":
            _inert_count(key, unquote(rest.removeprefix("=")))
            continue
        if key in INERT_CHOICES and rest and prefix != "~":
            _inert_choice(key, unquote(rest.removeprefix("=")))
            continue
        if key in VALUE_ALIASES and rest.startswith("=") and prefix != "~":
            out.append(_value_alias(key, unquote(rest.removeprefix("="))))
            continue
        if key in COEF_ALIASES and rest:
            out.extend(_coef(key, rest.removeprefix("=")))
            continue
        if rest.startswith("=") and prefix != "~" and drop_default_only(key, rest.removeprefix("=")):
            continue
        new = canonical_key(key)
        if new != key:
            _note(key, new)
            if rest and key not in MEGATRON_KEY_ALIASES:  # megatron_layout orders its own keys
                renamed.setdefault(new, item)
        if new in SCALAR_AS_LIST and prefix != "~":
            rest = _as_list(rest)
        out.append(prefix + new + rest)
    _check_renamed(out, renamed)
    return rewrite_profiler_overrides(out)


def _check_renamed(overrides: list[str], renamed: dict[str, str]) -> None:
    """A verl spelling and another override of the same rlflow key must agree (Hydra would keep the last)."""
    first: dict[str, str] = {}
    for item in overrides:
        _, key, rest = split_override(item)
        if key not in renamed or not rest:
            continue
        value = unquote(rest.removeprefix("="))
        if key in first and not same_value(key, first[key], value):
            raise ValueError(
                f"{renamed[key]} is verl's spelling of {key}, and the command line sets {key} to {first[key]} and "
                f"to {value}; drop one of them"
            )
        first.setdefault(key, value)


def _as_list(rest: str) -> str:
    """``=console`` -> ``=[console]``; a list, ``null`` or an interpolation stays as it is."""
    value = rest.removeprefix("=").strip()
    if not rest.startswith("=") or not value or value[0] in "[$" or value.lower() in ("null", "none"):
        return rest
    return f"=[{value}]"


def _inert_count(key: str, value: str) -> None:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{key}={value!r} must be a whole number >= 1 ({INERT_COUNTS[key]})")
    note_once(logger, key, "config key %s=%s changes nothing: %s", key, value, INERT_COUNTS[key])


def _inert_choice(key: str, value: str) -> None:
    choices, why = INERT_CHOICES[key]
    if value not in choices:
        raise ValueError(f"{key}={value!r} must be one of {list(choices)} ({why})")
    note_once(logger, key, "config key %s=%s changes nothing: %s", key, value, why)


def _flag(key: str, value: str, done: list[str], overrides: Iterable[str]) -> list[str]:
    """The override a verl boolean alias stands for (``[]`` when false); refuses a contradiction."""
    if not parse_bool(key, value):
        _note(f"{key}={value}", "no override")
        return []
    target = FLAG_ALIASES[key]
    target_key, _, target_value = target.partition("=")
    for other in [*done, *overrides]:
        _, other_key, other_value = split_override(other)
        if other_key == target_key and not same_value(other_key, other_value.removeprefix("="), target_value):
            raise ValueError(f"{key}={value} means {target}, but the command line also sets {other}")
    _note(f"{key}={value}", target)
    return [target]


def _value_alias(key: str, value: str) -> str:
    """The override a `VALUE_ALIASES` key's ``value`` stands for."""
    choices = VALUE_ALIASES[key]
    if value not in choices:
        raise ValueError(f"{key}={value!r} must be one of {sorted(choices)} (verl's names)")
    _note(f"{key}={value}", choices[value])
    return choices[value]


def _coef(key: str, value: str) -> list[str]:
    """The two overrides an early verl KL coefficient stands for (see the module docstring)."""
    target, switch = COEF_ALIASES[key]
    try:
        coef = float(unquote(value))
    except ValueError:
        raise ValueError(f"{key}={value}: expected a number") from None
    out = [f"{target}={value}", f"{switch}={'true' if coef > 0 else 'false'}"]
    _note(f"{key}={value}", " ".join(out))
    return out


def rewrite_critic_file_keys(content: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a critic config file (relative to ``critic``) with verl's spellings rewritten.

    Args:
        content: the file's mapping (plain containers).

    Returns:
        A new nested dict; ``model.fsdp_config`` becomes ``fsdp_config``, and so on.
    """
    out: dict[str, Any] = {}
    for path, value in _flatten(content, ""):
        new = canonical_key(f"critic.{path}")
        if new != f"critic.{path}":
            _note(f"critic.{path}", new)
        _set(out, new.removeprefix("critic.").split("."), value)
    return out


def _flatten(tree: Mapping[str, Any], prefix: str) -> list[tuple[str, Any]]:
    items = []
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value and canonical_key(f"critic.{path}") == f"critic.{path}":
            items.extend(_flatten(value, path))
        else:
            items.append((path, value))
    return items


def _set(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    if isinstance(value, Mapping) and isinstance(tree.get(parts[-1]), dict):
        tree[parts[-1]].update(value)
    else:
        tree[parts[-1]] = value


def _note(old: str, new: str) -> None:
    note_once(logger, old, "config key %s is verl's spelling of %s (accepted as an alias)", old, new)
