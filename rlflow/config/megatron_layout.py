"""verl's Megatron-LM scripts (``strategy=megatron``, ``<role>.megatron.*``) read onto rlflow's FSDP2 keys.

rlflow trains with one backend, FSDP (FSDP2 by default). verl's Megatron scripts run the same algorithm
and split the model differently: tensor (TP), pipeline (PP), context (CP) and expert (EP) parallelism.
Before the config is composed, their overrides are rewritten onto rlflow's keys (each rewrite logged
once), so a Megatron script ports with environment edits only:

=========================================================  =================================================
verl                                                       rlflow
=========================================================  =================================================
``<role>.strategy=megatron``                               ``strategy=fsdp2``: every weight, gradient and
                                                           optimizer moment sharded over all the role's
                                                           ranks, which holds at most what one Megatron
                                                           rank holds
``megatron.{tensor,pipeline,virtual_pipeline,expert,       ``<role>.megatron.*``: checked as Megatron checks
expert_tensor}_model_parallel_size``                       them (TP x PP x CP divides the role's ranks,
                                                           PP x EP x ETP too); FSDP2 needs no such split
``megatron.context_parallel_size``                         ``<role>.ulysses_sequence_parallel_size`` (the
                                                           sequence split over ranks; Ulysses needs the
                                                           attention heads divisible by it)
``megatron.{param,optimizer,grad}_offload``                ``<role>.fsdp_config.*`` (gradients are offloaded
                                                           with the parameters)
``megatron.dtype``                                         ``<role>.fsdp_config.mixed_precision.param_dtype``
``megatron.use_dist_checkpointing`` /                      ``<role>.megatron.*``: the weights come from
``dist_checkpointing_path``                                ``model.path`` (the Hugging Face checkpoint verl
                                                           converts into that path); logged
``megatron.use_mbridge`` / ``vanilla_mbridge``             dropped, logged: how verl maps Hugging Face
                                                           weights into Megatron's modules
``megatron.override_transformer_config.                    ``model.enable_gradient_checkpointing=true``
recompute_granularity=full|selective``                     (actor, critic; every decoder layer recomputed);
                                                           ``recompute_method`` / ``recompute_num_layers``
                                                           / ``recompute_modules`` checked and logged
``override_transformer_config`` kernel switches (fusions,  dropped, logged (`KERNEL_SWITCHES`): how Megatron
flash attention, MoE dispatch, pipeline stage split)       computes, not what
``override_transformer_config.moe_aux_loss_coeff`` /       the actor's: ``actor_rollout_ref.actor.
``moe_z_loss_coeff``                                       moe_aux_loss_coef`` / ``moe_z_loss_coef`` (router
                                                           losses from the Hugging Face MoE forward's router
                                                           logits, `rlflow.algos.moe`); the critic's and the
                                                           reference's: ``0`` only
``override_transformer_config.                             ``0`` only (no aux-loss-free bias update)
moe_router_bias_update_rate``
``override_transformer_config.dsa_indexer_loss_coeff``    its off value only (0)
``override_transformer_config.mtp_num_layers`` /           the actor's: ``actor_rollout_ref.model.mtp.
``mtp_loss_scaling_factor`` / ``mtp_use_repeated_layer`` / num_layers`` / ``mtp_loss_scaling_factor`` /
``mtp_hybrid_override_pattern``                            ``use_repeated_layer`` / ``hybrid_override_pattern``
                                                           (`rlflow.config.mtp_schema`); ``keep_mtp_spec_in_
                                                           bf16`` dropped, logged
``override_transformer_config.fp8`` / ``fp8_recipe``       ``<role>.fsdp_config.fp8.format`` / ``recipe``
                                                           (actor, critic: TE's recipes emulated,
                                                           `rlflow.config.megatron_precision`;
                                                           ``delayed`` refused, and
                                                           so ``fp8`` without a recipe); the optimizer's
                                                           ``fp8_recipe`` dropped, logged
``override_transformer_config.                             ``aux_loss`` (rlflow's load-balancing loss) or
moe_router_load_balancing_type``                           ``none`` without an aux-loss coefficient
``actor.optim.override_optimizer_config.                   ``actor_rollout_ref.actor.fsdp_config.
optimizer_cpu_offload=true``                               optimizer_offload=true`` (the whole state;
                                                           ``optimizer_offload_fraction`` in (0, 1] checked)
``megatron.use_remove_padding``                            ``actor_rollout_ref.model.use_remove_padding``
                                                           (actor, reference), ``critic.model.
                                                           use_remove_padding`` (Megatron's packed format)
``megatron.{use_distributed_optimizer,sequence_parallel,   dropped, logged: how Megatron shards the optimizer
use_megatron_fsdp}``                                       and the activations (FSDP2 shards both)
``actor.megatron.qat.*``                                   ``actor_rollout_ref.actor.qat.*`` (QAT,
                                                           `rlflow.config.megatron_precision`);
                                                           ``bypass_te_fp8_assert``
                                                           dropped, logged; the reference's and critic's
                                                           ``enable`` false only
``actor.megatron.router_replay.*``                         ``actor_rollout_ref.actor.router_replay.*`` (routing
                                                           replay, `rlflow.models.router_replay`); the
                                                           reference's and critic's at their off values only
``model_engine=megatron``                                  dropped, logged (`rlflow.config.engine_layouts`)
=========================================================  =================================================

Every other key under ``megatron`` or ``override_transformer_config`` is refused naming it.
``reward_model.megatron.tensor_model_parallel_size`` and ``param_offload`` go to the reward model's own
keys (``reward_model.inference.tensor_model_parallel_size``, ``reward_model.model.fsdp_config.
param_offload``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from rlflow.config.megatron_precision import check_fp8_recipe_given, fp8_key, qat_key
from rlflow.config.mtp_schema import mtp_megatron_key
from rlflow.config.override_syntax import (
    NULL_SPELLINGS,
    check_produced,
    note_once,
    parse_bool,
    split_override,
    unquote,
)

logger = logging.getLogger(__name__)

__all__ = [
    "KERNEL_SWITCHES",
    "MEGATRON_INERT_FLAGS",
    "MEGATRON_KEY_ALIASES",
    "MEGATRON_ROLES",
    "rewrite_megatron_overrides",
]

ACTOR, REF, CRITIC, REWARD = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model"
MEGATRON_ROLES = (ACTOR, REF, CRITIC, REWARD)

SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
"""Megatron's model-parallel sizes kept under ``<role>.megatron`` (checked by `rlflow.config.validate`)."""

_GC_KEY = {
    ACTOR: "actor_rollout_ref.model.enable_gradient_checkpointing",
    CRITIC: "critic.model.enable_gradient_checkpointing",
}
_RMPAD_KEY = {
    ACTOR: "actor_rollout_ref.model.use_remove_padding",
    REF: "actor_rollout_ref.model.use_remove_padding",
    CRITIC: "critic.model.use_remove_padding",
}


KERNEL_SWITCHES: dict[str, str] = {
    **{
        key: "a Megatron kernel choice (how a layer computes, not what)"
        for key in (
            "gradient_accumulation_fusion",
            "apply_rope_fusion",
            "masked_softmax_fusion",
            "bias_activation_fusion",
            "bias_dropout_fusion",
            "persist_layer_norm",
            "use_flash_attn",
            "attention_backend",
            "use_fused_rotary_pos_emb",
            "use_fused_rmsnorm",
            "deallocate_pipeline_outputs",
        )
    },
    **{
        key: "how Megatron moves tokens to their experts (the Hugging Face MoE forward computes the same sums)"
        for key in (
            "moe_permute_fusion",
            "moe_grouped_gemm",
            "moe_enable_deepep",
            "moe_token_dispatcher_type",
            "moe_shared_expert_overlap",
        )
    },
    "moe_router_dtype": (
        "the router's precision in Megatron; the Hugging Face MoE forward takes the routing softmax in fp32 and "
        "the gate's product in mixed_precision.param_dtype"
    ),
    **{
        key: "how layers are divided among pipeline stages (FSDP2 shards every layer over all ranks)"
        for key in (
            "num_layers_in_first_pipeline_stage",
            "num_layers_in_last_pipeline_stage",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        )
    },
    **{
        key: "the architecture, which rlflow reads from the model's config.json"
        for key in ("position_embedding_type", "normalization")
    },
    "enable_vision_context_parallelism": "a vision-tower option (rlflow trains text models)",
    **{
        key: "a Megatron kernel choice (how a layer computes, not what)"
        for key in (
            "use_fused_mhc",
            "use_fused_swiglu",
            "use_fused_weighted_squared_relu",
            "use_triton_gdn",
            "use_ascend_gdn",
            "apply_dsa_kernel_fusion",
            "moe_router_fusion",
            "cuda_graph_impl",
            "cuda_graph_scope",
        )
    },
    **{
        key: "how Megatron packs and splits sequences over its ranks (rlflow packs each micro-batch itself)"
        for key in ("sequence_packing_scheduler", "cp_partition_mode", "max_seqlen_per_dp_cp_rank")
    },
    "pipeline_model_parallel_layout": "how layers are divided among pipeline stages (FSDP2 shards every layer "
    "over all ranks)",
    "calculate_per_token_loss": "how Megatron scales a loss over micro-batches (rlflow divides by the "
    "mini-batch's token or sequence count over all ranks, per loss_agg_mode)",
    "init_method_std": "the initialisation of new weights (the model's come from model.path)",
    "dsa_indexer_use_sparse_loss": "how the DeepSeek sparse-attention indexer's loss is computed (rlflow adds "
    "none: dsa_indexer_loss_coeff is 0 only)",
}
"""``override_transformer_config`` keys whose every value rlflow's one code path satisfies -> why."""

_RECOMPUTE = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")
_ROUTER_LOSSES = {"moe_aux_loss_coeff": "moe_aux_loss_coef", "moe_z_loss_coeff": "moe_z_loss_coef"}
"""The actor's router losses (`rlflow.algos.moe`): Megatron's key -> rlflow's actor key."""
_ROUTER_ELSEWHERE = (
    "is not part of rlflow's loss (router losses are the actor's: actor_rollout_ref.actor.moe_aux_loss_coef / "
    "moe_z_loss_coef)"
)
_ZERO_ONLY = {
    "moe_aux_loss_coeff": f"the critic's or the reference's router load-balancing loss {_ROUTER_ELSEWHERE}",
    "moe_z_loss_coeff": f"the critic's or the reference's router z-loss {_ROUTER_ELSEWHERE}",
    "moe_router_bias_update_rate": f"the aux-loss-free router bias update {_ROUTER_ELSEWHERE}",
    "dsa_indexer_loss_coeff": "the DeepSeek sparse-attention indexer's loss is not part of rlflow's loss (the "
    "Hugging Face model computes its attention as its config says)",
}
_OPTIM = f"{ACTOR}.optim.override_optimizer_config"

MEGATRON_KEY_ALIASES: dict[str, str] = {
    **{
        f"{role}.megatron.{sub}": f"{role}.{target}"
        for role in (ACTOR, REF, CRITIC)
        for sub, target in (
            ("context_parallel_size", "ulysses_sequence_parallel_size"),
            ("param_offload", "fsdp_config.param_offload"),
            ("dtype", "fsdp_config.mixed_precision.param_dtype"),
        )
    },
    **{
        f"{role}.megatron.{sub}": f"{role}.fsdp_config.{sub}"
        for role in (ACTOR, CRITIC)
        for sub in ("optimizer_offload", "grad_offload")
    },
    **{
        f"{ACTOR}.megatron.override_transformer_config.{sub}": f"{ACTOR}.{target}"
        for sub, target in _ROUTER_LOSSES.items()
    },
    f"{REWARD}.megatron.tensor_model_parallel_size": f"{REWARD}.inference.tensor_model_parallel_size",
    f"{REWARD}.megatron.param_offload": f"{REWARD}.model.fsdp_config.param_offload",
}
"""Megatron keys that are another name of one rlflow key (`rlflow.config.aliases.KEY_ALIASES` applies
them): context parallelism is Ulysses', the offloads and the compute dtype are FSDP's, the actor's router
losses its ``moe_*_loss_coef``, the reward model's TP and offload its own keys."""

MEGATRON_INERT_FLAGS: dict[str, str] = {
    **{
        f"{role}.megatron.use_mbridge": "how verl maps Hugging Face weights into Megatron's modules (rlflow "
        "trains the Hugging Face modules themselves)"
        for role in (ACTOR, REF, CRITIC)
    },
    **{
        f"{role}.megatron.vanilla_mbridge": "which weight bridge verl uses (rlflow needs none)"
        for role in (ACTOR, REF, CRITIC)
    },
    **{
        f"{role}.megatron.{sub}": why
        for role in (ACTOR, REF, CRITIC)
        for sub, why in (
            (
                "use_distributed_optimizer",
                "whether Megatron shards the optimizer state over the data-parallel ranks (FSDP2 always does: "
                "the same update)",
            ),
            (
                "sequence_parallel",
                "Megatron's split of the activations over the tensor-parallel ranks (a memory switch; FSDP2 "
                "has no tensor parallelism)",
            ),
            ("use_megatron_fsdp", "Megatron's own FSDP or its data parallelism (rlflow trains with FSDP2)"),
        )
    },
    f"{_OPTIM}.overlap_cpu_optimizer_d2h_h2d": "overlaps Megatron's host-device optimizer copies (a speed "
    "switch)",
    f"{_OPTIM}.chunked_optimizer_state_offload": "moves Megatron's offloaded optimizer state in chunks (a "
    "speed switch)",
    f"{_OPTIM}.use_precision_aware_optimizer": "Megatron's fused AdamW with its default fp32 moments: the "
    "same update as rlflow's AdamW",
}
"""Megatron switches whose both values rlflow's one code path satisfies (`rlflow.config.aliases.
INERT_FLAGS` checks, logs and drops them)."""
_PRODUCED_SWITCHES = frozenset({*_GC_KEY.values(), *_RMPAD_KEY.values()})
"""rlflow switches a Megatron key sets, which another override may not contradict."""
_PASSED_ON = frozenset({*MEGATRON_KEY_ALIASES, *MEGATRON_INERT_FLAGS})
_ROLE_KEYS = (
    *SIZES,
    "context_parallel_size",
    "param_offload",
    "optimizer_offload",
    "grad_offload",
    "dtype",
    "use_dist_checkpointing",
    "dist_checkpointing_path",
    "use_mbridge",
    "vanilla_mbridge",
    "use_remove_padding",
    "use_distributed_optimizer",
    "sequence_parallel",
    "use_megatron_fsdp",
    "qat.*",
    "router_replay.*",
    "override_transformer_config.*",
)


def rewrite_megatron_overrides(overrides: Iterable[str]) -> list[str]:
    """Rewrite verl's Megatron overrides onto rlflow's keys (the table in the module docstring).

    Args:
        overrides: command-line overrides, verl's other spellings already rewritten.

    Returns:
        The overrides with every Megatron key replaced by rlflow's (or dropped, logged).

    Raises:
        ValueError: a Megatron key or value rlflow has no meaning for, naming it and what to do.
    """
    overrides = list(overrides)
    aux_on = _aux_loss_on(overrides)
    out: list[str] = []
    late: list[str] = []  # optimizer offload asked by Megatron's optimizer: after the role's own switch
    produced: dict[str, tuple[str, str]] = {}  # rlflow key -> (the Megatron override that set it, value)
    fp8_roles: list[str] = []  # roles given an FP8 format by Megatron's key
    for item in overrides:
        if item.startswith("-") or "=" not in item:
            out.append(item)
            continue
        prefix, key, rest = split_override(item)
        value = unquote(rest.removeprefix("="))
        role = next((r for r in MEGATRON_ROLES if key.startswith(f"{r}.megatron.")), None)
        if key in _PASSED_ON and prefix != "~":
            out.append(f"{key}{rest}")  # `rlflow.config.aliases` renames it (or drops it); '+' not needed
        elif key in {f"{r}.strategy" for r in MEGATRON_ROLES} and value == "megatron":
            _note(key, f"{key}=megatron runs as {key}=fsdp2 (rlflow.config.megatron_layout)")
            out.append(f"{key}=fsdp2")
        elif role is not None and prefix != "~":
            new = _role_key(role, key.removeprefix(f"{role}.megatron."), value, aux_on)
            for override in new:
                new_key, _, new_value = override.partition("=")
                if new_key in _PRODUCED_SWITCHES:
                    produced.setdefault(new_key, (f"{key}={value}", new_value))
                if new_key.endswith(".fp8.format"):
                    fp8_roles.append(role)
            out.extend(new)
        elif key.startswith(f"{_OPTIM}.") and prefix != "~":
            late.extend(_optimizer_key(key.removeprefix(f"{_OPTIM}."), value))
        else:
            out.append(item)
    out.extend(late)
    check_fp8_recipe_given(out, fp8_roles)
    check_produced(
        out,
        produced,
        "{key}: {origin} sets it to {value}, but the command line also sets {item}; drop one of them",
    )
    return out


def _role_key(role: str, sub: str, value: str, aux_on: bool = False) -> list[str]:
    """rlflow's overrides for ``<role>.megatron.<sub>=value``."""
    key = f"{role}.megatron.{sub}"
    if role == REWARD:
        targets = sorted(
            k.removeprefix(f"{REWARD}.megatron.") for k in MEGATRON_KEY_ALIASES if k.startswith(REWARD)
        )
        raise ValueError(
            f"{key}: the reward model runs as one full copy per rank (forward only); of its Megatron keys "
            f"only {targets} have a meaning here: drop it"
        )
    if sub in SIZES or sub in ("use_dist_checkpointing", "dist_checkpointing_path"):
        return [f"{key}={value}"]
    if sub == "use_remove_padding":
        parse_bool(key, value)
        _note(key, f"config key {key} is read as {_RMPAD_KEY[role]} (Megatron's packed sequences)")
        return [f"{_RMPAD_KEY[role]}={value}"]
    if sub.startswith("override_transformer_config."):
        return _transformer_key(role, sub.removeprefix("override_transformer_config."), value, aux_on)
    if sub.startswith("router_replay."):
        return _router_replay_key(role, sub.removeprefix("router_replay."), value)
    if sub.startswith("qat."):
        return qat_key(role, sub.removeprefix("qat."), value)
    raise ValueError(
        f"{key}: not one of the Megatron keys rlflow reads onto FSDP2 ({sorted(_ROLE_KEYS)}); drop it "
        "(docs/migrating_from_verl.md, verl's Megatron scripts)"
    )


def _router_replay_key(role: str, sub: str, value: str) -> list[str]:
    """``<role>.megatron.router_replay.<sub>``: the actor's is ``actor.router_replay.<sub>`` (verl's FSDP
    spelling, `rlflow.models.router_replay`); the reference and the critic route live."""
    key = f"{role}.megatron.router_replay.{sub}"
    if role == ACTOR:
        _note(key, f"config key {key} is read as {ACTOR}.router_replay.{sub}")
        return [f"{ACTOR}.router_replay.{sub}={value}"]
    off = value == "disabled" if sub == "mode" else value.lower() in NULL_SPELLINGS
    if sub in ("mode", "record_file", "replay_file") and off:
        _note(key, f"{key}={value}: the {role.rsplit('.', 1)[-1]} routes live in rlflow; dropped")
        return []
    raise ValueError(
        f"{key}={value}: only the actor replays routing ({ACTOR}.router_replay.mode); the reference and the "
        "critic compute their own: drop the key"
    )


def _transformer_key(role: str, sub: str, value: str, aux_on: bool = False) -> list[str]:
    """rlflow's overrides for ``<role>.megatron.override_transformer_config.<sub>=value``."""
    key = f"{role}.megatron.override_transformer_config.{sub}"
    if sub in KERNEL_SWITCHES:
        _note(key, f"config key {key}={value} changes nothing: {KERNEL_SWITCHES[sub]}")
        return []
    mtp = mtp_megatron_key(role, sub, value, ACTOR)
    if mtp is not None:
        return mtp
    if sub in _ZERO_ONLY:
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{key}={value}: expected a number") from None
        if number != 0.0:
            raise ValueError(f"{key}={value}: {_ZERO_ONLY[sub]}: set 0 or drop the key")
        return []
    if sub in ("fp8", "fp8_recipe"):
        return fp8_key(role, sub, key, value)
    if sub == "moe_router_load_balancing_type":
        return _load_balancing(key, value, aux_on)
    if sub == "recompute_granularity":
        if value.lower() in NULL_SPELLINGS:
            return []
        if value not in ("full", "selective"):
            raise ValueError(f"{key}={value!r} must be full, selective or null")
        if role not in _GC_KEY:
            _note(key, f"config key {key}={value} changes nothing: the reference has no backward")
            return []
        _note(
            key,
            f"{key}={value} is read as {_GC_KEY[role]}=true (rlflow recomputes every decoder layer in the "
            "backward; selective recompute of parts of a layer is not separate)",
        )
        return [f"{_GC_KEY[role]}=true"]
    if sub in _RECOMPUTE:
        if sub == "recompute_method" and value.lower() not in (*NULL_SPELLINGS, "uniform", "block"):
            raise ValueError(f"{key}={value!r} must be uniform, block or null")
        if sub == "recompute_num_layers" and value.lower() not in NULL_SPELLINGS and not value.isdigit():
            raise ValueError(f"{key}={value!r} must be a number of layers or null")
        _note(key, f"config key {key}={value} changes nothing: rlflow recomputes every decoder layer")
        return []
    raise ValueError(
        f"{key}: a Megatron transformer option rlflow has no meaning for; drop it (the ones rlflow reads: "
        f"{sorted({*KERNEL_SWITCHES, *_ZERO_ONLY, *_ROUTER_LOSSES, *_RECOMPUTE})})"
    )


def _aux_loss_on(overrides: list[str]) -> bool:
    """Whether the command line gives the actor a load-balancing loss (Megatron's key or rlflow's)."""
    keys = (f"{ACTOR}.megatron.override_transformer_config.moe_aux_loss_coeff", f"{ACTOR}.moe_aux_loss_coef")
    for item in overrides:
        _, key, rest = split_override(item)
        if key in keys and rest:
            try:
                if float(unquote(rest.removeprefix("="))) > 0:
                    return True
            except ValueError:
                pass  # the key's own check names it
    return False


def _load_balancing(key: str, value: str, aux_on: bool) -> list[str]:
    """``moe_router_load_balancing_type``: rlflow's load-balancing loss is Megatron's ``aux_loss`` (added
    with ``moe_aux_loss_coef > 0``); ``none`` means no such loss."""
    if value.lower() == "none" and aux_on:  # Megatron's "none" is no load-balancing loss, not null
        raise ValueError(
            f"{key}=none turns Megatron's load-balancing loss off, but the command line sets moe_aux_loss_coeff > 0: "
            "drop one of them"
        )
    if value.lower() in (*NULL_SPELLINGS, "aux_loss"):
        _note(
            key,
            f"config key {key}={value} is what rlflow computes (rlflow.algos.moe, with moe_aux_loss_coef > 0)",
        )
        return []
    raise ValueError(
        f"{key}={value!r}: rlflow's load-balancing loss is Megatron's aux_loss over each micro-batch's tokens "
        "(rlflow.algos.moe); set aux_loss (or none with no aux-loss coefficient), or drop the key"
    )


def _optimizer_key(sub: str, value: str) -> list[str]:
    """rlflow's overrides for Megatron's ``actor.optim.override_optimizer_config.<sub>=value``."""
    key = f"{_OPTIM}.{sub}"
    target = f"{ACTOR}.fsdp_config.optimizer_offload"
    if sub == "optimizer_cpu_offload":
        if not parse_bool(key, value):
            return []
        _note(key, f"{key}=true is read as {target}=true")
        return [f"{target}=true"]
    if sub == "optimizer_offload_fraction":
        if value.lower() in NULL_SPELLINGS:
            return []
        try:
            fraction = float(value)
        except ValueError:
            raise ValueError(f"{key}={value}: expected a number in (0, 1]") from None
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"{key}={value}: expected a number in (0, 1]")
        if fraction < 1.0:
            _note(
                key,
                f"{key}={value}: with optimizer offload rlflow keeps the whole optimizer state in host memory",
            )
        return []
    if sub == "optimizer_state_offload_chunk_size_mb":
        if value.lower() not in NULL_SPELLINGS and not value.isdigit():
            raise ValueError(f"{key}={value}: expected a whole number of megabytes")
        _note(
            key,
            f"config key {key}={value} changes nothing: how Megatron moves offloaded state (a speed switch)",
        )
        return []
    if sub == "decoupled_weight_decay":
        if not parse_bool(key, value):
            raise ValueError(
                f"{key}={value}: rlflow's optimizer is AdamW, whose weight decay is decoupled; drop it"
            )
        return []
    if sub == "fp8_recipe":
        if value.lower() not in NULL_SPELLINGS:
            _note(
                key,
                f"config key {key}={value} changes nothing: Megatron's optimizer reads it for FP8 parameters "
                "(fp8_param), and rlflow's optimizer updates the weights in fsdp_config.model_dtype",
            )
        return []
    inert = sorted(k.removeprefix(f"{_OPTIM}.") for k in MEGATRON_INERT_FLAGS if k.startswith(_OPTIM))
    raise ValueError(
        f"{key}: a Megatron optimizer option rlflow has no meaning for; drop it (the ones rlflow reads: "
        f"{sorted(['optimizer_cpu_offload', 'optimizer_offload_fraction', 'optimizer_state_offload_chunk_size_mb', 'decoupled_weight_decay', 'fp8_recipe', *inert])})"
    )


def _note(key: str, message: str) -> None:
    note_once(logger, key, "%s", message)
