"""Full parameters of a sharded model, gathered in buckets (one collective per bucket).

Bringing the actor's weights into a rollout engine (the HF generation replica, vLLM) needs every full
parameter. Gathering them one ``DTensor.full_tensor()`` at a time costs one all-gather per tensor
(75 for a 6-layer Qwen2), and on small models the per-call latency dominates: on 2 gloo ranks a 1M
model takes 116 ms that way against 12 ms with one coalesced all-gather (13M: 224 vs 141 ms,
``scripts/bench`` notes in docs/benchmarks.md). `iter_full_param_buckets` packs consecutive parameters
into buckets of at most ``bucket_bytes`` (``actor_rollout_ref.rollout.update_weights_bucket_megabytes``,
verl's key) and gathers each bucket with one ``all_gather_single`` (``all_gather_into_tensor`` on torch
before 2.13, which has no ``all_gather_single``).

Layout of one bucket's gather. FSDP2 shards every parameter along dim 0 the way ``torch.chunk`` does:
rank ``r`` holds rows ``[r * c, min((r + 1) * c, n))`` with ``c = ceil(n / world)`` (the last ranks may
hold fewer rows, or none). Each rank flattens its shard of every parameter of the bucket, zero-padded to
``c`` rows, into one buffer; after the all-gather, row block ``r`` of the output is rank ``r``'s buffer,
so a parameter's full tensor is its ``c``-row pieces of every block, concatenated, cut to ``n`` rows.

Peak extra memory: about two buckets (the gathered buffer and the full tensors cut from it). A
parameter larger than the bucket is a bucket of its own. Parameters that are not sharded this way
(plain tensors, other placements, CPU-offloaded shards on a CUDA mesh) are gathered one at a time as
before. Collective: every rank of the mesh must exhaust the iterator in step. On a one-rank mesh (the CPU
demo's layout) a shard is the whole parameter and is copied once, without a collective (13M: the replica's
weight sync 0.09-0.11 -> 0.02-0.04 s).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from rlflow.parallel.sharded import clean_param_name, full_copy, is_fsdp1, iter_full_params

__all__ = ["MIB", "iter_full_param_buckets"]

MIB = 1 << 20

Named = list[tuple[str, torch.Tensor]]


def _coalescable(param: torch.Tensor) -> bool:
    """A DTensor sharded along dim 0 over a 1-D mesh, its shard on the mesh's device type."""
    if not isinstance(param, DTensor) or param.ndim == 0:
        return False
    mesh = param.device_mesh
    return (
        mesh.ndim == 1
        and tuple(param.placements) == (Shard(0),)
        and param.to_local().device.type == mesh.device_type
    )


def _signature(param: torch.Tensor) -> tuple:
    """Parameters with equal signatures can share one all-gather."""
    if not _coalescable(param):
        return ("single", id(param))
    return ("shard0", param.device_mesh, param.dtype, param.to_local().device)


def _all_gather_single():
    """torch >= 2.13's ``dist.all_gather_single``, or the older name of the same collective (which 2.13
    deprecates); looked up at call time, so the collective can be wrapped (the tests count calls)."""
    gather = getattr(dist, "all_gather_single", None)
    return gather if gather is not None else dist.all_gather_into_tensor


def _gather_shard0(params: list[DTensor]) -> list[torch.Tensor]:
    """Full tensors of dim-0 sharded DTensors on one 1-D mesh, with one all-gather (see the module doc)."""
    mesh = params[0].device_mesh
    world = mesh.size(0)
    if world == 1:  # the shard is the whole tensor: one copy instead of pack, gather, unpack and cut
        return [p.to_local().detach().clone() for p in params]
    rows = [math.ceil(p.shape[0] / world) for p in params]
    widths = [r * math.prod(p.shape[1:]) for p, r in zip(params, rows)]
    pieces = []
    for p, width in zip(params, widths):
        local = p.to_local().detach().reshape(-1)
        pieces.append(local)
        if local.numel() < width:
            pieces.append(local.new_zeros(width - local.numel()))
    flat = torch.cat(pieces)
    out = flat.new_empty(world * flat.numel())
    _all_gather_single()(out, flat, group=mesh.get_group(0))
    blocks = out.view(world, flat.numel())
    full, offset = [], 0
    for p, r, width in zip(params, rows, widths):
        stacked = blocks[:, offset : offset + width].reshape(world * r, *p.shape[1:])
        full.append(stacked[: p.shape[0]].clone())
        offset += width
    return full


def _buckets(params: Named, bucket_bytes: int) -> Iterator[Named]:
    """Consecutive runs of ``params`` with one signature and at most ``bucket_bytes`` of full tensors."""
    bucket: Named = []
    size, signature = 0, None
    for name, param in params:
        nbytes = param.numel() * param.element_size()
        sig = _signature(param)
        if bucket and (sig != signature or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, param))
        size += nbytes
        signature = sig
    if bucket:
        yield bucket


def iter_full_param_buckets(model: nn.Module, bucket_bytes: int) -> Iterator[Named]:
    """Yield lists of ``(name, full parameter)``, one collective per list (see the module docstring).

    Args:
        model: FSDP2 module, FSDP1 wrapper or plain module.
        bucket_bytes: the most bytes of full tensors per bucket (>= 1; one larger tensor is a bucket).

    Yields:
        Lists of ``(unwrapped HF name, full tensor)`` in ``named_parameters`` order (a tied parameter once,
        under its first name); the tensors are fresh, share no memory with the parameters, and are in
        the sharded (master) dtype. FSDP1: `iter_full_params` (one FSDP unit at a time), chunked.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
    if is_fsdp1(model):
        yield from _buckets(list(iter_full_params(model)), bucket_bytes)
        return
    for bucket in _buckets(list(model.named_parameters()), bucket_bytes):
        names = [clean_param_name(name) for name, _ in bucket]
        tensors = [p for _, p in bucket]
        if _coalescable(tensors[0]):
            yield list(zip(names, _gather_shard0(tensors)))  # type: ignore[arg-type]
        else:
            yield [(name, full_copy(t)) for name, t in zip(names, tensors)]
