"""``actor_rollout_ref.model.mtp``: multi-token prediction (`rlflow.models.mtp`), verl's keys, their checks,
and Megatron's ``override_transformer_config.mtp_*`` keys read onto them.

verl's section configures loading (``enable``), training (``enable_train``, ``detach_encoder``,
``mtp_loss_scaling_factor``) and speculative decoding in the rollout engine (``enable_rollout`` and the
vLLM / SGLang draft settings). rlflow loads, trains and saves the layers; the rollout decodes without them
(``enable_rollout`` is refused, its draft settings held at their defaults). How many depths and layers
run comes from Megatron's keys when the command line has them, else from the checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlflow.config.override_syntax import NULL_SPELLINGS, note_once, parse_bool

if TYPE_CHECKING:  # the schema is imported where omegaconf is not installed (scripts/gpu_check.py)
    from omegaconf import DictConfig

    from rlflow.models.mtp import MTPSpec

__all__ = ["MtpConfig", "check_mtp", "mtp_megatron_key", "mtp_spec"]

logger = logging.getLogger(__name__)

MTP = "actor_rollout_ref.model.mtp"


@dataclass
class MtpConfig:
    """``actor_rollout_ref.model.mtp`` (verl's ``MtpConfig`` keys and defaults, plus three of Megatron's).

    Attributes:
        enable: build the checkpoint's MTP layers on the actor, keep them in its checkpoints and exports
            (frozen unless ``enable_train``); a checkpoint without them gets fresh layers, logged.
        enable_train: add the MTP loss to the actor's: ``mtp_loss_scaling_factor / D * sum_k loss_k``,
            ``loss_k`` the depth-``k`` cross-entropy's mean over the mini-batch's response tokens.
        enable_rollout: speculative decoding with the MTP layers as the draft: not supported (false only).
        detach_encoder: the MTP loss trains the MTP layers only (hidden states, embeddings and LM head
            detached); otherwise it reaches every weight.
        mtp_loss_scaling_factor: the loss's weight (Megatron's key of the same name reads onto it).
        speculative_algorithm: SGLang's draft algorithm (EAGLE); read only with ``enable_rollout``, held at
            its default, as are the next five.
        speculative_num_steps: SGLang's draft steps.
        speculative_eagle_topk: SGLang's draft branching.
        speculative_num_draft_tokens: SGLang's draft tokens verified per step.
        method: vLLM's speculative method (mtp).
        num_speculative_tokens: vLLM's draft tokens per step.
        num_layers: prediction depths ``D`` (Megatron's ``mtp_num_layers``); null = the checkpoint's
            ``num_nextn_predict_layers`` (1 for a checkpoint without MTP layers).
        use_repeated_layer: one MTP layer serves every depth (Megatron's ``mtp_use_repeated_layer``).
        hybrid_override_pattern: Nemotron-H's MTP block pattern (``*E``: attention, mixture of experts);
            null = the checkpoint's; must match it when the checkpoint has MTP layers.
    """

    enable: bool = False
    enable_train: bool = False
    enable_rollout: bool = False
    detach_encoder: bool = False
    mtp_loss_scaling_factor: float = 0.1
    speculative_algorithm: str = "EAGLE"
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    method: str = "mtp"
    num_speculative_tokens: int = 1
    num_layers: int | None = None
    use_repeated_layer: bool = False
    hybrid_override_pattern: str | None = None


_DRAFT_DEFAULTS = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "method": "mtp",
    "num_speculative_tokens": 1,
}


def check_mtp(cfg: DictConfig) -> None:
    """The section's values, and what MTP training cannot be combined with (before Ray starts)."""
    mtp = cfg.actor_rollout_ref.model.mtp
    for key, default in _DRAFT_DEFAULTS.items():
        if mtp[key] != default:
            raise ValueError(
                f"{MTP}.{key}={mtp[key]}: the rollout engine's MTP draft setting, read only with enable_rollout, "
                f"which rlflow does not support; keep {default}"
            )
    if mtp.enable_rollout:
        raise ValueError(
            f"{MTP}.enable_rollout=true: speculative decoding with the MTP layers as the draft is not supported "
            "(rlflow's rollout decodes with the main model; its samples are the same distribution): set false"
        )
    if not float(mtp.mtp_loss_scaling_factor) >= 0:
        raise ValueError(f"{MTP}.mtp_loss_scaling_factor={mtp.mtp_loss_scaling_factor} must be >= 0")
    if mtp.num_layers is not None and int(mtp.num_layers) < 1:
        raise ValueError(f"{MTP}.num_layers={mtp.num_layers} must be >= 1 (or null: the checkpoint's)")
    pattern = mtp.hybrid_override_pattern
    if pattern is not None and (not str(pattern) or set(str(pattern)) - set("*E-")):
        raise ValueError(
            f"{MTP}.hybrid_override_pattern={pattern!r}: MTP blocks are '*' (attention), 'E' (mixture of experts) "
            "or '-' (MLP)"
        )
    if not mtp.enable:
        for key in ("enable_train", "num_layers", "hybrid_override_pattern"):
            if mtp[key] not in (None, False):
                raise ValueError(
                    f"{MTP}.{key}={mtp[key]} needs {MTP}.enable=true (the MTP layers are built only then)"
                )
        return
    arr = cfg.actor_rollout_ref
    if mtp.enable_train and int(arr.actor.ulysses_sequence_parallel_size) > 1:
        raise ValueError(
            f"{MTP}.enable_train with actor.ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size}: "
            "the MTP loss is computed on whole sequences; use SP 1"
        )
    if int(arr.model.lora_rank) > 0:
        raise ValueError(
            f"{MTP}.enable with LoRA (model.lora_rank > 0): the MTP layers are trained in full; pick one"
        )


def mtp_spec(model: Any, hf_config: Any) -> MTPSpec | None:
    """The actor's `rlflow.models.mtp.MTPSpec` from ``actor_rollout_ref.model`` (None when ``mtp.enable`` is
    off); every key is read. ``hf_config``: the model's config, for the checkpoint's layer count."""
    from rlflow.models.mtp import MTPSpec

    mtp = model.mtp
    enable, train, detach = bool(mtp.enable), bool(mtp.enable_train), bool(mtp.detach_encoder)
    scale, repeated, pattern = (
        float(mtp.mtp_loss_scaling_factor),
        bool(mtp.use_repeated_layer),
        mtp.hybrid_override_pattern,
    )
    depths = mtp.num_layers
    if not enable:
        return None
    if depths is None:  # the checkpoint's layers, one depth each (1 for fresh layers)
        depths = int(getattr(hf_config.get_text_config(), "num_nextn_predict_layers", 0) or 1)
    return MTPSpec(int(depths), train, detach, scale, repeated, None if pattern is None else str(pattern))


_MEGATRON_MTP = {
    "mtp_num_layers": "num_layers",
    "mtp_loss_scaling_factor": "mtp_loss_scaling_factor",
    "mtp_use_repeated_layer": "use_repeated_layer",
    "mtp_hybrid_override_pattern": "hybrid_override_pattern",
}


def mtp_megatron_key(role: str, sub: str, value: str, actor: str) -> list[str] | None:
    """``<role>.megatron.override_transformer_config.<sub>`` for Megatron's MTP keys (None: not one): the
    actor's onto ``actor_rollout_ref.model.mtp`` (``mtp.enable`` switches the layers on, as in verl);
    ``keep_mtp_spec_in_bf16`` dropped, logged; the reference's and the critic's MTP off only."""
    if sub != "keep_mtp_spec_in_bf16" and sub not in _MEGATRON_MTP:
        return None
    key = f"{role}.megatron.override_transformer_config.{sub}"
    if sub == "keep_mtp_spec_in_bf16":
        parse_bool(key, value)
        note_once(
            logger,
            key,
            "config key %s=%s changes nothing: rlflow's MTP layers compute in the model's dtype",
            key,
            value,
        )
        return []
    off = sub == "mtp_num_layers" and (value.lower() in NULL_SPELLINGS or value.strip() == "0")
    if role != actor:
        if sub == "mtp_num_layers" and not off:
            raise ValueError(
                f"{key}={value}: multi-token prediction is the actor's ({MTP}); the reference and the critic "
                "compute without it: set 0 or drop the key"
            )
        return []
    if off:
        return []
    return [f"{MTP}.{_MEGATRON_MTP[sub]}={value}"]
