"""Turn an actor or critic training checkpoint into a Hugging Face model directory.

::

    python -m rlflow.model_merger --local_dir checkpoints/rlflow/tiny_ppo/global_step_40/actor \\
        --target_dir exported/actor [--role actor|critic] [--model_path <base HF dir>] [--dtype bf16]

The trainer saves each role with `rlflow.parallel.checkpoint.save_checkpoint`: a
``torch.distributed.checkpoint`` (DCP) directory ``model_optim/`` holding the shards of every rank
under the keys ``model.<parameter name>`` (and ``optim.*``), plus ``meta.json`` and a ``COMPLETE``
marker. This tool needs no process group and no GPU: it reads the DCP metadata for the names, shapes
and dtypes of the ``model.*`` tensors, lets ``dcp.load(..., no_dist=True)`` assemble full tensors from
all shards in this one process (the optimizer state is never read), puts them into the model built from
its HF config, and writes ``save_pretrained`` output plus the tokenizer.

The architecture comes from the base model directory the run started from (``actor_rollout_ref.model.path``
for the actor, ``critic.model.path`` for the critic; ``rlflow://tiny`` or no path = the embedded tiny
model). The checkpoint does not record it today, so it is looked up in this order: ``--model_path``;
a ``model_path`` entry in ``meta.json``; a ``huggingface/`` directory (HF config) inside the checkpoint.
The actor is an ``AutoModelForCausalLM``; the critic an ``AutoModelForTokenClassification`` with one
label (the value model of `rlflow.models.loader.load_value_model`).

The output loads with ``AutoModelForCausalLM.from_pretrained(target_dir)`` (actor) or
``AutoModelForTokenClassification.from_pretrained(target_dir)`` (critic). Checkpoints are trusted input
(see `rlflow.parallel.checkpoint`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from rlflow.models.loader import load_tokenizer, resolve_dtype
from rlflow.models.lora import merge_lora_state_dict
from rlflow.models.mtp import split_for_export
from rlflow.models.tiny import TINY_MODEL_SENTINEL, resolve_model_path

__all__ = [
    "ROLES",
    "build_hf_model",
    "load_checkpoint_state_dict",
    "main",
    "merge_checkpoint",
    "resolve_base_model_path",
]

ROLES = ("actor", "critic")
MODEL_OPTIM_DIR = "model_optim"
MODEL_PREFIX = "model."
HF_SUBDIR = "huggingface"


def _checkpoint_dir(local_dir: str | os.PathLike, role: str) -> Path:
    """The role checkpoint directory: ``local_dir`` itself, or ``local_dir/<role>`` for a step directory.

    Raises:
        FileNotFoundError: no ``model_optim/`` there, or the ``COMPLETE`` marker is missing.
    """
    path = Path(local_dir)
    if not (path / MODEL_OPTIM_DIR).is_dir() and (path / role / MODEL_OPTIM_DIR).is_dir():
        path = path / role
    if not (path / MODEL_OPTIM_DIR).is_dir():
        raise FileNotFoundError(
            f"--local_dir {local_dir}: no {MODEL_OPTIM_DIR}/ directory (expected a role checkpoint such as "
            f"global_step_N/{role}, written by rlflow.parallel.checkpoint.save_checkpoint)"
        )
    if not (path / "COMPLETE").is_file():
        raise FileNotFoundError(f"--local_dir {path}: no COMPLETE marker; the save did not finish")
    return path


def _read_meta(ckpt_dir: Path) -> dict[str, Any]:
    meta_file = ckpt_dir / "meta.json"
    return json.loads(meta_file.read_text()) if meta_file.is_file() else {}


def resolve_base_model_path(ckpt_dir: str | os.PathLike, model_path: str | None = None) -> str:
    """The local HF directory whose config (and tokenizer) describe the checkpoint's model.

    Args:
        ckpt_dir: role checkpoint directory (holds ``model_optim/`` and ``meta.json``).
        model_path: explicit base model (HF directory or ``rlflow://tiny[...]``); wins when given.

    Returns:
        A local directory.

    Raises:
        ValueError: nothing names the base model.
    """
    ckpt = Path(ckpt_dir)
    if model_path:
        return resolve_model_path(model_path)
    meta = _read_meta(ckpt)
    if meta.get("model_path"):
        return resolve_model_path(str(meta["model_path"]))
    if (ckpt / HF_SUBDIR / "config.json").is_file():
        return str(ckpt / HF_SUBDIR)
    raise ValueError(
        f"{ckpt}: the checkpoint does not record its base model (no 'model_path' in meta.json, no "
        f"{HF_SUBDIR}/config.json); pass --model_path with the run's actor_rollout_ref.model.path (actor) or "
        f"critic.model.path (critic), or {TINY_MODEL_SENTINEL} when it was null"
    )


def load_checkpoint_state_dict(ckpt_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Full (unsharded) model tensors of a `save_checkpoint` directory, read in this process.

    No process group is needed, whatever the world size that saved it: the tensors are allocated from
    the DCP metadata and DCP copies every rank's shards into them. Optimizer entries are not read.

    Args:
        ckpt_dir: role checkpoint directory.

    Returns:
        ``{parameter name: tensor}`` on CPU, in the saved dtypes, names without the ``model.`` prefix.
    """
    dcp_dir = Path(ckpt_dir) / MODEL_OPTIM_DIR
    metadata = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            model[key[len(MODEL_PREFIX) :]] = torch.empty(item.size, dtype=item.properties.dtype)
    if not model:
        raise ValueError(f"{dcp_dir}: no '{MODEL_PREFIX}*' tensors in the checkpoint metadata")
    state = {"model": model}
    with warnings.catch_warnings():  # DCP warns that it loads in one process: that is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(dcp_dir), no_dist=True)
    return state["model"]


def _hf_config(base_path: str, role: str, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(base_path, trust_remote_code=trust_remote_code)
    if role == "critic":
        config.num_labels = 1
        config.classifier_dropout = 0.0
    return config


def build_hf_model(
    config: Any, role: str, state_dict: dict[str, torch.Tensor], trust_remote_code: bool = False
) -> torch.nn.Module:
    """Build the role's HF model on ``meta`` and assign ``state_dict`` to it (no extra copy).

    Args:
        config: HF config (for the critic: one label).
        role: ``"actor"`` (causal LM) or ``"critic"`` (token-classification value model).
        state_dict: full tensors keyed by parameter name.
        trust_remote_code: allow custom modelling code of the base model.

    Raises:
        ValueError: the tensors do not fit the architecture (names the missing/unexpected keys or shapes).
    """
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto_cls = AutoModelForTokenClassification if role == "critic" else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto_cls.from_config(config, trust_remote_code=trust_remote_code)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = [k for k in expected if k in state_dict and expected[k].shape != state_dict[k].shape]
    if missing or unexpected or wrong:
        shapes = {k: (tuple(state_dict[k].shape), tuple(expected[k].shape)) for k in wrong}
        raise ValueError(
            f"the {role} checkpoint does not fit {type(model).__name__} built from the base model config: "
            f"missing {missing[:8]}, unexpected {unexpected[:8]}, shape (checkpoint, model) {shapes}; "
            "check --model_path and --role"
        )
    model.load_state_dict(state_dict, strict=True, assign=True)
    return model


class _ConfigOnly(torch.nn.Module):
    """A model stand-in holding only a config (`rlflow.models.mtp.split_for_export` reads its MTP layout)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config


def _copy_generation_config(model: torch.nn.Module, base_path: str) -> None:
    from transformers import GenerationConfig

    if (Path(base_path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(base_path)


def merge_checkpoint(
    local_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    role: str | None = None,
    model_path: str | None = None,
    dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False,
) -> str:
    """Write a HF model directory (config, safetensors, tokenizer) from a role checkpoint.

    Args:
        local_dir: ``global_step_N/<role>`` (or ``global_step_N`` with ``role`` given).
        target_dir: output directory; replaced when it exists (written to ``<target_dir>.tmp`` first).
        role: ``"actor"`` or ``"critic"``; None = the name of ``local_dir`` when it is one of them,
            else ``"actor"``.
        model_path: base model directory (see `resolve_base_model_path`).
        dtype: cast floating-point weights (``"bf16"``, ``torch.float16``, ...); None keeps the saved dtype.
        trust_remote_code: allow custom model / tokenizer code of the base model.

    Returns:
        ``target_dir`` as a string.
    """
    if role is None:
        role = Path(local_dir).name if Path(local_dir).name in ROLES else "actor"
    if role not in ROLES:
        raise ValueError(f"--role {role!r} must be one of {list(ROLES)}")
    ckpt = _checkpoint_dir(local_dir, role)
    base = resolve_base_model_path(ckpt, model_path)
    state = merge_lora_state_dict(load_checkpoint_state_dict(ckpt))  # LoRA adapters folded in
    if dtype is not None:
        cast = resolve_dtype(dtype)
        state = {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}
    config = _hf_config(base, role, trust_remote_code)
    state, write_mtp = split_for_export(_ConfigOnly(config), state)  # MTP layers: a file of their own
    model = build_hf_model(config, role, state, trust_remote_code)
    if role == "actor":
        _copy_generation_config(model, base)
    tokenizer = load_tokenizer(base, trust_remote_code=trust_remote_code)
    target = Path(target_dir)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    if write_mtp is not None:
        write_mtp(str(staging))
    tokenizer.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return str(target)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlflow.model_merger",
        description="Turn an rlflow actor/critic checkpoint into a Hugging Face model directory.",
    )
    parser.add_argument("--local_dir", required=True, help="checkpoint dir: .../global_step_N/actor")
    parser.add_argument("--target_dir", required=True, help="output HF directory (replaced if it exists)")
    parser.add_argument("--role", choices=ROLES, default=None, help="default: the name of --local_dir")
    parser.add_argument(
        "--model_path",
        default=None,
        help=f"base HF model dir of the run ({TINY_MODEL_SENTINEL} for the embedded tiny model)",
    )
    parser.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16; default: the saved dtype")
    parser.add_argument("--trust_remote_code", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 with a message for a bad checkpoint)."""
    args = _parser().parse_args(argv)
    try:
        out = merge_checkpoint(
            args.local_dir, args.target_dir, args.role, args.model_path, args.dtype, args.trust_remote_code
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"model_merger: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
