"""LoRA adapters in PEFT's on-disk format: read one to start from (verl's
``actor_rollout_ref.model.lora_adapter_path``), write one beside each actor checkpoint (``lora_adapter/``).

A PEFT LoRA adapter is a directory with

* ``adapter_config.json``: ``peft_type: "LORA"``, ``r``, ``lora_alpha``, ``target_modules`` (a list of
  module-name suffixes or one regular expression), ``use_rslora`` (scale ``alpha / sqrt(r)`` instead of
  ``alpha / r``) and options rlflow's adapters do not have (DoRA, trained biases, per-module ranks, extra
  full modules), which are refused naming the file and the field;
* ``adapter_model.safetensors`` (or the older ``adapter_model.bin``): for each adapted module ``X`` of
  the base model, ``base_model.model.X.lora_A.weight`` (r, in) and ``base_model.model.X.lora_B.weight``
  (out, r).

`rlflow.models.lora` keeps the same two matrices under ``X.lora_A`` / ``X.lora_B``, so reading and writing
is a renaming; nothing here imports ``peft``. ``PeftModel.from_pretrained(base, dir)`` loads what
`save_peft_adapter` writes, and `apply_peft_adapter` reproduces what PEFT computes from an adapter
(tests/models/test_peft_adapter.py checks both against PEFT itself).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlflow.models.lora import LoRALinear, LoRASpec, module_selection

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_DIR",
    "adapter_spec",
    "apply_peft_adapter",
    "check_peft_adapter",
    "load_peft_weights",
    "lora_spec",
    "save_peft_adapter",
]

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_DIR = "lora_adapter"  # beside each actor checkpoint, as verl writes it
_SAFETENSORS = "adapter_model.safetensors"
_BIN = "adapter_model.bin"
_PREFIX = "base_model.model."
_KEY = "actor_rollout_ref.model.lora_adapter_path"
# ``<module>.lora_A.weight`` (``.lora_A.default.weight`` when saved with its adapter name)
_MATRIX_KEY = re.compile(r"(?P<module>.+)\.(?P<leaf>lora_A|lora_B)(?:\.default)?\.weight")

# adapter_config.json fields whose value must be one rlflow's adapters compute, with what else means
_MUST_BE: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_dora": ((False, None), "DoRA's magnitude vectors"),
    "bias": (("none", None), "trained biases"),
    "fan_in_fan_out": ((False, None), "transposed (Conv1D) weights"),
    "modules_to_save": ((None, []), "full copies of extra modules"),
    "rank_pattern": (({}, None), "per-module ranks"),
    "alpha_pattern": (({}, None), "per-module alphas"),
    "layers_to_transform": ((None, []), "a subset of layers"),
    "lora_bias": ((False, None), "a bias on lora_B"),
    "layer_replication": ((None, []), "replicated layers"),
    "target_parameters": ((None, []), "adapted parameters of non-linear modules"),
    "trainable_token_indices": ((None, {}, []), "trainable token embeddings"),
    "use_qalora": ((False, None), "QA-LoRA's pooled inputs"),
    "alora_invocation_tokens": ((None, []), "activated LoRA"),
}


def _config_path(path: str | os.PathLike) -> Path:
    return Path(path) / ADAPTER_CONFIG


def _weights_path(path: str | os.PathLike) -> Path:
    for name in (_SAFETENSORS, _BIN):
        if (Path(path) / name).is_file():
            return Path(path) / name
    raise ValueError(f"{_KEY}={str(path)!r}: no {_SAFETENSORS} (or {_BIN}) in the adapter directory")


def _read_config(path: str | os.PathLike) -> dict[str, Any]:
    file = _config_path(path)
    if not Path(path).is_dir() or not file.is_file():
        raise ValueError(
            f"{_KEY}={str(path)!r}: not a PEFT adapter directory (no {ADAPTER_CONFIG}); give the directory "
            "that peft's save_pretrained wrote (or an rlflow checkpoint's actor/lora_adapter)"
        )
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def adapter_spec(path: str | os.PathLike) -> LoRASpec:
    """The `LoRASpec` an adapter directory describes (rank, alpha, targets, rsLoRA scaling).

    Raises:
        ValueError: naming the file and the field, when the directory is not a PEFT LoRA adapter or uses
            an option rlflow's adapters do not compute (DoRA, trained biases, per-module ranks, ...).
    """
    config = _read_config(path)
    file = _config_path(path)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{file}: peft_type={config.get('peft_type')!r}; only LoRA adapters (LORA) load")
    for field, (allowed, meaning) in _MUST_BE.items():
        if field in config and config[field] not in allowed:
            raise ValueError(
                f"{file}: {field}={config[field]!r} ({meaning}) is not supported by rlflow's LoRA; "
                f"an adapter with {field}={allowed[0]!r} loads (or merge this one into its base model "
                "with peft's merge_and_unload and set actor_rollout_ref.model.path to the result)"
            )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ValueError(f"{file}: r={rank!r} must be a positive integer")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0:
        raise ValueError(f"{file}: lora_alpha={alpha!r} must be a positive number")
    targets = config.get("target_modules")
    if isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets):
        targets = tuple(sorted(targets))
    elif not (isinstance(targets, str) and targets):
        raise ValueError(f"{file}: target_modules={targets!r} must be a list of module names or a regex")
    excluded = config.get("exclude_modules")
    if isinstance(excluded, list):
        excluded = tuple(sorted(excluded)) if excluded else None
    elif excluded is not None and not isinstance(excluded, str):
        raise ValueError(f"{file}: exclude_modules={excluded!r} must be a list, a regex or null")
    if float(config.get("lora_dropout") or 0.0) > 0.0:
        logger.warning(
            "%s: lora_dropout=%s is not applied: rlflow's adapters train without dropout (as verl's own)",
            file,
            config["lora_dropout"],
        )
    return LoRASpec(rank, float(alpha), targets, excluded, use_rslora=bool(config.get("use_rslora", False)))


def load_peft_weights(path: str | os.PathLike) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module name: (lora_A (r, in), lora_B (out, r))}`` from an adapter directory (CPU tensors).

    Raises:
        ValueError: naming the weights file, when a key is not a LoRA matrix of a linear layer or a module
            lacks one of its two matrices.
    """
    file = _weights_path(path)
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(file))
    else:
        tensors = torch.load(file, map_location="cpu", weights_only=True)
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _MATRIX_KEY.fullmatch(key.removeprefix(_PREFIX))
        if match is None:
            raise ValueError(
                f"{file}: {key!r} is not a LoRA matrix of a linear layer (lora_A / lora_B); embedding "
                "adapters and extra saved modules are not supported"
            )
        found.setdefault(match["module"], {})[match["leaf"]] = tensor
    incomplete = sorted(n for n, pair in found.items() if len(pair) != 2)
    if incomplete:
        raise ValueError(f"{file}: modules {incomplete[:3]} lack lora_A or lora_B")
    return {name: (pair["lora_A"], pair["lora_B"]) for name, pair in found.items()}


def check_peft_adapter(path: str | os.PathLike) -> LoRASpec:
    """`adapter_spec` plus the weights: present, complete and of the rank the config says (no model
    needed: the config validation runs this before Ray starts)."""
    spec = adapter_spec(path)
    weights = load_peft_weights(path)
    if not weights:
        raise ValueError(f"{_weights_path(path)}: holds no LoRA matrices")
    for name, (lora_a, lora_b) in weights.items():
        if (
            lora_a.dim() != 2
            or lora_b.dim() != 2
            or lora_a.shape[0] != spec.rank
            or lora_b.shape[1] != spec.rank
        ):
            raise ValueError(
                f"{_weights_path(path)}: {name} has lora_A {tuple(lora_a.shape)} and lora_B "
                f"{tuple(lora_b.shape)}; {_config_path(path)} says r={spec.rank}"
            )
    return spec


def apply_peft_adapter(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy an adapter's matrices into the `LoRALinear` modules of ``model`` (made by `inject_lora` with
    `adapter_spec`'s spec); the module sets must be equal and the shapes must fit.

    Raises:
        ValueError: naming the weights file, for a module the model lacks or one it has the file lacks.
    """
    weights = load_peft_weights(path)
    modules = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    file = _weights_path(path)
    if set(weights) != set(modules):
        extra, missing = sorted(set(weights) - set(modules)), sorted(set(modules) - set(weights))
        raise ValueError(
            f"{file}: the adapter's modules do not match the model's adapted layers (in the file only: "
            f"{extra[:3]}; in the model only: {missing[:3]}); was it trained on this base model "
            "(actor_rollout_ref.model.path)?"
        )
    with torch.no_grad():
        for name, module in modules.items():
            lora_a, lora_b = weights[name]
            if lora_a.shape != module.lora_A.shape or lora_b.shape != module.lora_B.shape:
                raise ValueError(
                    f"{file}: {name} has lora_A {tuple(lora_a.shape)} / lora_B {tuple(lora_b.shape)}, the "
                    f"model's layer needs {tuple(module.lora_A.shape)} / {tuple(module.lora_B.shape)}"
                )
            module.lora_A.copy_(lora_a)
            module.lora_B.copy_(lora_b)


def save_peft_adapter(
    out_dir: str | os.PathLike,
    adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    spec: LoRASpec,
    base_model_name_or_path: str | None = None,
    saved_in_full: Mapping[str, torch.Tensor] | None = None,
    task_type: str = "CAUSAL_LM",
) -> str:
    """Write ``adapters`` (``{module name: (lora_A, lora_B)}``, names of the HF model) as a PEFT adapter
    directory: ``adapter_config.json`` and ``adapter_model.safetensors``; returns ``out_dir``.

    ``target_modules`` lists the adapted modules by full name, so PEFT adapts exactly these (whatever
    ``exclude_modules`` took out at training time). ``saved_in_full`` (``{parameter name: tensor}``, e.g.
    a value model's ``score.weight``) are the parameters that trained in full beside the adapters: PEFT's
    ``modules_to_save``, stored under ``base_model.model.<name>``. ``task_type``: PEFT's (``CAUSAL_LM``, or
    ``TOKEN_CLS`` for a value model).
    """
    from safetensors.torch import save_file

    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, (lora_a, lora_b) in sorted(adapters.items()):
        tensors[f"{_PREFIX}{name}.lora_A.weight"] = lora_a.detach().cpu().contiguous()
        tensors[f"{_PREFIX}{name}.lora_B.weight"] = lora_b.detach().cpu().contiguous()
    full = dict(saved_in_full or {})
    for name, tensor in sorted(full.items()):
        tensors[f"{_PREFIX}{name}"] = tensor.detach().cpu().contiguous()
    modules_to_save = sorted({name.rpartition(".")[0] for name in full}) or None
    config = {
        "peft_type": "LORA",
        "task_type": task_type,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "use_rslora": spec.use_rslora,
        "target_modules": sorted(adapters),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": False,
        "modules_to_save": modules_to_save,
        "init_lora_weights": True,
        "inference_mode": True,
        "base_model_name_or_path": base_model_name_or_path,
    }
    save_file(tensors, str(target / _SAFETENSORS), metadata={"format": "pt"})
    (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return str(target)


def lora_spec(model: Any, key_prefix: str = "actor_rollout_ref.model") -> LoRASpec | None:
    """A role's adapters from its ``model`` section (``actor_rollout_ref.model`` or ``critic.model``): those
    of the PEFT adapter at ``lora_adapter_path`` when set (the actor's key; its rank, alpha and targets,
    verl's meaning), else ``lora_rank`` / ``lora_alpha`` / ``target_modules`` / ``exclude_modules`` (the
    actor's only); None when ``lora_rank`` is 0 and no adapter is given."""
    # every LoRA key is read whatever the rank: accepted keys are read (tests/config/test_config_reads.py)
    rank, alpha = int(model.lora_rank), float(model.lora_alpha)
    targets = model.target_modules
    excluded = getattr(model, "exclude_modules", None)
    adapter_path = getattr(model, "lora_adapter_path", None)
    if adapter_path is not None:
        spec = adapter_spec(os.path.expanduser(str(adapter_path)))
        if rank not in (0, spec.rank) or alpha != spec.alpha:
            logger.warning(
                "%s.lora_adapter_path=%s: the adapter's r=%d, lora_alpha=%s and target_modules are used "
                "(lora_rank=%d, lora_alpha=%s are not)",
                key_prefix,
                adapter_path,
                spec.rank,
                spec.alpha,
                rank,
                alpha,
            )
        return spec
    if rank == 0:
        return None
    return LoRASpec(
        rank,
        alpha,
        module_selection(targets),
        None if excluded is None else module_selection(excluded),
        key_prefix=key_prefix,
    )
