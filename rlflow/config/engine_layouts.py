"""verl's other training engines (``model_engine=veomni|automodel|mindspeed``) read onto rlflow's FSDP2 keys.

verl trains with one of several engines, picked by ``model_engine`` (and ``<role>.strategy``), each with
its own section per role. rlflow has one: FSDP (FSDP2 by default), with Ulysses sequence parallelism.
VeOmni and NeMo Automodel are FSDP2 engines too, and MindSpeed is Megatron-LM on Ascend NPUs, whose keys
verl shares with its Megatron engine. Before the config is composed their overrides are rewritten onto
rlflow's keys (each rewrite logged once), so their scripts port with environment edits only:

===================================================  ======================================================
verl                                                 rlflow
===================================================  ======================================================
``model_engine=dp|fsdp|megatron|veomni|automodel|     dropped, logged: the engine is FSDP (another value is
mindspeed``; ``<role>.strategy=veomni|automodel|      refused); the strategy is ``fsdp2``
mindspeed``
``<role>.veomni.{param,optimizer}_offload``,          ``<role>.fsdp_config.*`` (``enable_fsdp_offload`` is
``enable_fsdp_offload``, ``fsdp_size``,               FSDP2's CPU offload policy: ``param_offload``;
``forward_prefetch``                                  the reference's optimizer offload is dropped)
``<role>.veomni.enable_full_shard``                   ``<role>.fsdp_config.reshard_after_forward`` (false
                                                      is ZeRO-2)
``<role>.veomni.ulysses_parallel_size``,              ``<role>.ulysses_sequence_parallel_size``
``automodel_config.cp_size``
``<role>.veomni.use_torch_compile``,                  ``<role>.use_torch_compile`` (actor, reference)
``automodel_config.use_torch_compile``
``automodel_config.{param,optimizer}_offload``        ``<role>.fsdp_config.*``
``automodel_config.activation_checkpointing``         ``<model>.enable_gradient_checkpointing`` (actor,
                                                      critic)
``automodel_config.model_dtype``                      ``<role>.fsdp_config.mixed_precision.param_dtype``
``<role>.mindspeed.*`` (Megatron's sizes, offloads,   ``<role>.megatron.*``, then `rlflow.config.
bridge, checkpoint keys), ``mindspeed.llm_kwargs.     megatron_layout` (recompute: gradient checkpointing)
recompute_*``
kernel and speed switches (attention, MoE, loss and   dropped, logged (`KERNEL_CHOICES`, `INERT`): how the
norm kernels, compile, overlap, init device, ...)     engine computes, not what
architecture keys of ``mindspeed.llm_kwargs``         dropped, logged: rlflow reads the architecture from
                                                      the model's ``config.json``
``seed``, ``full_determinism``, ``enable_fp8``,       their defaults only (`DEFAULT_ONLY`); another value is
``activation_gpu_limit``, ``hidden_dropout``, ...     refused with what to do
===================================================  ======================================================

Expert and tensor parallel sizes are checked to be whole numbers and logged: FSDP2 shards every weight,
experts included, over all ranks of the role. Any other key of these sections is refused, naming it.
An engine key that sets the same rlflow key as another override, to another value, is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from rlflow.config.override_syntax import check_produced, note_once, parse_bool, split_override, unquote

logger = logging.getLogger(__name__)

__all__ = ["ENGINES", "rewrite_engine_overrides"]

ACTOR, REF, CRITIC = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"
ROLES = (ACTOR, REF, CRITIC)
ENGINES = ("dp", "fsdp", "megatron", "veomni", "automodel", "mindspeed")
"""verl's ``model_engine`` values: every one runs on rlflow's FSDP engine."""
_FSDP_STRATEGIES = ("veomni", "automodel", "mindspeed")
_NULL = ("null", "none", "~", "")
_GC_KEY = {
    ACTOR: "actor_rollout_ref.model.enable_gradient_checkpointing",
    CRITIC: "critic.model.enable_gradient_checkpointing",
}

_KERNEL = "a kernel choice (how the engine computes a layer, not what it computes)"
KERNEL_CHOICES: dict[str, str] = {
    "veomni.attn_implementation": _KERNEL,
    "veomni.moe_implementation": _KERNEL,
    "veomni.cross_entropy_loss_implementation": _KERNEL,
    "veomni.dsa_indexer_implementation": _KERNEL,
    "veomni.dsa_attention_implementation": _KERNEL,
    "veomni.mhc_implementation": _KERNEL,
    "veomni.init_device": "where the engine materialises the weights before loading them",
    "veomni.ckpt_manager": "how the engine writes its checkpoints (rlflow's are torch.distributed.checkpoint)",
    "veomni.strategy": "the engine's name (rlflow's engine is FSDP2)",
    "automodel_config.distributed_strategy": (
        "data parallelism over the role's ranks, sharded or not (rlflow shards with FSDP2: the same update)"
    ),
    "automodel_config.attn_implementation": _KERNEL,
    "automodel_config.backend_config.*": _KERNEL,
    "mindspeed.strategy": "the engine's name (rlflow's engine is FSDP2)",
}
"""Engine keys whose every value computes what rlflow computes -> why (logged and dropped).
``veomni.attn_implementation=native-sparse`` (a different attention) is the exception, refused."""

_ARCH = "the architecture, which rlflow reads from the model's config.json"
_SPEED = "a speed or memory switch of the engine (the update is the same)"
_SIZES = (
    "rlflow's micro-batches and lengths come from ppo_micro_batch_size_per_gpu / the token budgets and data.*"
)
INERT: dict[str, str] = {
    "veomni.forward_only": "verl sets it for roles without a backward; rlflow knows them",
    "veomni.enable_reentrant": "which activation-checkpointing variant recomputes (the same gradients)",
    "veomni.force_use_huggingface": "rlflow always trains the Hugging Face modules",
    "veomni.mixed_precision": (
        "the compute dtype is <role>.fsdp_config.mixed_precision.param_dtype (fp32 by default; bf16 is "
        "what verl's engines use)"
    ),
    "automodel_config.forward_only": "verl sets it for roles without a backward; rlflow knows them",
    "automodel_config.enable_compile": _SPEED,
    "automodel_config.entropy_from_logits_with_chunking": "rlflow's entropy is always computed in row blocks",
    "automodel_config.entropy_checkpointing": "rlflow's entropy is always recomputed in the backward",
    **{
        f"mindspeed.llm_kwargs.{key}": _ARCH
        for key in (
            "use_mcore_models",
            "spec",
            "qk_layernorm",
            "position_embedding_type",
            "normalization",
            "disable_bias_linear",
            "swiglu",
            "group_query_attention",
            "num_query_groups",
            "use_rotary_position_embeddings",
            "init_method_std",
        )
    },
    **{
        f"mindspeed.llm_kwargs.{key}": _SPEED
        for key in (
            "attention_softmax_in_fp32",
            "no_gradient_accumulation_fusion",
            "transformer_impl",
            "use_flash_attn",
            "use_fused_rotary_pos_emb",
            "use_fused_swiglu",
            "use_fused_rmsnorm",
            "no_masked_softmax_fusion",
            "sequence_parallel",
            "use_distributed_optimizer",
            "overlap_grad_reduce",
            "overlap_param_gather",
            "context_parallel_algo",
            "initial_loss_scale",
        )
    },
    **{
        f"mindspeed.llm_kwargs.{key}": _SIZES
        for key in ("seq_length", "micro_batch_size", "no_pad_to_seq_lengths", "reset_attention_mask")
    },
    "mindspeed.llm_kwargs.attention_mask_type": "rlflow's packed attention is causal within each sequence",
}
"""Engine keys (any value) that change nothing in rlflow -> why (logged and dropped)."""

DEFAULT_ONLY: dict[str, tuple[tuple[str, ...], str]] = {
    **{
        f"{section}.seed": (
            ("42",),
            "rlflow seeds every worker from trainer.seed: set trainer.seed instead",
        )
        for section in ("veomni", "automodel_config")
    },
    **{
        f"{section}.full_determinism": (
            ("false",),
            "not a switch in rlflow: its CPU runs repeat bit for bit; on a GPU set CUBLAS_WORKSPACE_CONFIG and "
            "torch's deterministic algorithms in the workers' environment (ray_init.runtime_env.env_vars)",
        )
        for section in ("veomni", "automodel_config")
    },
    "veomni.activation_gpu_limit": (
        ("0", "0.0"),
        "offloading activations above a GPU-memory limit is not supported: model.enable_gradient_checkpointing "
        "bounds the activations' memory",
    ),
    "automodel_config.enable_fp8": (("false",), "fp8 training is not supported: drop the key"),
    "mindspeed.llm_kwargs.hidden_dropout": (
        ("0", "0.0"),
        "rlflow trains with the model's own dropout settings (0 in the models verl's scripts train): drop the key",
    ),
    "mindspeed.mm_kwargs": (
        ("{}",),
        "MindSpeed-MM (multimodal models) is not supported: rlflow trains text models",
    ),
}
"""Engine keys accepted at their default only -> (those values, lower-case; why and what to do)."""

_PARALLEL_SIZES = (
    "veomni.expert_parallel_size",
    *(f"automodel_config.{k}" for k in ("tp_size", "pp_size", "ep_size")),
)
_MEGATRON_SHARED = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "context_parallel_size",
    "param_offload",
    "optimizer_offload",
    "grad_offload",
    "use_mbridge",
    "vanilla_mbridge",
    "use_dist_checkpointing",
    "dist_checkpointing_path",
)
"""``<role>.mindspeed.*`` keys that are verl's Megatron keys (`rlflow.config.megatron_layout` reads them)."""


def rewrite_engine_overrides(
    overrides: Iterable[str], canonical: Callable[[str], str] = lambda key: key
) -> list[str]:
    """Rewrite verl's engine choice and its VeOmni, Automodel and MindSpeed sections onto rlflow's keys.

    Args:
        overrides: command-line overrides.
        canonical: rlflow's spelling of a key (`rlflow.config.aliases.canonical_key`), to find another
            override of a key an engine key sets.

    Returns:
        The overrides with each engine key replaced by rlflow's (or by ``<role>.megatron.*`` for MindSpeed,
        which `rlflow.config.megatron_layout` reads next), or dropped with a log line.

    Raises:
        ValueError: an engine key or value rlflow has no meaning for, or one that contradicts another
            override, naming it and what to do.
    """
    overrides = list(overrides)
    out: list[str] = []
    produced: dict[str, tuple[str, str]] = {}  # rlflow key -> (the engine override that set it, value)
    for item in overrides:
        if item.startswith("-") or "=" not in item:
            out.append(item)
            continue
        prefix, key, rest = split_override(item)
        value = unquote(rest.removeprefix("="))
        role, section = _engine_section(key)
        if key == "model_engine" and prefix != "~":
            _engine(value)
        elif key in {f"{r}.strategy" for r in ROLES} and value in _FSDP_STRATEGIES:
            _note(key, f"{key}={value} runs as {key}=fsdp2 (rlflow.config.engine_layouts)")
            out.append(f"{key}=fsdp2")
        elif role is not None and prefix != "~":
            sub = key.removeprefix(f"{role}.")
            for new in _section_key(role, section, sub, value):
                new_key, _, new_value = new.partition("=")
                produced.setdefault(new_key, (f"{key}={value}", new_value))
                out.append(new)
        else:
            out.append(item)
    check_produced(
        out,
        produced,
        "{origin} sets {key}={value}, but the command line also sets {item}; drop one of them",
        canonical,
    )
    return out


def _engine_section(key: str) -> tuple[str | None, str]:
    """``(role, section)`` of an engine key (``veomni``, ``automodel_config`` or ``mindspeed``)."""
    for role in ROLES:
        for section in ("veomni", "automodel_config", "mindspeed"):
            if key.startswith(f"{role}.{section}."):
                return role, section
    return None, ""


def _section_key(role: str, section: str, sub: str, value: str) -> list[str]:
    """rlflow's overrides for ``<role>.<sub>=value``, ``sub`` starting with ``section``."""
    key = f"{role}.{sub}"
    generic = (
        sub if not sub.startswith("automodel_config.backend_config.") else "automodel_config.backend_config.*"
    )
    if generic in KERNEL_CHOICES:
        if sub == "veomni.attn_implementation" and value == "native-sparse":
            raise ValueError(
                f"{key}=native-sparse: sparse attention computes another function than the model's dense "
                "attention, which rlflow trains: drop the key or pick a dense attention"
            )
        _note(key, f"config key {key}={value} changes nothing: {KERNEL_CHOICES[generic]}")
        return []
    if sub in INERT:
        _note(key, f"config key {key}={value} changes nothing: {INERT[sub]}")
        return []
    if sub in DEFAULT_ONLY:
        off, why = DEFAULT_ONLY[sub]
        if value.lower() not in off:
            raise ValueError(f"{key}={value!r}: {why}")
        _note(key, f"config key {key}={value} changes nothing: {why}")
        return []
    if sub in _PARALLEL_SIZES:
        if value.lower() not in _NULL and (not value.isdigit() or int(value) < 1):
            raise ValueError(f"{key}={value!r} must be a whole number >= 1 (or null)")
        _note(
            key,
            f"config key {key}={value} changes nothing: FSDP2 shards every weight, experts included, over all "
            f"ranks of {role} instead of splitting the model",
        )
        return []
    if section == "veomni":
        return _veomni(role, sub.removeprefix("veomni."), value)
    if section == "automodel_config":
        return _automodel(role, sub.removeprefix("automodel_config."), value)
    return _mindspeed(role, sub.removeprefix("mindspeed."), value)


def _offload(role: str, what: str, value: str, key: str) -> list[str]:
    """``<role>.fsdp_config.<what>_offload``; the reference's optimizer offload is dropped."""
    if what == "optimizer" and role == REF:
        parse_bool(key, value)
        _note(key, f"config key {key}={value} changes nothing: the reference has no optimizer")
        return []
    return [f"{role}.fsdp_config.{what}_offload={value}"]


def _veomni(role: str, sub: str, value: str) -> list[str]:
    key = f"{role}.veomni.{sub}"
    if sub in ("param_offload", "optimizer_offload"):
        return _offload(role, sub.removesuffix("_offload"), value, key)
    if sub == "enable_fsdp_offload":
        return [f"{role}.fsdp_config.param_offload=true"] if parse_bool(key, value) else []
    if sub in ("fsdp_size", "forward_prefetch"):
        return [f"{role}.fsdp_config.{sub}={value}"]
    if sub == "enable_full_shard":
        return [f"{role}.fsdp_config.reshard_after_forward={value}"]
    if sub == "ulysses_parallel_size":
        return [f"{role}.ulysses_sequence_parallel_size={value}"]
    if sub == "use_torch_compile":
        return _compile(role, value, key)
    raise ValueError(_unknown(key, "veomni"))


def _automodel(role: str, sub: str, value: str) -> list[str]:
    key = f"{role}.automodel_config.{sub}"
    if sub in ("param_offload", "optimizer_offload"):
        return _offload(role, sub.removesuffix("_offload"), value, key)
    if sub == "cp_size":
        return [f"{role}.ulysses_sequence_parallel_size={value}"]
    if sub == "activation_checkpointing":
        if role not in _GC_KEY:
            parse_bool(key, value)
            _note(key, f"config key {key}={value} changes nothing: the reference has no backward")
            return []
        return [f"{_GC_KEY[role]}={value}"]
    if sub == "model_dtype":
        return [f"{role}.fsdp_config.mixed_precision.param_dtype={value}"]
    if sub == "use_torch_compile":
        return _compile(role, value, key)
    raise ValueError(_unknown(key, "automodel_config"))


def _mindspeed(role: str, sub: str, value: str) -> list[str]:
    key = f"{role}.mindspeed.{sub}"
    if sub in _MEGATRON_SHARED:
        _note(
            key,
            f"config key {key} is verl's Megatron key {role}.megatron.{sub} (rlflow.config.megatron_layout)",
        )
        return [f"{role}.megatron.{sub}={value}"]
    if sub.startswith("mm_kwargs."):
        raise ValueError(f"{key}: {DEFAULT_ONLY['mindspeed.mm_kwargs'][1]}")
    recompute = sub.removeprefix("llm_kwargs.")
    if recompute in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        return [f"{role}.megatron.override_transformer_config.{recompute}={value}"]
    raise ValueError(_unknown(key, "mindspeed"))


def _compile(role: str, value: str, key: str) -> list[str]:
    """``use_torch_compile`` of the actor and the reference (the log-prob kernels); the critic has none."""
    if role == CRITIC:
        parse_bool(key, value)
        _note(key, f"config key {key}={value} changes nothing: the critic computes values, not log-probs")
        return []
    return [f"{role}.use_torch_compile={value}"]


def _unknown(key: str, section: str) -> str:
    known = sorted(
        k.removeprefix(f"{section}.")
        for k in (*KERNEL_CHOICES, *INERT, *DEFAULT_ONLY, *_PARALLEL_SIZES)
        if k.startswith(f"{section}.")
    )
    return (
        f"{key}: not one of the {section} keys rlflow reads onto FSDP2 (it reads the offloads, FSDP and "
        f"sequence-parallel sizes, and logs {known}); drop it (docs/migrating_from_verl.md, verl's engines)"
    )


def _engine(value: str) -> None:
    if value not in ENGINES:
        raise ValueError(
            f"model_engine={value!r} must be one of {list(ENGINES)} (verl's engines; each runs as rlflow's FSDP2 "
            "engine, its section read by rlflow.config.engine_layouts): for FSDP2 set actor_rollout_ref.actor."
            "strategy=fsdp2 and its fsdp_config.* keys"
        )
    _note("model_engine", f"config key model_engine={value} changes nothing: rlflow's engine is FSDP")


def _note(key: str, message: str) -> None:
    note_once(logger, key, "%s", message)
