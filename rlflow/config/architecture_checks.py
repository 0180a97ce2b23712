"""Checks on the roles' model architectures, before Ray starts: each role's model is built on the ``meta``
device from its HF config (no weights read) when a key acts on its modules, and

* LoRA (``lora_rank`` / ``lora_adapter_path``): ``target_modules`` after ``exclude_modules`` must select a
  linear layer (`rlflow.models.lora.lora_targets`, naming the key and the model's linear layers);
* ``tiled_mlp.enabled``: every decoder layer must hold a dense ``mlp`` block
  (`rlflow.models.tiled_mlp.install_tiled_mlp`; mixture-of-experts blocks are refused);
* ``actor.router_replay.mode`` R2 / R3: the actor's model must have router modules that routing replay
  finds (`rlflow.models.router_replay.moe_routers`);
* ``fsdp_config.fp8`` and ``actor.qat``: the layers they quantize must exist and be reachable
  (`rlflow.models.fp8.install_fp8`, `rlflow.models.qat.install_qat`: routed experts for
  ``mxfp4_experts``, no fused LM head left to NVFP4);
* ``model.mtp.enable``: the architecture's MTP layers must be buildable with the depths and pattern asked
  for (`rlflow.models.mtp.install_mtp` on the ``meta`` model);
* Ulysses SP > 1: no recurrent (Mamba, linear-attention) layers, whose forwards run padded
  (`rlflow.models.padding.keeps_packed_sequences_apart`; with ``use_remove_padding`` that is logged).

`rlflow.trainer.main_ppo.prepare_config` runs it once the model paths are resolved.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig

from rlflow.config.lora_checks import CRITIC_MODEL, MODEL

__all__ = ["check_role_architectures"]

logger = logging.getLogger(__name__)


def check_role_architectures(cfg: DictConfig, critic: bool) -> dict[str, dict[str, int]]:
    """Check the actor's (and with ``critic``, the critic's) LoRA selection and tiled MLP, and the actor's
    routers for routing replay, on its architecture; a ``lora_adapter_path`` gives the actor's adapters its
    own rank and targets.

    Args:
        cfg: the composed config, model paths resolved.
        critic: the run has a critic.

    Returns:
        ``{"actor" | "critic": {adapted module name: rank}}`` for the roles with LoRA adapters.

    Raises:
        ValueError: naming the key whose selection or block the model does not have.
    """
    from rlflow.config.mtp_schema import mtp_spec
    from rlflow.models.loader import load_model_config, meta_model
    from rlflow.models.lora import lora_targets
    from rlflow.models.mtp import install_mtp
    from rlflow.models.peft_adapter import lora_spec
    from rlflow.models.router_replay import moe_routers
    from rlflow.models.tiled_mlp import install_tiled_mlp

    roles = [("actor", MODEL, "causal_lm", cfg.actor_rollout_ref.model)]
    if critic:
        roles.append(("critic", CRITIC_MODEL, "value", cfg.critic.model))
    adapters: dict[str, dict[str, int]] = {}
    actor = cfg.actor_rollout_ref.actor
    replay = str(actor.router_replay.mode)
    for role, key, kind, model in roles:
        spec = lora_spec(model, key)
        tiled = bool(model.tiled_mlp.enabled)
        routed = role == "actor" and replay != "disabled"
        fp8 = (actor if role == "actor" else cfg.critic).fsdp_config.fp8
        qat = role == "actor" and bool(actor.qat.enable)
        mtp = role == "actor" and bool(model.mtp.enable)
        overrides = dict(model.override_config or {})
        sp = int((actor if role == "actor" else cfg.critic).ulysses_sequence_parallel_size)
        if sp > 1 or bool(model.use_remove_padding):
            hf = load_model_config(str(model.path), bool(model.trust_remote_code), overrides)
            _check_recurrent_layers(hf, role, sp)
        if spec is None and not tiled and not routed and fp8.format is None and not qat and not mtp:
            continue
        built = meta_model(kind, str(model.path), bool(model.trust_remote_code), overrides)
        if mtp:
            try:
                install_mtp(built, mtp_spec(model, built.config), None)
            except ValueError as err:
                raise ValueError(f"{key}.mtp.enable=true: {err}") from None
        _check_quantized_layers(built, role, fp8, actor.qat if qat else None, model)
        if routed and not moe_routers(built):
            raise ValueError(
                f"actor_rollout_ref.actor.router_replay.mode={replay}: {type(built).__name__} has no router module "
                "that routing replay can find (the class its router_logits are recorded from); set disabled"
            )
        if spec is not None:
            adapters[role] = {name: spec.rank for name, _ in lora_targets(built, spec)}
        if tiled:
            install_tiled_mlp(built, int(model.tiled_mlp.num_shards), f"{key}.tiled_mlp")
    return adapters


def _check_recurrent_layers(hf: Any, role: str, sp: int) -> None:
    """Models with recurrent (Mamba, linear-attention) layers: SP > 1 refused, remove-padding logged (their
    forwards run padded, `rlflow.models.forward`)."""
    from rlflow.models.padding import keeps_packed_sequences_apart

    if keeps_packed_sequences_apart(hf):
        return
    prefix = "actor_rollout_ref.actor" if role == "actor" else "critic"
    if sp > 1:
        raise ValueError(
            f"{prefix}.ulysses_sequence_parallel_size={sp}: {hf.model_type} has recurrent (Mamba / linear-attention) "
            "layers, whose state cannot be split along the sequence; use SP 1"
        )
    logger.info(
        "use_remove_padding: %s has recurrent (Mamba / linear-attention) layers, whose state a packed row would "
        "carry from one sequence into the next: the %s's forwards run padded",
        hf.model_type,
        role,
    )


def _check_quantized_layers(built: Any, role: str, fp8: Any, qat: Any, model: Any) -> None:
    """FP8 and QAT installed on the role's ``meta`` model as its worker installs them (ValueError naming the
    key when a layer they need is missing or out of their reach)."""
    from rlflow.models.fp8 import Fp8Recipe, install_fp8
    from rlflow.models.fused_head import install_fused_head
    from rlflow.models.qat import QATSpec, install_qat

    prefix = "actor_rollout_ref.actor" if role == "actor" else "critic"
    if fp8.format is not None:
        try:
            install_fp8(built, Fp8Recipe(str(fp8.format), str(fp8.recipe)))
        except ValueError as err:
            raise ValueError(f"{prefix}.fsdp_config.fp8.format={fp8.format}: {err}") from None
    if qat is None:
        return
    if getattr(model, "use_fused_kernels", False):
        install_fused_head(built)
    try:
        install_qat(built, QATSpec(str(qat.mode), int(qat.group_size), tuple(qat.ignore_patterns)))
    except ValueError as err:
        raise ValueError(f"actor_rollout_ref.actor.qat.mode={qat.mode}: {err}") from None
