"""Checks of verl's Megatron layout of a role (``<role>.megatron.*``, `rlflow.config.megatron_layout`),
used by `rlflow.config.validate`: the sizes must be ones Megatron itself would accept on the role's ranks,
so a ported script that verl would refuse is refused here too."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlflow.config.checks import at_least, flag, value_at
from rlflow.config.engine_schema import MegatronConfig

__all__ = [
    "check_megatron",
    "check_router_losses",
    "check_router_replay",
    "check_router_replay_settings",
    "megatron_summary",
]


def check_megatron(cfg: DictConfig, prefix: str, world: int, sp: int) -> None:
    """``<prefix>.megatron``: positive sizes, TP x PP x SP and PP x EP x ETP dividing ``world``, a checkpoint
    path with ``use_dist_checkpointing``.

    Args:
        cfg: the composed config.
        prefix: the role (``actor_rollout_ref.actor``, ``actor_rollout_ref.ref`` or ``critic``).
        world: the role's ranks.
        sp: its Ulysses size (verl's Megatron ``context_parallel_size`` is read as it).
    """
    key = f"{prefix}.megatron"
    tp = at_least(cfg, f"{key}.tensor_model_parallel_size", 1)
    pp = at_least(cfg, f"{key}.pipeline_model_parallel_size", 1)
    vpp = at_least(cfg, f"{key}.virtual_pipeline_model_parallel_size", 1, allow_none=True)
    ep = at_least(cfg, f"{key}.expert_model_parallel_size", 1)
    etp = at_least(cfg, f"{key}.expert_tensor_parallel_size", 1, allow_none=True) or tp
    if vpp is not None and pp == 1:
        raise ValueError(
            f"{key}.virtual_pipeline_model_parallel_size={vpp} needs {key}.pipeline_model_parallel_size > 1 "
            "(Megatron interleaves stages of a pipeline); set it to null"
        )
    if world % (tp * pp * sp):
        raise ValueError(
            f"{key}.tensor_model_parallel_size={tp} x {key}.pipeline_model_parallel_size={pp} x context "
            f"(Ulysses) size {sp} = {tp * pp * sp} must divide the {world} ranks of {prefix}, as Megatron "
            "requires (scale the sizes with the GPU count)"
        )
    if world % (pp * ep * etp):
        raise ValueError(
            f"{key}.pipeline_model_parallel_size={pp} x {key}.expert_model_parallel_size={ep} x "
            f"{key}.expert_tensor_parallel_size={etp} = {pp * ep * etp} must divide the {world} ranks of "
            f"{prefix}, as Megatron requires (scale the sizes with the GPU count)"
        )
    if flag(cfg, f"{key}.use_dist_checkpointing") and not value_at(cfg, f"{key}.dist_checkpointing_path"):
        raise ValueError(
            f"{key}.use_dist_checkpointing=true needs {key}.dist_checkpointing_path (verl reads the converted "
            "checkpoint there); or set use_dist_checkpointing=false"
        )


def megatron_summary(prefix: str, megatron: MegatronConfig, sp: int) -> str | None:
    """One log line saying how verl's Megatron layout of the role ``prefix`` runs here (None: the defaults).

    Args:
        prefix: the role's key (``critic``, ...).
        megatron: its typed ``megatron`` section.
        sp: its Ulysses size (where the script's context parallelism went).
    """
    m = megatron
    sizes = (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.expert_model_parallel_size)
    layout = (
        f"TP {sizes[0]} x PP {sizes[1]} (virtual {m.virtual_pipeline_model_parallel_size}), EP {sizes[2]} "
        f"(ETP {m.expert_tensor_parallel_size})"
    )
    path, use_path = m.dist_checkpointing_path, m.use_dist_checkpointing
    ckpt = path if use_path else None
    if sizes == (1, 1, 1) and ckpt is None:
        return None
    line = (
        f"{prefix}.megatron: verl's Megatron layout {layout} runs as FSDP2, every weight sharded over all the "
        f"role's ranks, Ulysses sequence parallelism {sp}"
    )
    if ckpt is not None:
        line += (
            f"; the weights come from model.path, the Hugging Face checkpoint verl converts into {ckpt} "
            "(that Megatron checkpoint is not read)"
        )
    return line


def _is_moe(model_config: Any) -> bool:
    """A Hugging Face mixture-of-experts config: experts per token, router logits the forward can return."""
    return getattr(model_config, "num_experts_per_tok", None) is not None and hasattr(
        model_config, "output_router_logits"
    )


def check_router_losses(cfg: DictConfig, model_config: Any) -> None:
    """``actor_rollout_ref.actor.moe_aux_loss_coef`` / ``moe_z_loss_coef`` (Megatron's router losses):
    >= 0; when on, the actor must be a mixture-of-experts model and run with Ulysses SP 1.

    Args:
        cfg: the composed config.
        model_config: the actor's Hugging Face config.
    """
    actor = "actor_rollout_ref.actor"
    coefs = [
        at_least(cfg, f"{actor}.{name}", 0.0, integer=False)
        for name in ("moe_aux_loss_coef", "moe_z_loss_coef")
    ]
    if not any(coefs):
        return
    if not _is_moe(model_config):
        raise ValueError(
            f"{actor}.moe_aux_loss_coef / moe_z_loss_coef: the actor's model ({type(model_config).__name__}) is not "
            "a mixture of experts whose forward returns router logits (output_router_logits); set them to 0"
        )
    if int(value_at(cfg, f"{actor}.ulysses_sequence_parallel_size")) > 1:
        raise ValueError(
            f"{actor}.moe_aux_loss_coef / moe_z_loss_coef with {actor}.ulysses_sequence_parallel_size > 1: each "
            "rank would see a slice of the router's tokens; use SP 1"
        )


_REPLAY = "actor_rollout_ref.actor.router_replay"


def check_router_replay_settings(cfg: DictConfig) -> None:
    """``actor_rollout_ref.actor.router_replay`` (verl's routing replay, `rlflow.models.router_replay`):
    ``mode`` one of disabled / R2 / R3; R3 exactly with ``rollout.enable_rollout_routing_replay``; R2 with
    the old-log-prob pass that records; verl's dump files null."""
    from rlflow.models.router_replay import REPLAY_MODES

    key = _REPLAY
    rollout_key = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
    mode = str(value_at(cfg, f"{key}.mode"))
    if mode not in REPLAY_MODES:
        raise ValueError(f"{key}.mode={mode!r} is not one of {list(REPLAY_MODES)}")
    for name in ("record_file", "replay_file"):
        if value_at(cfg, f"{key}.{name}") is not None:
            raise ValueError(
                f"{key}.{name}: rlflow does not write or read routing files; the recorded routing travels in "
                "the batch (routed_experts): drop the key"
            )
    from_rollout = bool(value_at(cfg, rollout_key))
    if (mode == "R3") != from_rollout:
        raise ValueError(
            f"{key}.mode={mode} with {rollout_key}={str(from_rollout).lower()}: R3 replays the routing the rollout "
            "records, and only R3 reads it; set both (R3 and true) or neither"
        )
    if mode == "R2" and value_at(cfg, "algorithm.rollout_correction.bypass_mode") is True:
        raise ValueError(
            f"{key}.mode=R2 records the routing in the old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=true skips: use R3 (the rollout records it) or bypass_mode=null"
        )


def check_router_replay(cfg: DictConfig, model_config: Any) -> None:
    """Routing replay needs a mixture-of-experts actor (its Hugging Face config: ``model_config``)."""
    mode = str(value_at(cfg, f"{_REPLAY}.mode"))
    if mode != "disabled" and not _is_moe(model_config):
        raise ValueError(
            f"{_REPLAY}.mode={mode}: the actor's model ({type(model_config).__name__}) is not a mixture of experts "
            "(no routers to replay); set disabled"
        )
