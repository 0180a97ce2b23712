"""`ParallelDims`: the parallel layout of one role, validated once, and its device meshes.

Layout of the two meshes (world 4, sp 2): the FSDP mesh shards parameters over all 4 ranks (1D
``("fsdp",)``, or 2D ``("ddp", "fsdp")`` for hybrid sharding); the Ulysses mesh ``("dp", "sp")`` groups
ranks ``[[0, 1], [2, 3]]`` so ranks 0 and 1 see the same samples (dp rank 0) and split each sequence
between them (sp ranks 0 and 1). Only sp rank 0 of each group "collects" outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlflow.parallel.distributed import device_type as _default_device_type

__all__ = ["ParallelDims", "validate_parallel_sizes"]


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

        The process group must exist (`rlflow.parallel.distributed.init_distributed`, which picks gloo on
        CPU and NCCL on GPU).

        Args:
            device_type: ``"cpu"`` or ``"cuda"``; ``None`` picks CUDA when available.

        Returns:
            ``self``, with `fsdp_mesh` and `ulysses_mesh` set.
        """
        if not dist.is_initialized():
            raise RuntimeError("call rlflow.parallel.distributed.init_distributed() before build_meshes()")
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
