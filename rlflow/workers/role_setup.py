"""Helpers the Ray-facing role workers share: parallel set-up, model building, per-rank sizes,
advantages on the gathered batch, and per-call performance metrics."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

from rlflow.config.schema import MixedPrecisionSection
from rlflow.models.attention import set_packed_attention
from rlflow.models.loader import load_causal_lm, load_value_model
from rlflow.models.tiny import resolve_model_path
from rlflow.parallel.dims import ParallelDims
from rlflow.parallel.distributed import init_distributed
from rlflow.parallel.fsdp import build_sharded_model
from rlflow.protocol import DataProto

__all__ = [
    "GatheredAdvantages",
    "RoleParallel",
    "build_role_module",
    "gathered_advantages",
    "metrics_proto",
    "model_path",
    "peak_memory_metrics",
    "per_rank_sizes",
    "timed_call",
    "tokenizer_path",
]

TINY_MODEL = "rlflow://tiny"

# FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip the all-gather
# hook). The value head's output is such a view; rlflow's forward code (rlflow.models.forward) never
# modifies model outputs in place, so the warning is noise in every critic worker's log.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def model_path(model_cfg: dict) -> str:
    """The model directory (``null`` → the embedded tiny model, created on first use)."""
    return resolve_model_path(model_cfg.get("path") or TINY_MODEL)


def tokenizer_path(model_cfg: dict) -> str:
    """``tokenizer_path`` when set, else the model directory."""
    return resolve_model_path(model_cfg.get("tokenizer_path") or model_cfg.get("path") or TINY_MODEL)


@dataclass
class RoleParallel:
    """A role's parallel layout and the process groups its batching code needs."""

    dims: ParallelDims
    dp_group: Any
    sp_group: Any
    sync_group: Any


def setup_role_parallel(world_size: int, section: dict, hf_config: Any, key_prefix: str) -> RoleParallel:
    """Join the role's process group, build its meshes, return the DP/SP groups (collective)."""
    init_distributed()
    sp = int(section.get("ulysses_sequence_parallel_size", 1) or 1)
    fsdp_cfg = section.get("fsdp_config") or {}
    dims = ParallelDims(
        world_size=world_size,
        fsdp_size=int(fsdp_cfg.get("fsdp_size", -1)),
        ulysses_sequence_parallel_size=sp,
        num_attention_heads=getattr(hf_config, "num_attention_heads", None),
        num_key_value_heads=getattr(hf_config, "num_key_value_heads", None),
        key_prefix=key_prefix,
    ).build_meshes()
    sp_group = dims.ulysses_mesh["sp"].get_group() if sp > 1 else None
    return RoleParallel(dims, dims.ulysses_mesh["dp"].get_group(), sp_group, dist.group.WORLD)


def _meta_model(kind: str, path: str, trust_remote_code: bool) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        if kind == "value":
            config.num_labels = 1
            config.classifier_dropout = 0.0
            return AutoModelForTokenClassification.from_config(config, trust_remote_code=trust_remote_code)
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def build_role_module(
    kind: str, model_cfg: dict, section: dict, parallel: RoleParallel, seed: int = 0
) -> torch.nn.Module:
    """Load the role's model (``kind``: ``"causal_lm"`` or ``"value"``) and shard it.

    Rank 0 loads the weights; the other ranks build the architecture on ``meta`` and receive their
    shards (no extra full copies). A value model built from a checkpoint without a value head gets a
    fresh head, seeded by ``seed``, with dropout off (``classifier_dropout=0``) so that packed and padded
    forwards agree in train mode.
    """
    path = model_path(model_cfg)
    trust = bool(model_cfg.get("trust_remote_code", False))
    attn = model_cfg.get("attn_implementation") or "sdpa"
    packed = bool(model_cfg.get("use_remove_padding", False))

    def load_fn(device: torch.device) -> torch.nn.Module:
        if device.type == "meta":
            model = _meta_model(kind, path, trust)
        elif kind == "value":
            model = load_value_model(path, attn_implementation=attn, trust_remote_code=trust, seed=seed)
            model.config.classifier_dropout = 0.0
            if hasattr(model, "dropout"):
                model.dropout.p = 0.0
        else:
            model = load_causal_lm(path, attn_implementation=attn, trust_remote_code=trust)
        if packed:
            set_packed_attention(model)
        return model

    fsdp_cfg = section.get("fsdp_config") or {}
    return build_sharded_model(
        load_fn,
        parallel.dims,
        strategy=str(section.get("strategy", "fsdp2")),
        mixed_precision=MixedPrecisionSection(**(fsdp_cfg.get("mixed_precision") or {})),
        cpu_offload=bool(fsdp_cfg.get("param_offload", False)),
        reshard_after_forward=bool(fsdp_cfg.get("reshard_after_forward", True)),
        enable_gradient_checkpointing=bool(model_cfg.get("enable_gradient_checkpointing", False)),
    )


def per_rank_sizes(section: dict, rollout_n: int, dp_size: int, key_prefix: str) -> dict:
    """The role config with ``ppo_mini_batch_size`` turned from prompts into samples per DP rank."""
    out = dict(section)
    mini = int(section["ppo_mini_batch_size"]) * int(rollout_n)
    if mini % dp_size:
        raise ValueError(
            f"{key_prefix}.ppo_mini_batch_size × rollout.n = {mini} must be divisible by the "
            f"data-parallel size {dp_size}"
        )
    out["ppo_mini_batch_size"] = mini // dp_size
    return out


@dataclass
class GatheredAdvantages:
    advantages: torch.Tensor  # this rank's rows
    returns: torch.Tensor
    full: DataProto  # the whole batch's advantage inputs
    full_advantages: torch.Tensor
    full_returns: torch.Tensor


def gathered_advantages(
    data: DataProto,
    dp_group: Any,
    dp_rank: int,
    compute: Callable[[DataProto], tuple[torch.Tensor, torch.Tensor]],
) -> GatheredAdvantages:
    """Compute advantages on the whole batch (gathered over the DP ranks), return this rank's rows.

    The dispatch gave DP rank ``r`` rows ``[r*s, (r+1)*s)`` of the batch padded (by wrapping around) to a
    multiple of the DP size; ``meta_info["global_batch_size"]`` is the unpadded size. Gathering and
    stripping the padding rebuilds the exact batch, so group estimators see whole groups and GAE whitens
    over the whole batch; every rank computes the same numbers.

    Returns:
        This rank's ``(s, response_len)`` rows and the whole batch's tensors.
    """
    keys = [
        k
        for k in ("token_level_rewards", "response_mask", "values", "reward_baselines")
        if k in data.batch.keys()
    ]
    local = data.select(
        batch_keys=keys, non_tensor_batch_keys=[k for k in ("uid",) if k in data.non_tensor_batch]
    )
    world = dist.get_world_size(dp_group) if dist.is_initialized() else 1
    parts: list[Any] = [None] * world
    if world > 1:
        dist.all_gather_object(parts, local, group=dp_group)
    else:
        parts = [local]
    n = int(data.meta_info.get("global_batch_size", len(local) * world))
    full = DataProto.concat(parts)[:n]
    advantages, returns = compute(full)
    s = len(data)
    rows = torch.tensor([(dp_rank * s + i) % n for i in range(s)])
    return GatheredAdvantages(advantages[rows], returns[rows], full, advantages, returns)


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
