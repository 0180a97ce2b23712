"""Sharded training checkpoints and HF model export for FSDP1 / FSDP2 / plain models.

A checkpoint directory (one per role and step, e.g. ``global_step_10/critic``) holds::

    model_optim/                 torch.distributed.checkpoint: model + optimizer shards of every rank
    extra_state_rank{r}.pt       per rank: LR scheduler, RNG states (python, numpy, torch CPU, CUDA),
                                 and the caller's ``extra_state`` (e.g. the trainer's step counter)
    meta.json                    format version, world size, strategy
    COMPLETE                     written last: marks the directory as whole

Atomicity: every rank writes into ``<ckpt_dir>.tmp``; after a barrier rank 0 writes ``meta.json`` and
``COMPLETE`` and renames the staging directory to ``<ckpt_dir>`` (an older ``<ckpt_dir>`` is replaced
only then), so a crash mid-save never leaves a directory that `load_checkpoint` or
`find_latest_checkpoint` would accept. Multi-node runs need ``ckpt_dir`` on a shared filesystem.

Model and optimizer states go through ``torch.distributed.checkpoint.state_dict.get_state_dict`` (sharded
DTensors for FSDP2, sharded state dicts for FSDP1, plain tensors otherwise), so they load back bitwise
and can be resharded to another world size; the RNG states are per rank and are restored only on the
same world size. Files are written by rlflow and loaded with ``weights_only=False`` (they hold numpy RNG states):
load only checkpoints you trust.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlflow.parallel.sharded import base_model_class, get_full_state_dict, is_fsdp1, is_fsdp2, unwrap_model

__all__ = [
    "COMPLETE_MARKER",
    "check_model_matches",
    "checkpoint_meta",
    "export_hf",
    "find_latest_checkpoint",
    "get_rng_state",
    "is_checkpoint_complete",
    "load_checkpoint",
    "save_checkpoint",
    "saved_model_shapes",
    "set_rng_state",
]

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
FORMAT_VERSION = 1
_MODEL_OPTIM_DIR = "model_optim"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _strategy(model: nn.Module) -> str:
    return "fsdp" if is_fsdp1(model) else "fsdp2" if is_fsdp2(model) else "none"


# --------------------------------------------------------------------------- RNG


def get_rng_state() -> dict[str, Any]:
    """RNG states of this process: python ``random``, numpy global, torch CPU and (if present) CUDA."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states from `get_rng_state` (the CUDA state only when CUDA is available here too)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- directories


def checkpoint_meta(ckpt_dir: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's ``meta.json``: ``format_version``, ``world_size`` (the ranks that wrote it),
    ``strategy`` and ``has_optimizer``."""
    return json.loads((Path(ckpt_dir) / "meta.json").read_text())


def is_checkpoint_complete(ckpt_dir: str | os.PathLike) -> bool:
    """True when ``ckpt_dir`` holds the ``COMPLETE`` marker written at the end of `save_checkpoint`."""
    return (Path(ckpt_dir) / COMPLETE_MARKER).is_file()


def find_latest_checkpoint(root_dir: str | os.PathLike, prefix: str = "global_step_") -> str | None:
    """The complete ``<root_dir>/<prefix><step>`` directory with the largest step, or None.

    A step directory counts as complete when it has the marker itself or when all its (role)
    subdirectories that are checkpoints have it and at least one exists.

    Args:
        root_dir: directory holding the step directories (``trainer.default_local_dir``).
        prefix: step directory prefix.
    """
    root = Path(root_dir)
    if not root.is_dir():
        return None
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)$")
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        match = pattern.match(child.name)
        if not match or not child.is_dir():
            continue
        roles = [d for d in child.iterdir() if d.is_dir() and (d / _MODEL_OPTIM_DIR).exists()]
        complete = is_checkpoint_complete(child) or (roles and all(is_checkpoint_complete(d) for d in roles))
        if complete and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), child)
    return str(best[1]) if best else None


def _publish(staging: Path, target: Path, meta: dict[str, Any]) -> None:
    """Rank 0: write meta and the marker into ``staging`` and move it to ``target`` (replacing it)."""
    (staging / "meta.json").write_text(json.dumps(meta, indent=2))
    marker = staging / COMPLETE_MARKER
    tmp_marker = staging / (COMPLETE_MARKER + ".tmp")
    tmp_marker.write_text("ok\n")
    os.replace(tmp_marker, marker)
    old = target.with_name(target.name + ".old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- save / load


def save_checkpoint(
    ckpt_dir: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any | None = None,
    extra_state: dict[str, Any] | None = None,
) -> str:
    """Save a sharded checkpoint of model, optimizer, LR scheduler and RNG states (collective).

    Every rank of the model's process group must call it with the same ``ckpt_dir``.

    Args:
        ckpt_dir: target directory; replaced atomically when it already exists.
        model: FSDP1 wrapper, FSDP2 module or plain module.
        optimizer: optimizer over ``model``'s parameters, or None.
        lr_scheduler: object with ``state_dict()``/``load_state_dict()``, or None.
        extra_state: picklable per-rank data to store alongside (returned by `load_checkpoint`).

    Returns:
        ``ckpt_dir`` as a string.
    """
    target = Path(ckpt_dir)
    staging = target.with_name(target.name + ".tmp")
    if _rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizers=optimizer if optimizer is not None else [])
    state = {"model": model_sd} if optimizer is None else {"model": model_sd, "optim": optim_sd}
    dcp.save(state, checkpoint_id=str(staging / _MODEL_OPTIM_DIR), no_dist=not dist.is_initialized())
    extra = {
        "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
        "rng": get_rng_state(),
        "extra_state": extra_state,
    }
    torch.save(extra, staging / f"extra_state_rank{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        meta = {
            "format_version": FORMAT_VERSION,
            "world_size": _world_size(),
            "strategy": _strategy(model),
            "has_optimizer": optimizer is not None,
        }
        _publish(staging, target, meta)
    _barrier()
    return str(target)


def saved_model_shapes(ckpt_dir: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{parameter or buffer name: global shape}`` of the model a checkpoint holds, from its DCP metadata
    (no tensor is read; usable before any process group exists)."""
    reader = dcp.FileSystemReader(str(Path(ckpt_dir) / _MODEL_OPTIM_DIR))
    return {
        key.removeprefix("model."): tuple(entry.size)
        for key, entry in reader.read_metadata().state_dict_metadata.items()
        if key.startswith("model.") and hasattr(entry, "size")
    }


def _listed(names: set[str], limit: int = 3) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (", ..." if len(names) > limit else "")


def check_model_matches(ckpt_dir: str | os.PathLike, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse to load a checkpoint whose model is not this one: DCP ignores tensors the model lacks (a
    checkpoint's LoRA adapters loaded into a model without them would be dropped without a word) and
    fails deep inside on missing ones or other shapes.

    Args:
        ckpt_dir: a checkpoint directory written by `save_checkpoint`.
        shapes: ``{name: global shape}`` of the model's state dict as DCP sees it.

    Raises:
        ValueError: naming the tensors that differ (a LoRA hint when adapters are among them).
    """
    saved = saved_model_shapes(ckpt_dir)
    extra, missing = set(saved) - set(shapes), set(shapes) - set(saved)
    reshaped = {n for n in set(saved) & set(shapes) if saved[n] != tuple(shapes[n])}
    if not (extra or missing or reshaped):
        return
    problems = []
    if extra:
        problems.append(f"it holds {len(extra)} tensors this model lacks ({_listed(extra)})")
    if missing:
        problems.append(f"it lacks {len(missing)} tensors of this model ({_listed(missing)})")
    if reshaped:
        problems.append(
            "other shapes: "
            + ", ".join(f"{n}: {saved[n]} saved, {tuple(shapes[n])} here" for n in sorted(reshaped)[:3])
        )
    hint = ""
    if any(".lora_" in n for n in extra | missing | reshaped):
        hint = (
            "; its LoRA adapters differ from this run's: give the role the lora_rank, lora_alpha and "
            "target_modules it was saved with, or start afresh (trainer.resume_mode=disable)"
        )
    raise ValueError(
        f"{ckpt_dir}: the checkpoint's model is not this run's model: {'; '.join(problems)}{hint}"
    )


def load_checkpoint(
    ckpt_dir: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: Any | None = None,
    load_rng: bool = True,
) -> dict[str, Any] | None:
    """Restore a checkpoint written by `save_checkpoint` into already-built objects (collective).

    The model must be wrapped the same way as when saved only in the sense of parameter names; DCP
    reshards to the current layout. Model and optimizer state come back bitwise.

    Args:
        ckpt_dir: a complete checkpoint directory.
        model: FSDP1 wrapper, FSDP2 module or plain module (same architecture).
        optimizer: optimizer over ``model``'s parameters (its state may be empty), or None.
        lr_scheduler: scheduler to restore, or None.
        load_rng: restore this rank's RNG states. They are per rank, so only a checkpoint of the same
            world size has them; on another world size they are skipped (every rank keeps its current
            RNG state, i.e. the seed it started with) and a warning says so.

    Returns:
        The ``extra_state`` given to `save_checkpoint` on this rank (rank 0's when this rank did not
        exist in the saved run).

    Raises:
        FileNotFoundError: when the directory or its ``COMPLETE`` marker is missing.
        ValueError: for an optimizer request the checkpoint cannot satisfy.
    """
    path = Path(ckpt_dir)
    if not is_checkpoint_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    meta = checkpoint_meta(path)
    if optimizer is not None and not meta["has_optimizer"]:
        raise ValueError(
            f"{path} was saved without an optimizer state (checkpoint.save_contents without 'optimizer'): leave "
            "'optimizer' out of the role's checkpoint.load_contents to resume from it with a fresh optimizer"
        )
    if load_rng and meta["world_size"] != _world_size():
        load_rng = False
        if _rank() == 0:
            logger.warning(
                "%s was saved by %d ranks, this run has %d: model and optimizer are resharded, the per-rank "
                "RNG states are not restored (each rank keeps its start-up seed)",
                path,
                meta["world_size"],
                _world_size(),
            )
    model_sd, optim_sd = get_state_dict(model, optimizers=optimizer if optimizer is not None else [])
    check_model_matches(path, {name: tuple(t.size()) for name, t in model_sd.items()})
    state = {"model": model_sd} if optimizer is None else {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path / _MODEL_OPTIM_DIR), no_dist=not dist.is_initialized())
    set_state_dict(
        model,
        optimizers=optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
    )
    extra_file = path / f"extra_state_rank{_rank()}.pt"
    if not extra_file.exists():
        extra_file = path / "extra_state_rank0.pt"
    extra = torch.load(extra_file, weights_only=False)
    if lr_scheduler is not None:
        if extra["lr_scheduler"] is None:
            raise ValueError(
                f"{path} was saved without an LR scheduler state (checkpoint.save_contents without 'extra'): "
                "leave 'extra' out of the role's checkpoint.load_contents to resume from it"
            )
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    if load_rng:
        set_rng_state(extra["rng"])
    _barrier()
    return extra["extra_state"]


# --------------------------------------------------------------------------- HF export


def export_hf(
    model: nn.Module,
    tokenizer: Any | None,
    out_dir: str | os.PathLike,
    hf_config: Any | None = None,
    dtype: torch.dtype | None = None,
    state_fn: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    split_fn: Callable[[nn.Module, dict[str, torch.Tensor]], tuple[dict[str, torch.Tensor], Any]]
    | None = None,
) -> str:
    """Write a HF model directory (config, safetensors, generation config, tokenizer) (collective).

    The full state dict is gathered to rank 0 (CPU, one tensor at a time for FSDP2), loaded into a
    ``meta``-built instance of the model's own class (``assign=True``, no second copy), and saved with
    ``save_pretrained`` into ``<out_dir>.tmp``, then renamed to ``out_dir``. Other ranks wait at a
    barrier. ``AutoModel*.from_pretrained(out_dir)`` loads it back.

    Args:
        model: FSDP1 wrapper, FSDP2 module or plain HF ``PreTrainedModel``.
        tokenizer: saved alongside when not None.
        out_dir: target directory (replaced when it exists).
        hf_config: HF config to write; ``None`` = the model's ``config``.
        dtype: cast floating-point weights to this dtype (e.g. ``torch.bfloat16``); ``None`` keeps them.
        state_fn: applied to the full state dict on rank 0 before anything else, e.g.
            `rlflow.models.lora.merge_lora_state_dict` (the adapters folded into the base weights).
        split_fn: ``(unwrapped model, state) -> (state for the model's class, writer or None)``, after
            ``state_fn``; the writer is called with the staging directory after ``save_pretrained``, e.g.
            `rlflow.models.mtp.split_for_export` (the MTP layers to a file of their own).

    Returns:
        ``out_dir`` as a string.
    """
    state = get_full_state_dict(model, rank0_only=True)
    if _rank() == 0:
        if state_fn is not None:
            state = state_fn(state)
        inner = unwrap_model(model)
        extra = None
        if split_fn is not None:
            state, extra = split_fn(inner, state)
        # A copy: save_pretrained records dtype/architectures in the config it writes.
        config = copy.deepcopy(hf_config if hf_config is not None else inner.config)
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        with torch.device("meta"):
            hf_model = base_model_class(model)(config)
        try:
            hf_model.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as exc:
            raise ValueError(
                f"export_hf: the state dict does not fit {type(hf_model).__name__}: {exc}"
            ) from exc
        if getattr(inner, "generation_config", None) is not None:
            hf_model.generation_config = inner.generation_config
        target = Path(out_dir)
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        hf_model.save_pretrained(staging)
        if extra is not None:
            extra(str(staging))
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    _barrier()
    return str(out_dir)
