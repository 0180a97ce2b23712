"""Helpers for models wrapped by `rlflow.parallel.fsdp.apply_fsdp` (FSDP1 or FSDP2) or left unwrapped.

Every function here takes the wrapped model and hides the FSDP version:

* `clip_grad_norm_` — total L2 norm of the *full* gradient (all shards), clipping only when finite.
* `get_full_state_dict` — unsharded state dict on rank 0 (or on every rank), CPU tensors.
* `iter_full_params` — full parameters one at a time, to push weights into a rollout engine.
* `offload_optimizer_to_cpu` / `load_optimizer_to_device` — keep the optimizer state on CPU between
  updates (``fsdp_config.optimizer_offload``; no-ops, logged once, on CPU runs).

All functions that gather are collectives: every rank of the model's mesh must call them, in the same
order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import DTensor

__all__ = [
    "base_model_class",
    "clean_param_name",
    "clip_grad_norm_",
    "full_copy",
    "gather_full_grads",
    "gather_full_params",
    "get_full_state_dict",
    "is_fsdp1",
    "is_fsdp2",
    "iter_full_params",
    "load_optimizer_to_device",
    "log_once",
    "offload_optimizer_to_cpu",
    "unwrap_model",
]

logger = logging.getLogger(__name__)

_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_logged: set[str] = set()


def log_once(log: logging.Logger, message: str) -> None:
    """Log ``message`` as a warning the first time it is seen in this process."""
    if message not in _logged:
        _logged.add(message)
        log.warning(message)


def is_fsdp1(model: nn.Module) -> bool:
    """True when ``model`` is an FSDP1 ``FullyShardedDataParallel`` wrapper."""
    return isinstance(model, FSDP)


def is_fsdp2(model: nn.Module) -> bool:
    """True when ``fully_shard`` was applied to ``model``."""
    return isinstance(model, FSDPModule)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user module inside an FSDP1 wrapper (FSDP2 and plain modules are returned as they are)."""
    return model.module if isinstance(model, FSDP) else model


def base_model_class(model: nn.Module) -> type[nn.Module]:
    """The user's model class, e.g. ``Qwen2ForCausalLM``, also for FSDP2's dynamic ``FSDPQwen2ForCausalLM``."""
    return next(c for c in type(unwrap_model(model)).__mro__ if not issubclass(c, FSDPModule))


def clean_param_name(name: str) -> str:
    """Strip FSDP1 / activation-checkpoint / ``torch.compile`` wrapper prefixes from a parameter name."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


# --------------------------------------------------------------------------- gradients


def _comm_device() -> torch.device:
    """Device for scalar collectives: the same on every rank whatever holds the gradients (offload)."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def _total_norm(model: nn.Module, grads: list[torch.Tensor]) -> float:
    """L2 norm of the full gradient (this rank's view; see `clip_grad_norm_` for the agreement step)."""
    if isinstance(model, FSDP):
        # use_orig_params=True: each rank holds a disjoint piece of every flat gradient (None or
        # zero-size where it owns nothing) within its shard group; replicas of a hybrid mesh hold the
        # same pieces, so the sum of squares is reduced over the shard group only.
        local = torch.zeros((), dtype=torch.float64, device=_comm_device())
        if grads:
            local += torch.nn.utils.get_total_norm(grads, 2.0).to(local.device, torch.float64) ** 2
        if model.sharding_strategy != ShardingStrategy.NO_SHARD:
            # NO_SHARD (replication only) holds full gradients everywhere: nothing to reduce.
            dist.all_reduce(local, group=model.process_group)
        return float(local.sqrt())
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    # FSDP2: DTensor grads give a DTensor norm with a pending (partial) reduction over the shards.
    return float(total.full_tensor() if isinstance(total, DTensor) else total)


def clip_grad_norm_(model: nn.Module, max_norm: float) -> float:
    """Clip gradients of a (sharded) model to total L2 norm ``max_norm``; return the pre-clip norm.

    The norm is over the *full* gradient (all shards) and equals the unsharded model's up to summation
    order. Gradients are scaled by ``min(1, max_norm / (norm + 1e-6))`` (as ``torch.nn.utils``) only when
    the norm is finite; a non-finite norm (``inf``/``nan``) is returned unchanged and the gradients are
    left as they are, so the caller can skip the optimizer step. For sharded models the ranks of the
    default process group also agree on finiteness (one scalar all-reduce): if any rank sees a
    non-finite norm (e.g. a replica of a hybrid mesh), every rank returns a non-finite value (its own
    ``inf``/``nan``, else ``nan``), so no rank steps while another skips.

    Args:
        model: FSDP1 wrapper, FSDP2 module or plain module (collective for the sharded ones).
        max_norm: maximum total L2 norm (> 0).

    Returns:
        The total L2 norm before clipping, as a Python float (``inf``/``nan`` preserved).
    """
    if not max_norm > 0:
        raise ValueError(f"clip_grad (max_norm)={max_norm!r} must be > 0")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = _total_norm(model, grads)
    if (is_fsdp1(model) or is_fsdp2(model)) and dist.is_initialized():
        bad = torch.tensor(0.0 if math.isfinite(total) else 1.0, device=_comm_device())
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item() > 0 and math.isfinite(total):
            total = math.nan
    if math.isfinite(total):
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            with torch.no_grad():
                for grad in grads:
                    grad.mul_(coef)
    return total


# --------------------------------------------------------------------------- full parameters


def get_full_state_dict(model: nn.Module, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """Unsharded state dict (HF key names, CPU tensors) of a wrapped or plain model (collective).

    FSDP2 uses ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` for the rank-0 case, so
    each tensor is gathered and moved to CPU one at a time. FSDP1 is gathered with
    ``offload_to_cpu=False`` on CPU runs (``True`` segfaults there, see MACHINE_NOTES), so every rank
    briefly holds the full tensors; on GPU it offloads like FSDP2. Tied weights appear under both keys.

    Args:
        model: FSDP1 wrapper, FSDP2 module or plain module.
        rank0_only: True: rank 0 gets the dict and other ranks ``{}``; False: every rank gets it.

    Returns:
        ``{name: tensor}`` with full CPU tensors (``{}`` on ranks other than 0 when ``rank0_only``).
    """
    if not (is_fsdp1(model) or is_fsdp2(model)):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    offload = rank0_only and (is_fsdp2(model) or torch.cuda.is_available())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if rank0_only and dist.get_rank() != 0:
        return {}
    return {clean_param_name(k): v.detach().cpu() for k, v in state.items()}


def full_copy(t: torch.Tensor) -> torch.Tensor:
    """A full, detached tensor that shares no memory with ``t`` (gathered when ``t`` is a DTensor).

    ``DTensor.full_tensor()`` returns the local tensor itself when nothing needs gathering (a mesh
    dimension of size 1), so its result is copied when it aliases the shard.
    """
    if not isinstance(t, DTensor):
        return t.detach().clone()
    full = t.full_tensor().detach()
    local = t.to_local()
    if full.numel() > 0 and full.untyped_storage().data_ptr() == local.untyped_storage().data_ptr():
        full = full.clone()
    return full


def _fsdp1_own_params(unit: FSDP) -> list[tuple[str, nn.Parameter]]:
    """Parameters of an FSDP1 unit that no nested unit owns, named relative to ``unit.module``."""
    out: list[tuple[str, nn.Parameter]] = []

    def visit(module: nn.Module, prefix: str) -> None:
        out.extend((prefix + name, p) for name, p in module.named_parameters(recurse=False))
        for child_name, child in module.named_children():
            if not isinstance(child, FSDP):
                visit(child, f"{prefix}{child_name}.")

    visit(unit.module, "")
    return out


def iter_full_params(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full parameter)`` one at a time, e.g. to load weights into a rollout engine.

    Collective: every rank must exhaust the iterator in step. Names are the unwrapped HF names; a tied
    parameter is yielded once, under its first name (``model.embed_tokens.weight``); buffers are not
    yielded. Tensors are fresh copies on the parameter's device (CPU when CPU-offloaded), in the
    sharded (master) dtype. Peak extra memory: FSDP2 one parameter; FSDP1 one FSDP unit (one decoder
    layer, or the root's embeddings and head).

    Args:
        model: FSDP1 wrapper, FSDP2 module or plain module.

    Yields:
        ``(name, tensor)`` pairs: ``named_parameters`` order (FSDP1: unit by unit, the root unit first).
    """
    if not is_fsdp1(model):
        for name, param in model.named_parameters():
            yield clean_param_name(name), full_copy(param)
        return
    seen: set[int] = set()
    for unit_name, unit in model.named_modules():
        if not isinstance(unit, FSDP):
            continue
        prefix = clean_param_name(f"{unit_name}." if unit_name else "")
        with FSDP.summon_full_params(unit, recurse=False, writeback=False):
            for name, param in _fsdp1_own_params(unit):
                if id(param) not in seen:
                    seen.add(id(param))
                    yield prefix + clean_param_name(name), param.detach().clone()


def gather_full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every full parameter on every rank (collective; for tests and debugging of small models)."""
    return dict(iter_full_params(model))


def gather_full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) gradients keyed by the unwrapped parameter name (collective; tests/debugging).

    Parameters without a gradient are left out.
    """
    if isinstance(model, FSDP):
        with FSDP.summon_full_params(model, writeback=False, with_grads=True):
            return {
                clean_param_name(n): p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.grad is not None
            }
    return {clean_param_name(n): full_copy(p.grad) for n, p in model.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------- offload between phases


def _gpu_or_log(what: str) -> bool:
    if torch.cuda.is_available():
        return True
    log_once(logger, f"{what}: no GPU, nothing to offload (a no-op on CPU runs)")
    return False


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: Any) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            # AdamW keeps its `step` counters on CPU (capturable=False): leave them there.
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)


def offload_optimizer_to_cpu(optimizer: torch.optim.Optimizer) -> None:
    """Move the optimizer state tensors (AdamW moments) to CPU (no-op on CPU runs).

    Args:
        optimizer: any ``torch.optim`` optimizer (states may be DTensors).
    """
    if _gpu_or_log("optimizer offload"):
        _move_optimizer_state(optimizer, "cpu")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def load_optimizer_to_device(
    optimizer: torch.optim.Optimizer, device: torch.device | str | None = None
) -> None:
    """Move the optimizer states back to ``device`` (the current CUDA device by default).

    Args:
        optimizer: optimizer offloaded by `offload_optimizer_to_cpu`.
        device: target device; ``None`` = ``torch.cuda.current_device()``.
    """
    if _gpu_or_log("optimizer offload"):
        _move_optimizer_state(optimizer, device or torch.device("cuda", torch.cuda.current_device()))
