"""The one place where rlflow applies data parallelism to a model.

Actor, critic, reference and reward model all go through the same steps:

1. `rlflow.parallel.dims.ParallelDims` — validated once from the role's config (world size,
   ``fsdp_size``, ``ulysses_sequence_parallel_size``); ``build_meshes`` creates the FSDP and Ulysses
   meshes.
2. `build_sharded_model` (loading) and `apply_fsdp` (wrapping) — FSDP2 (``fully_shard``) or FSDP1
   (``FullyShardedDataParallel``), mixed precision, CPU offload, gradient checkpointing.
3. Operations on the wrapped model live in `rlflow.parallel.sharded`: `clip_grad_norm_`, full state
   dicts, one-tensor-at-a-time parameter export, optimizer offload.

Loading without extra full copies (``build_sharded_model(..., rank0_only_load=True)``, the default):
rank 0 reads the weights into CPU memory; the other ranks build the same architecture on ``meta``
(no memory). Every rank wraps (sharding splits rank 0's real tensors; meta ranks get meta shards), the
meta shards are materialised as empty local shards, and
``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`` broadcasts rank 0's tensors
one at a time, each rank keeping only its shard. Peak memory: rank 0 holds one full CPU copy (plus its
shard) until loading ends; the other ranks hold their shard plus one full tensor in flight. Buffers
(rotary ``inv_freq``, not in the state dict) are broadcast from rank 0 last. The same path serves FSDP1
and FSDP2, on CPU (gloo) and GPU (NCCL). ``rank0_only_load=False`` lets every rank load the full
weights, shard, and free them (simpler; every rank peaks at one full copy).

Mixed precision: ``param_dtype="bf16", reduce_dtype="fp32"`` is the usual GPU recipe (sharded master
weights and optimizer states stay in the dtype the model was loaded in, normally fp32); all fp32 (the
default) is exact. FSDP2 does not manage buffers, so ``buffer_dtype`` only affects FSDP1.

CPU offload is a GPU feature (FSDP2 ``CPUOffloadPolicy`` / FSDP1 ``CPUOffload``: sharded parameters,
gradients and hence optimizer states live on CPU); on a CPU-only run everything already lives on CPU,
so ``cpu_offload=True`` is a no-op that logs one warning.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from rlflow.parallel.dims import ParallelDims
from rlflow.parallel.sharded import log_once
from rlflow.parallel.ulysses import checkpoint_context_fn
from rlflow.utils.dtypes import to_torch_dtype

__all__ = [
    "STRATEGIES",
    "MixedPrecisionDtypes",
    "apply_fsdp",
    "build_sharded_model",
    "find_decoder_layers",
    "mixed_precision_dtypes",
]

logger = logging.getLogger(__name__)

STRATEGIES = ("fsdp", "fsdp2")
"""``"fsdp"``: FSDP1 ``FullyShardedDataParallel``; ``"fsdp2"``: per-parameter sharding with ``fully_shard``."""


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# --------------------------------------------------------------------------- mixed precision


MixedPrecisionDtypes = tuple[torch.dtype, torch.dtype, torch.dtype]
"""``(param_dtype, reduce_dtype, buffer_dtype)``."""


def mixed_precision_dtypes(mixed_precision: Any = None, key: str = "mixed_precision") -> MixedPrecisionDtypes:
    """The torch dtypes of a ``fsdp_config.mixed_precision`` section.

    Args:
        mixed_precision: an object with ``param_dtype``, ``reduce_dtype``, ``buffer_dtype`` names (the
            schema's ``MixedPrecisionSection``); None = all fp32.
        key: config path, for error messages.

    Returns:
        ``(param_dtype, reduce_dtype, buffer_dtype)``.
    """
    if mixed_precision is None:
        return torch.float32, torch.float32, torch.float32
    names = ("param_dtype", "reduce_dtype", "buffer_dtype")
    return tuple(to_torch_dtype(getattr(mixed_precision, n), f"{key}.{n}") for n in names)  # type: ignore[return-value]


# --------------------------------------------------------------------------- wrapping


def find_decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Return the repeated transformer blocks of ``model``, in module order.

    Looks for modules whose class name is listed in any ``_no_split_modules`` of ``model`` or its
    submodules (HF models declare their decoder layer there), then falls back to ``model.model.layers``
    / ``model.layers``.

    Raises:
        ValueError: when no decoder layer is found.
    """
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if layers:
        return layers
    for path in ("model.layers", "layers"):
        target: Any = model
        for attr in path.split("."):
            target = getattr(target, attr, None)
        if isinstance(target, nn.ModuleList) and len(target) > 0:
            return list(target)
    raise ValueError(
        f"cannot find decoder layers in {type(model).__name__}: no _no_split_modules class matched and "
        "there is no model.layers / layers ModuleList"
    )


def _has_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _materialize_module(module: nn.Module, device: torch.device, memo: dict[int, nn.Parameter]) -> None:
    """Replace the meta parameters/buffers owned directly by ``module`` with empty tensors on ``device``.

    ``memo`` maps a meta parameter's id to its replacement so that tied parameters (embedding and LM
    head) stay one parameter; a per-module ``to_empty`` would give each module its own copy.
    """
    for name, param in list(module.named_parameters(recurse=False)):
        if param.is_meta:
            if id(param) not in memo:
                memo[id(param)] = nn.Parameter(torch.empty_like(param, device=device), param.requires_grad)
            setattr(module, name, memo[id(param)])
    for name, buf in list(module.named_buffers(recurse=False)):
        if buf.is_meta:
            module._buffers[name] = torch.empty_like(buf, device=device)


def _load_from_rank0(model: nn.Module, full_state: dict[str, torch.Tensor]) -> None:
    """Fill every rank's shards from rank 0's full state dict, then copy rank 0's buffers everywhere."""
    set_model_state_dict(
        model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    # Non-persistent buffers (rotary inv_freq, ...) are not in the state dict; FSDP never shards buffers.
    with torch.no_grad():
        for buf in model.buffers():
            dist.broadcast(buf, src=0)


def _apply_fsdp2(
    model: nn.Module,
    layers: list[nn.Module],
    mesh: DeviceMesh,
    mp: MixedPrecisionDtypes,
    reshard_after_forward: bool,
    offload: bool,
    forward_prefetch: bool,
) -> nn.Module:
    kwargs = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=mp[0], reduce_dtype=mp[1]),
        "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
        "reshard_after_forward": reshard_after_forward,
    }
    # Order matters: fully_shard(module) groups the parameters of `module` that no earlier call has
    # claimed. Sharding each decoder layer first makes every layer its own all-gather / reduce-scatter
    # unit (only one layer's full weights live at a time, and the next layer's all-gather overlaps this
    # layer's compute); the root call last then picks up only what is left (embeddings, final norm,
    # LM/value head). Sharding the root first would put every parameter in one unit.
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if forward_prefetch:  # explicit: layer i's pre-forward issues layer i+1's all-gather too
        for layer, following in itertools.pairwise(layers):
            layer.set_modules_to_forward_prefetch([following])
    if _has_meta(model):
        # Meta shards become empty local shards; offloaded shards live on CPU, buffers on the device.
        # FSDPModule._apply re-registers the new shards with FSDP (and keeps tied parameters tied).
        model.to_empty(device="cpu" if offload else mesh.device_type)
        if offload:
            for module in model.modules():
                for name, buf in list(module.named_buffers(recurse=False)):
                    module._buffers[name] = buf.to(mesh.device_type)
    return model


def _apply_fsdp1(
    model: nn.Module,
    layers: list[nn.Module],
    mesh: DeviceMesh,
    mp: MixedPrecisionDtypes,
    reshard_after_forward: bool,
    offload: bool,
    forward_prefetch: bool,
) -> nn.Module:
    on_gpu = mesh.device_type == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    memo: dict[int, nn.Parameter] = {}
    param_init_fn = (
        functools.partial(_materialize_module, device=device, memo=memo) if _has_meta(model) else None
    )
    hybrid = mesh.ndim == 2
    if hybrid and mesh["fsdp"].size() == 1:
        # Pure replication (fsdp_size=1). FSDP1 turns a size-1 shard group into NO_SHARD over that
        # group and then never all-reduces across the replicas; NO_SHARD over the replica dimension
        # is the correct (DDP-like) equivalent.
        strategy, mesh = ShardingStrategy.NO_SHARD, mesh["ddp"]
    elif reshard_after_forward:
        strategy = ShardingStrategy.HYBRID_SHARD if hybrid else ShardingStrategy.FULL_SHARD
    else:
        strategy = ShardingStrategy._HYBRID_SHARD_ZERO2 if hybrid else ShardingStrategy.SHARD_GRAD_OP
    return FSDP(
        model,
        # One FSDP unit per decoder layer, the root unit holds the rest (same grouping and reason as
        # the FSDP2 order above: the auto-wrap policy wraps the layers before the root).
        auto_wrap_policy=functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls={type(layer) for layer in layers}
        ),
        sharding_strategy=strategy,
        mixed_precision=MixedPrecision(param_dtype=mp[0], reduce_dtype=mp[1], buffer_dtype=mp[2]),
        cpu_offload=CPUOffload(offload_params=offload),
        # FSDP1 needs an explicit device on CPU (device_id=cpu), else it looks for CUDA.
        device_id=device,
        device_mesh=mesh,
        use_orig_params=True,
        param_init_fn=param_init_fn,
        forward_prefetch=forward_prefetch,
    )


def apply_fsdp(
    model: nn.Module,
    parallel_dims: ParallelDims,
    strategy: str = "fsdp2",
    mixed_precision: Any = None,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    enable_gradient_checkpointing: bool = False,
    sync_module_states: bool = False,
    forward_prefetch: bool = False,
) -> nn.Module:
    """Shard ``model`` with FSDP2 or FSDP1 over ``parallel_dims.fsdp_mesh``; the only wrapping path.

    Each decoder layer (see `find_decoder_layers`) becomes one FSDP unit, the root one more. A 2D
    (hybrid) mesh gives HSDP (FSDP2) / ``HYBRID_SHARD`` (FSDP1). FSDP averages gradients over the ranks
    of the mesh: feed each rank its share of the batch and a loss normalised by the *global* count.

    Args:
        model: an HF-style model on CPU (or on ``meta`` on non-zero ranks with ``sync_module_states``).
        parallel_dims: layout whose meshes are built (`ParallelDims.build_meshes`).
        strategy: ``"fsdp2"`` (``fully_shard``) or ``"fsdp"`` (``FullyShardedDataParallel``).
        mixed_precision: the ``fsdp_config.mixed_precision`` section (`mixed_precision_dtypes`); None = fp32.
        reshard_after_forward: free the gathered weights after forward (ZeRO-3) or keep them (ZeRO-2).
        cpu_offload: keep sharded params, grads and optimizer state on CPU (GPU runs; a logged no-op on
            CPU, where they already are).
        enable_gradient_checkpointing: call HF ``gradient_checkpointing_enable(use_reentrant=False)``.
        sync_module_states: rank 0 holds the real weights and the other ranks a copy (typically on
            ``meta``) of the same architecture; after wrapping every shard equals rank 0's weights.
        forward_prefetch: issue the next decoder layer's all-gather when a layer starts its forward
            (FSDP1's ``forward_prefetch``; FSDP2: ``set_modules_to_forward_prefetch``), overlapping it
            with this layer's compute at the cost of one more layer's gathered weights.

    Returns:
        The sharded model (FSDP2: ``model`` itself, now an ``FSDPModule``; FSDP1: the wrapper).
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"{_key(parallel_dims.key_prefix, 'strategy')}={strategy!r} must be one of {STRATEGIES}"
        )
    mp = mixed_precision_dtypes(
        mixed_precision, _key(parallel_dims.key_prefix, "fsdp_config.mixed_precision")
    )
    mesh = parallel_dims.fsdp_mesh
    offload = cpu_offload and mesh.device_type == "cuda"
    if cpu_offload and not offload:
        log_once(
            logger,
            "cpu_offload=True has no effect on a CPU run: parameters and optimizer already live on CPU",
        )
    if enable_gradient_checkpointing:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise TypeError(f"{type(model).__name__} has no gradient_checkpointing_enable()")
        # Non-reentrant checkpointing; the recomputation runs in the forward's Ulysses group.
        kwargs = {"use_reentrant": False, "context_fn": checkpoint_context_fn}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if _has_meta(model) and not sync_module_states:
        raise ValueError("model has meta tensors: pass sync_module_states=True with real weights on rank 0")
    # Keep references to rank 0's real tensors: wrapping replaces the module's parameters by shards.
    full_state = model.state_dict() if sync_module_states and dist.get_rank() == 0 else {}
    layers = find_decoder_layers(model)
    apply = _apply_fsdp2 if strategy == "fsdp2" else _apply_fsdp1
    model = apply(model, layers, mesh, mp, reshard_after_forward, offload, forward_prefetch)
    if sync_module_states:
        _load_from_rank0(model, full_state)
    return model


def build_sharded_model(
    load_fn: Callable[[torch.device], nn.Module],
    parallel_dims: ParallelDims,
    strategy: str = "fsdp2",
    rank0_only_load: bool = True,
    **apply_kwargs: Any,
) -> nn.Module:
    """Load a model with at most one full copy (on rank 0), then shard it with `apply_fsdp`.

    Example ``load_fn`` for a HF checkpoint::

        def load_fn(device):
            if device.type == "meta":
                with device:
                    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    Args:
        load_fn: ``load_fn(device)`` returns the model. With ``torch.device("cpu")`` it loads the real
            weights; with ``torch.device("meta")`` it builds the same architecture without weights.
        parallel_dims: layout with built meshes.
        strategy: ``"fsdp2"`` or ``"fsdp"``.
        rank0_only_load: True: rank 0 loads, the other ranks build on meta and receive their shards
            by broadcast (see the module docstring for memory). False: every rank loads, shards, frees.
        **apply_kwargs: forwarded to `apply_fsdp` (``mixed_precision``, ``cpu_offload``, ...).

    Returns:
        The sharded model.
    """
    on_meta = rank0_only_load and dist.get_rank() != 0
    model = load_fn(torch.device("meta") if on_meta else torch.device("cpu"))
    return apply_fsdp(model, parallel_dims, strategy, sync_module_states=rank0_only_load, **apply_kwargs)
