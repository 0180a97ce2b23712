"""The one place where rlflow applies data parallelism to a model.

Actor, critic, reference and reward model all go through the same steps:

1. `ParallelDims` — validated once from the role's config (world size, ``fsdp_size``,
   ``ulysses_sequence_parallel_size``); `ParallelDims.build_meshes` then creates the FSDP mesh (1D
   ``("fsdp",)`` or, for hybrid sharding, 2D ``("ddp", "fsdp")``) and the Ulysses mesh ``("dp", "sp")``.
2. `build_sharded_model` (loading) and `apply_fsdp` (wrapping) — FSDP2 (``fully_shard``) or FSDP1
   (``FullyShardedDataParallel``), mixed precision, CPU offload, gradient checkpointing.
3. Training helpers in `rlflow.workers.fsdp_utils` (re-exported here): `clip_grad_norm_`, full state
   dicts, one-tensor-at-a-time parameter export, GPU offload between phases.

Layout of the two meshes (world 4, sp 2): the FSDP mesh shards parameters over all 4 ranks; the
Ulysses mesh groups ranks ``[[0, 1], [2, 3]]`` so ranks 0 and 1 see the same samples (dp rank 0) and
split each sequence between them (sp ranks 0 and 1). Only sp rank 0 of each group "collects" outputs.

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

CPU offload is a GPU feature (FSDP2 ``CPUOffloadPolicy`` / FSDP1 ``CPUOffload``: sharded parameters,
gradients and hence optimizer states live on CPU); on a CPU-only run everything already lives on CPU,
so ``cpu_offload=True`` is a no-op that logs one warning.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
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

from rlflow.utils.distributed import device_type as _default_device_type
from rlflow.utils.ulysses import checkpoint_context_fn
from rlflow.workers.fsdp_utils import (
    clean_param_name,
    clip_grad_norm_,
    gather_full_grads,
    gather_full_params,
    get_full_state_dict,
    is_fsdp1,
    is_fsdp2,
    iter_full_params,
    load_model_to_device,
    load_optimizer_to_device,
    log_once,
    offload_model_to_cpu,
    offload_optimizer_to_cpu,
    unwrap_model,
)

__all__ = [
    "STRATEGIES",
    "MixedPrecisionConfig",
    "ParallelDims",
    "apply_fsdp",
    "build_sharded_model",
    "clean_param_name",
    "clip_grad_norm_",
    "find_decoder_layers",
    "gather_full_grads",
    "gather_full_params",
    "get_full_state_dict",
    "is_fsdp1",
    "is_fsdp2",
    "iter_full_params",
    "load_model_to_device",
    "load_optimizer_to_device",
    "offload_model_to_cpu",
    "offload_optimizer_to_cpu",
    "unwrap_model",
    "validate_parallel_sizes",
]

logger = logging.getLogger(__name__)

STRATEGIES = ("fsdp", "fsdp2")
"""``"fsdp"``: FSDP1 ``FullyShardedDataParallel``; ``"fsdp2"``: per-parameter sharding with ``fully_shard``."""

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# --------------------------------------------------------------------------- sizes and meshes


def validate_parallel_sizes(
    world_size: int,
    fsdp_size: int = -1,
    ulysses_sequence_parallel_size: int = 1,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    key_prefix: str = "",
    fsdp_size_key: str = "fsdp_config.fsdp_size",
) -> int:
    """Check the parallel sizes of one role and return the resolved FSDP shard size.

    A pure function of sizes (no process group needed), so every error message is unit-testable. The
    key/value-head rule matches `rlflow.models.attention.check_ulysses_heads`: kv heads are split when
    ``sp`` divides them and repeated when they divide ``sp``.

    Args:
        world_size: number of ranks of the role's worker group.
        fsdp_size: ranks one parameter is sharded over; ``-1`` means the whole world. A value below
            the world size gives hybrid sharding (``world_size // fsdp_size`` replicas).
        ulysses_sequence_parallel_size: Ulysses sequence-parallel group size (1 = off).
        num_attention_heads: query heads of the model, checked against the Ulysses size when given.
        num_key_value_heads: key/value heads of the model, checked against the Ulysses size when given.
        key_prefix: config path of the role, e.g. ``"critic"`` or ``"actor_rollout_ref.actor"``.
        fsdp_size_key: path of ``fsdp_size`` under ``key_prefix`` (the critic uses
            ``"model.fsdp_config.fsdp_size"``).

    Returns:
        The FSDP shard size (``world_size`` when ``fsdp_size == -1``).

    Raises:
        ValueError: naming the offending key, e.g.
            ``critic.ulysses_sequence_parallel_size=3 must divide the world size 4``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{_key(key_prefix, 'world size')} must be a positive integer, got {world_size!r}")
    fkey = _key(key_prefix, fsdp_size_key)
    if isinstance(fsdp_size, bool) or not isinstance(fsdp_size, int) or (fsdp_size != -1 and fsdp_size < 1):
        raise ValueError(f"{fkey}={fsdp_size!r} must be -1 (whole world) or a positive integer")
    shard = world_size if fsdp_size == -1 else fsdp_size
    if world_size % shard != 0:
        raise ValueError(f"{fkey}={fsdp_size} must divide the world size {world_size}")
    sp = ulysses_sequence_parallel_size
    skey = _key(key_prefix, "ulysses_sequence_parallel_size")
    if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
        raise ValueError(f"{skey}={sp!r} must be a positive integer")
    if world_size % sp != 0:
        raise ValueError(f"{skey}={sp} must divide the world size {world_size}")
    if num_attention_heads is not None and num_attention_heads % sp != 0:
        raise ValueError(f"{skey}={sp} must divide the model's num_attention_heads={num_attention_heads}")
    if num_key_value_heads is not None and num_key_value_heads % sp != 0 and sp % num_key_value_heads != 0:
        raise ValueError(
            f"{skey}={sp} must divide the model's num_key_value_heads={num_key_value_heads} or be a "
            "multiple of it"
        )
    return shard


@dataclass
class ParallelDims:
    """Parallel layout of one role, validated at construction (`validate_parallel_sizes`).

    Attributes:
        world_size: ranks in the role's worker group.
        fsdp_size: ``-1`` (whole world) on input; resolved to the shard-group size.
        ulysses_sequence_parallel_size: Ulysses group size ``sp``; ``dp = world_size // sp``.
        num_attention_heads: optional, validated against ``sp``.
        num_key_value_heads: optional, validated against ``sp``.
        key_prefix: config path used in error messages (``"critic"``, ``"actor_rollout_ref.actor"``).
        fsdp_size_key: path of ``fsdp_size`` under ``key_prefix``.
        rank: this process's global rank (``dist.get_rank()``, or 0 without a process group, by default).
    """

    world_size: int
    fsdp_size: int = -1
    ulysses_sequence_parallel_size: int = 1
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    key_prefix: str = ""
    fsdp_size_key: str = "fsdp_config.fsdp_size"
    rank: int = -1
    _fsdp_mesh: DeviceMesh | None = field(default=None, init=False, repr=False)
    _ulysses_mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.fsdp_size = validate_parallel_sizes(
            self.world_size,
            self.fsdp_size,
            self.ulysses_sequence_parallel_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.key_prefix,
            self.fsdp_size_key,
        )
        if self.rank == -1:
            self.rank = dist.get_rank() if dist.is_initialized() else 0
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside the world size {self.world_size}")

    @property
    def replicate_size(self) -> int:
        """Number of FSDP replicas (> 1 only with hybrid sharding)."""
        return self.world_size // self.fsdp_size

    @property
    def hybrid(self) -> bool:
        """True when parameters are sharded within groups and replicated across them (HSDP)."""
        return self.replicate_size > 1

    @property
    def sp_size(self) -> int:
        """Ulysses sequence-parallel size."""
        return self.ulysses_sequence_parallel_size

    @property
    def dp_size(self) -> int:
        """Data-parallel size: number of distinct sample shards, ``world_size // sp_size``."""
        return self.world_size // self.sp_size

    @property
    def dp_rank(self) -> int:
        """Index of this rank's sample shard (row of the ``("dp", "sp")`` mesh)."""
        return self.rank // self.sp_size

    @property
    def sp_rank(self) -> int:
        """Position of this rank inside its Ulysses group (column of the ``("dp", "sp")`` mesh)."""
        return self.rank % self.sp_size

    @property
    def is_collect_rank(self) -> bool:
        """True on the rank whose outputs stand for its Ulysses group (sp rank 0)."""
        return self.sp_rank == 0

    def build_meshes(self, device_type: str | None = None) -> ParallelDims:
        """Create the FSDP and Ulysses device meshes (collective: every rank must call it, once).

        The process group must exist (`rlflow.utils.distributed.init_distributed`, which picks gloo on
        CPU and NCCL on GPU).

        Args:
            device_type: ``"cpu"`` or ``"cuda"``; ``None`` picks CUDA when available.

        Returns:
            ``self``, with `fsdp_mesh` and `ulysses_mesh` set.
        """
        if not dist.is_initialized():
            raise RuntimeError("call rlflow.utils.distributed.init_distributed() before build_meshes()")
        if dist.get_world_size() != self.world_size:
            raise ValueError(
                f"{_key(self.key_prefix, 'world size')}: ParallelDims has {self.world_size} ranks but the "
                f"process group has {dist.get_world_size()}"
            )
        if self._fsdp_mesh is not None:
            raise RuntimeError("ParallelDims.build_meshes() was already called")
        device_type = device_type or _default_device_type()
        if self.hybrid:
            shape, names = (self.replicate_size, self.fsdp_size), ("ddp", "fsdp")
        else:
            shape, names = (self.world_size,), ("fsdp",)
        self._fsdp_mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        self._ulysses_mesh = init_device_mesh(
            device_type, (self.dp_size, self.sp_size), mesh_dim_names=("dp", "sp")
        )
        return self

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """1D ``("fsdp",)`` mesh, or 2D ``("ddp", "fsdp")`` with hybrid sharding."""
        if self._fsdp_mesh is None:
            raise RuntimeError("ParallelDims.build_meshes() has not been called")
        return self._fsdp_mesh

    @property
    def ulysses_mesh(self) -> DeviceMesh:
        """2D ``("dp", "sp")`` mesh; ``ulysses_mesh["sp"].get_group()`` is the all-to-all group."""
        if self._ulysses_mesh is None:
            raise RuntimeError("ParallelDims.build_meshes() has not been called")
        return self._ulysses_mesh


# --------------------------------------------------------------------------- mixed precision


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Dtypes FSDP uses for compute, gradient reduction and buffers.

    ``{"param_dtype": "bf16", "reduce_dtype": "fp32"}`` is the usual GPU recipe (sharded master weights
    and optimizer states stay in the dtype the model was loaded in, normally fp32); the default (all
    fp32) is exact. FSDP2 does not manage buffers, so ``buffer_dtype`` only affects FSDP1.

    Attributes:
        param_dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (``"float32"`` etc. also accepted).
        reduce_dtype: dtype of the gradient reduce-scatter / all-reduce.
        buffer_dtype: dtype of module buffers (FSDP1).
    """

    param_dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    buffer_dtype: str = "fp32"

    @classmethod
    def from_dict(
        cls, cfg: Mapping[str, Any] | None, key_prefix: str = "mixed_precision"
    ) -> MixedPrecisionConfig:
        """Build from a config mapping, raising ``ValueError`` naming unknown keys or dtypes.

        Args:
            cfg: mapping with any of ``param_dtype``, ``reduce_dtype``, ``buffer_dtype``; ``None`` = defaults.
            key_prefix: config path used in error messages.
        """
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - {"param_dtype", "reduce_dtype", "buffer_dtype"})
        if unknown:
            raise ValueError(f"{key_prefix}: unknown keys {unknown}")
        out = cls(**{k: str(v) for k, v in cfg.items()})
        for name in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            value = getattr(out, name)
            if value not in _DTYPES:
                raise ValueError(f"{key_prefix}.{name}={value!r} must be one of {sorted(_DTYPES)}")
        return out

    def dtype(self, name: str) -> torch.dtype:
        """The torch dtype of field ``name``."""
        return _DTYPES[getattr(self, name)]

    def fsdp2_policy(self) -> MixedPrecisionPolicy:
        """FSDP2 ``MixedPrecisionPolicy`` for this config."""
        return MixedPrecisionPolicy(
            param_dtype=self.dtype("param_dtype"), reduce_dtype=self.dtype("reduce_dtype")
        )

    def fsdp1_policy(self) -> MixedPrecision:
        """FSDP1 ``MixedPrecision`` for this config."""
        return MixedPrecision(
            param_dtype=self.dtype("param_dtype"),
            reduce_dtype=self.dtype("reduce_dtype"),
            buffer_dtype=self.dtype("buffer_dtype"),
        )


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
    mp: MixedPrecisionConfig,
    reshard_after_forward: bool,
    offload: bool,
) -> nn.Module:
    kwargs = {
        "mesh": mesh,
        "mp_policy": mp.fsdp2_policy(),
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
    mp: MixedPrecisionConfig,
    reshard_after_forward: bool,
    offload: bool,
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
        mixed_precision=mp.fsdp1_policy(),
        cpu_offload=CPUOffload(offload_params=offload),
        # FSDP1 needs an explicit device on CPU (device_id=cpu), else it looks for CUDA.
        device_id=device,
        device_mesh=mesh,
        use_orig_params=True,
        param_init_fn=param_init_fn,
    )


def apply_fsdp(
    model: nn.Module,
    parallel_dims: ParallelDims,
    strategy: str = "fsdp2",
    mixed_precision: MixedPrecisionConfig | Mapping[str, Any] | None = None,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    enable_gradient_checkpointing: bool = False,
    sync_module_states: bool = False,
) -> nn.Module:
    """Shard ``model`` with FSDP2 or FSDP1 over ``parallel_dims.fsdp_mesh``; the only wrapping path.

    Each decoder layer (see `find_decoder_layers`) becomes one FSDP unit, the root one more. A 2D
    (hybrid) mesh gives HSDP (FSDP2) / ``HYBRID_SHARD`` (FSDP1). FSDP averages gradients over the ranks
    of the mesh: feed each rank its share of the batch and a loss normalised by the *global* count.

    Args:
        model: an HF-style model on CPU (or on ``meta`` on non-zero ranks with ``sync_module_states``).
        parallel_dims: layout whose meshes are built (`ParallelDims.build_meshes`).
        strategy: ``"fsdp2"`` (``fully_shard``) or ``"fsdp"`` (``FullyShardedDataParallel``).
        mixed_precision: `MixedPrecisionConfig` or a mapping of its fields; ``None`` = all fp32.
        reshard_after_forward: free the gathered weights after forward (ZeRO-3) or keep them (ZeRO-2).
        cpu_offload: keep sharded params, grads and optimizer state on CPU (GPU runs; a logged no-op on
            CPU, where they already are).
        enable_gradient_checkpointing: call HF ``gradient_checkpointing_enable(use_reentrant=False)``.
        sync_module_states: rank 0 holds the real weights and the other ranks a copy (typically on
            ``meta``) of the same architecture; after wrapping every shard equals rank 0's weights.

    Returns:
        The sharded model (FSDP2: ``model`` itself, now an ``FSDPModule``; FSDP1: the wrapper).
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"{_key(parallel_dims.key_prefix, 'strategy')}={strategy!r} must be one of {STRATEGIES}"
        )
    if not isinstance(mixed_precision, MixedPrecisionConfig):
        mp_key = _key(parallel_dims.key_prefix, "fsdp_config.mixed_precision")
        mixed_precision = MixedPrecisionConfig.from_dict(mixed_precision, mp_key)
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
    model = apply(model, layers, mesh, mixed_precision, reshard_after_forward, offload)
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
