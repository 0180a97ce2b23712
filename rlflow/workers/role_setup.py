"""Helpers the Ray-facing role workers share: a role's layout from the typed config, its process groups,
building its sharded model, and per-call performance metrics."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from rlflow.config.mtp_schema import mtp_spec
from rlflow.config.schema import FSDPConfig, PPOTrainerConfig
from rlflow.models.attention import set_packed_attention
from rlflow.models.cpu_linear import install_onednn_linear, resolve_cpu_linear_kernel
from rlflow.models.fp8 import Fp8Recipe, install_fp8
from rlflow.models.fused_head import install_fused_head
from rlflow.models.loader import load_causal_lm, load_tokenizer, load_value_model, meta_model
from rlflow.models.lora import LoRASpec, inject_lora, output_head
from rlflow.models.mtp import install_mtp
from rlflow.models.peft_adapter import apply_peft_adapter, lora_spec
from rlflow.models.qat import QATSpec, install_qat
from rlflow.models.tiled_mlp import install_tiled_mlp
from rlflow.models.tiny import resolve_model_path
from rlflow.parallel.dims import ParallelDims
from rlflow.parallel.distributed import current_device, init_distributed
from rlflow.parallel.fsdp import build_sharded_model, find_decoder_layers
from rlflow.protocol import DataProto
from rlflow.utils.dtypes import to_torch_dtype

__all__ = [
    "RoleLayout",
    "RoleParallel",
    "actor_layout",
    "build_role_module",
    "check_layer_classes",
    "critic_layout",
    "metrics_proto",
    "model_path",
    "peak_memory_metrics",
    "ref_layout",
    "resolve_torch_compile",
    "role_tokenizer",
    "setup_role_parallel",
    "timed_call",
    "tokenizer_path",
]

logger = logging.getLogger(__name__)

TINY_MODEL = "rlflow://tiny"

# FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip the all-gather
# hook). The value head's output is such a view; rlflow's forward code (rlflow.models.forward) never
# modifies model outputs in place, so the warning is noise in every critic worker's log.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def model_path(model: Any) -> str:
    """The model directory of a ``model`` section (``path: null`` = the embedded tiny model)."""
    return resolve_model_path(model.path or TINY_MODEL)


def tokenizer_path(model: Any) -> str:
    """``tokenizer_path`` when set, else the model directory."""
    return resolve_model_path(model.tokenizer_path or model.path or TINY_MODEL)


def role_tokenizer(model: Any) -> Any:
    """The tokenizer of a role's ``model`` section (`tokenizer_path`), with the policy's
    ``custom_chat_template`` when the section has one."""
    return load_tokenizer(
        tokenizer_path(model),
        trust_remote_code=bool(model.trust_remote_code),
        chat_template=getattr(model, "custom_chat_template", None),
    )


@dataclass(frozen=True)
class RoleLayout:
    """What a role's model is and how it is sharded, read from the typed config.

    Attributes:
        key_prefix: config path of the role (error messages).
        model: the ``model`` section (path, attention, remove-padding, gradient checkpointing).
        strategy: fsdp | fsdp2.
        sp_size: Ulysses size.
        fsdp: the ``fsdp_config`` section.
        timeout_s: the role's process-group timeout in seconds (verl's ``nccl_timeout``; the gloo
            group's too); None keeps torch's default.
        lora: the LoRA adapters to add before sharding (a role with ``model.lora_rank > 0``; a value
            model's head trains in full beside them); None trains every weight.
        cpu_linear_kernel: ``trainer.cpu_linear_kernel`` (`rlflow.models.cpu_linear`): auto | aten | onednn.
        qat: the actor's quantization-aware training (`rlflow.models.qat`), the reference's too (its
            forward sees its weights quantized the same way); None = off.
        mtp: the role builds the MTP layers its ``model.mtp`` section asks for (`rlflow.models.mtp`): the
            actor only.
    """

    key_prefix: str
    model: Any
    strategy: str
    sp_size: int
    fsdp: FSDPConfig
    timeout_s: float | None = None
    lora: LoRASpec | None = None
    cpu_linear_kernel: str = "aten"
    qat: QATSpec | None = None
    mtp: bool = False


def model_key(layout: RoleLayout) -> str:
    """The config section of a role's model: ``actor_rollout_ref.model`` (actor and reference),
    ``critic.model``, or the SFT trainer's ``model``."""
    return {"critic": "critic.model", "model": "model"}.get(layout.key_prefix, "actor_rollout_ref.model")


def actor_layout(config: PPOTrainerConfig) -> RoleLayout:
    """The actor's layout (``actor_rollout_ref.model`` + ``actor``)."""
    arr = config.actor_rollout_ref
    actor = arr.actor
    return RoleLayout(
        "actor_rollout_ref.actor",
        arr.model,
        actor.strategy,
        actor.ulysses_sequence_parallel_size,
        actor.fsdp_config,
        float(arr.nccl_timeout),
        lora_spec(arr.model),
        config.trainer.cpu_linear_kernel,
        qat_spec(actor.qat),
        mtp=True,
    )


def qat_spec(qat: Any) -> QATSpec | None:
    """The ``actor.qat`` section as a `QATSpec` (None when off; its keys read either way). The two keys
    only verl's w4a4 mode and vLLM read are held at their defaults by validation."""
    enable, mode, group_size, patterns = (
        bool(qat.enable),
        str(qat.mode),
        int(qat.group_size),
        qat.ignore_patterns,
    )
    return QATSpec(mode, group_size, tuple(patterns)) if enable else None


def ref_layout(config: PPOTrainerConfig) -> RoleLayout:
    """The reference policy's layout: the actor's model, strategy and precision, FP8 and QAT included (so
    reference and old log-probs differ only by the weights), its own Ulysses size and ``ref.fsdp_config``
    (sharding, offload, prefetch: the actor's by default)."""
    arr = config.actor_rollout_ref
    ref = arr.ref.fsdp_config
    fsdp = dataclasses.replace(
        arr.actor.fsdp_config,
        param_offload=ref.param_offload,
        fsdp_size=ref.fsdp_size,
        reshard_after_forward=ref.reshard_after_forward,
        forward_prefetch=ref.forward_prefetch,
        model_dtype=ref.model_dtype,
        wrap_policy=ref.wrap_policy,
    )
    return RoleLayout(
        "actor_rollout_ref.ref",
        arr.model,
        arr.ref.strategy,
        arr.ref.ulysses_sequence_parallel_size,
        fsdp,
        float(arr.nccl_timeout),
        cpu_linear_kernel=config.trainer.cpu_linear_kernel,
        qat=qat_spec(arr.actor.qat),
    )


def critic_layout(config: PPOTrainerConfig) -> RoleLayout:
    """The critic's own layout (``critic`` section), with LoRA adapters when ``critic.model.lora_rank > 0``."""
    critic = config.critic
    return RoleLayout(
        "critic",
        critic.model,
        critic.strategy,
        critic.ulysses_sequence_parallel_size,
        critic.fsdp_config,
        float(critic.nccl_timeout),
        lora_spec(critic.model, "critic.model"),
        config.trainer.cpu_linear_kernel,
    )


@dataclass
class RoleParallel:
    """A role's parallel layout and the process groups its batching code needs."""

    dims: ParallelDims
    dp_group: Any
    sp_group: Any
    sync_group: Any


def resolve_torch_compile(use_torch_compile: bool | None, device: torch.device) -> bool:
    """A role's ``use_torch_compile``: as set, or (null) on CUDA only, where verl compiles by default; on
    CPU inductor's C++ build (~20 s per process, once) outweighs what the fused kernels save on small
    vocabularies."""
    return device.type == "cuda" if use_torch_compile is None else bool(use_torch_compile)


def setup_role_parallel(world_size: int, layout: RoleLayout, hf_config: Any) -> RoleParallel:
    """Join the role's process group, build its meshes, return the DP/SP groups (collective)."""
    init_distributed(timeout_s=layout.timeout_s)
    dims = ParallelDims(
        world_size=world_size,
        fsdp_size=int(layout.fsdp.fsdp_size),
        ulysses_sequence_parallel_size=int(layout.sp_size),
        num_attention_heads=getattr(hf_config, "num_attention_heads", None),
        num_key_value_heads=getattr(hf_config, "num_key_value_heads", None),
        key_prefix=layout.key_prefix,
    ).build_meshes()
    sp_group = dims.ulysses_mesh["sp"].get_group() if layout.sp_size > 1 else None
    return RoleParallel(dims, dims.ulysses_mesh["dp"].get_group(), sp_group, dist.group.WORLD)


def check_layer_classes(model: torch.nn.Module, layout: RoleLayout) -> None:
    """``fsdp_config.wrap_policy.transformer_layer_cls_to_wrap``, when set, must name the decoder-layer
    classes rlflow wraps (each one FSDP unit), else ``ValueError`` naming the key and the model's class."""
    wanted = layout.fsdp.wrap_policy.transformer_layer_cls_to_wrap
    if wanted is None:
        return
    found = sorted({type(layer).__name__ for layer in find_decoder_layers(model)})
    if sorted(set(wanted)) != found:
        raise ValueError(
            f"{layout.key_prefix}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap={list(wanted)}: this "
            f"model's decoder layers are {found}, and rlflow makes each of them one FSDP unit; set it to "
            f"{found} or drop it"
        )


def build_role_module(
    kind: str, layout: RoleLayout, parallel: RoleParallel, seed: int = 0
) -> torch.nn.Module:
    """Load the role's model (``kind``: ``"causal_lm"`` or ``"value"``) and shard it.

    Rank 0 loads the weights; the other ranks build the architecture on ``meta`` and receive their
    shards (no extra full copies). A value model built from a checkpoint without a value head gets a
    fresh head, seeded by ``seed``, with dropout off (``classifier_dropout=0``) so that packed and padded
    forwards agree in train mode. The weights are kept (and updated) in ``fsdp_config.model_dtype``;
    ``mixed_precision.param_dtype`` is what the forward computes in. With ``layout.cpu_linear_kernel``
    resolved to ``onednn`` the linear layers compute through oneDNN (`rlflow.models.cpu_linear`); with
    ``fsdp_config.fp8.format`` set, the decoder layers' linear layers compute with FP8 numerics
    (`rlflow.models.fp8`); with ``layout.qat`` their weights are quantization-aware (`rlflow.models.qat`).
    """
    model_cfg = layout.model
    path = model_path(model_cfg)
    trust = bool(model_cfg.trust_remote_code)
    attn = model_cfg.attn_implementation
    overrides = dict(model_cfg.override_config)
    tiled, shards = bool(model_cfg.tiled_mlp.enabled), int(model_cfg.tiled_mlp.num_shards)  # both read always
    weight_dtype = to_torch_dtype(layout.fsdp.model_dtype, f"{layout.key_prefix}.fsdp_config.model_dtype")
    onednn = (
        resolve_cpu_linear_kernel(layout.cpu_linear_kernel, current_device().type, torch.get_num_threads())
        == "onednn"
    )
    fp8 = None
    fp8_section = getattr(layout.fsdp, "fp8", None)  # the actor's and the critic's (the reference has none)
    if fp8_section is not None:
        fp8_format, fp8_recipe = fp8_section.format, fp8_section.recipe  # both read always
        fp8 = None if fp8_format is None else Fp8Recipe(fp8_format, fp8_recipe)

    def load_fn(device: torch.device) -> torch.nn.Module:
        if device.type == "meta":
            model = meta_model(kind, path, trust, overrides)
        elif kind == "value":
            model = load_value_model(
                path, attn_implementation=attn, trust_remote_code=trust, seed=seed, override_config=overrides
            )
            model.config.classifier_dropout = 0.0
            if hasattr(model, "dropout"):
                model.dropout.p = 0.0
        else:
            model = load_causal_lm(
                path, attn_implementation=attn, trust_remote_code=trust, override_config=overrides
            )
        if layout.mtp and (spec := mtp_spec(model_cfg, model.config)) is not None:
            install_mtp(model, spec, None if device.type == "meta" else path, seed)
        if weight_dtype != torch.float32:  # fsdp_config.model_dtype: before the adapters, which follow it
            model.to(weight_dtype)
        if layout.lora is not None:
            inject_lora(model, layout.lora, seed, trainable=[output_head(model)] if kind == "value" else [])
            adapter = getattr(model_cfg, "lora_adapter_path", None)
            if adapter is not None and device.type != "meta":
                apply_peft_adapter(model, os.path.expanduser(adapter))
        if model_cfg.use_remove_padding:
            set_packed_attention(model)
        if tiled:
            install_tiled_mlp(model, shards, f"{model_key(layout)}.tiled_mlp")
        if kind == "causal_lm" and getattr(model_cfg, "use_fused_kernels", False):
            install_fused_head(model)
        if onednn:  # after LoRA and the fused head, which keep their own classes
            install_onednn_linear(model)
        if fp8 is not None:  # after oneDNN: the FP8 layers compute their own products
            install_fp8(model, fp8)
        if layout.qat is not None:  # after FP8, whose layers then quantize the QAT weight
            install_qat(model, layout.qat)
        check_layer_classes(model, layout)
        return model

    fsdp = layout.fsdp
    return build_sharded_model(
        load_fn,
        parallel.dims,
        strategy=layout.strategy,
        mixed_precision=fsdp.mixed_precision,
        cpu_offload=bool(fsdp.param_offload),
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        forward_prefetch=bool(fsdp.forward_prefetch),
        enable_gradient_checkpointing=bool(model_cfg.enable_gradient_checkpointing),
    )


def metrics_proto(n: int, metrics: dict[str, float]) -> DataProto:
    """A DataProto of ``n`` samples with no tensors, carrying ``metrics`` in its meta info."""
    return DataProto(batch=TensorDict({}, batch_size=[n]), meta_info={"metrics": metrics})


@contextmanager
def timed_call(name: str, metrics: dict[str, float], num_tokens: int | None = None) -> Iterator[None]:
    """Adds ``perf/<name>/time_s``, ``perf/<name>/tokens`` and the peak memory to ``metrics``."""
    start = time.perf_counter()
    yield
    metrics[f"perf/{name}/time_s"] = time.perf_counter() - start
    if num_tokens is not None:
        metrics[f"perf/{name}/tokens"] = float(num_tokens)


def peak_memory_metrics(prefix: str = "perf") -> dict[str, float]:
    """`get_memory_metrics` of this process, maximised over every rank of the role (collective).

    Args:
        prefix: replaces ``perf`` in the key names (``perf/critic`` for the critic).

    Returns:
        ``<prefix>/max_rss_gb`` and, on CUDA, ``<prefix>/max_memory_{allocated,reserved}_gb``.
    """
    from rlflow.logging.memory import get_memory_metrics

    local = get_memory_metrics()
    keys = sorted(local)
    values = torch.tensor([local[k] for k in keys], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return {k.replace("perf", prefix, 1): float(v) for k, v in zip(keys, values)}
