"""`RoleWorker`: what every model-holding role shares inside its Ray actor.

A role worker receives the whole typed config (`rlflow.config.schema.PPOTrainerConfig`) and the run's
total number of training steps, joins its role's process group, builds its sharded model (and optimizer),
registers its data-parallel rank for mesh dispatch, and offers checkpointing and HF export. The roles
(`rlflow.workers.actor_rollout`, `rlflow.workers.ref`, `rlflow.workers.critic`,
`rlflow.workers.reward_model`) add their data methods.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from rlflow.config.checkpoint_schema import saves_hf_model
from rlflow.config.reads import track_reads, tracking_enabled
from rlflow.config.schema import OptimConfig, PPOTrainerConfig
from rlflow.engine.optim import build_lr_scheduler, build_optimizer
from rlflow.models.loader import load_model_config
from rlflow.models.lora import merge_lora_state_dict
from rlflow.models.mtp import split_for_export
from rlflow.models.peft_adapter import ADAPTER_DIR, save_peft_adapter
from rlflow.parallel.checkpoint import export_hf, load_checkpoint, save_checkpoint
from rlflow.parallel.distributed import current_device
from rlflow.parallel.sharded import (
    clean_param_name,
    iter_full_params,
    load_optimizer_to_device,
    offload_optimizer_to_cpu,
)
from rlflow.protocol import DataProto
from rlflow.single_controller import Dispatch, Worker, register
from rlflow.single_controller.profiling import ProfileSelection
from rlflow.utils.import_utils import import_external_libs
from rlflow.workers.role_setup import (
    RoleLayout,
    build_role_module,
    model_path,
    peak_memory_metrics,
    role_tokenizer,
    setup_role_parallel,
    timed_call,
)

logger = logging.getLogger(__name__)

__all__ = ["RoleWorker"]


def _hf_config(model: Any) -> Any:
    return load_model_config(model_path(model), bool(model.trust_remote_code), dict(model.override_config))


class RoleWorker(Worker):
    """Shared set-up: process group, meshes, dispatch registration, model, optional optimizer.

    Args:
        config: the typed trainer config.
        total_training_steps: optimizer steps of the run (the learning-rate schedule's length).
    """

    mesh_name = ""

    def __init__(self, config: PPOTrainerConfig, total_training_steps: int) -> None:
        super().__init__()
        if tracking_enabled():
            track_reads(config)
        import_external_libs(config.actor_rollout_ref.model.external_lib)  # the user's registrations
        self.config = config
        self.total_training_steps = int(total_training_steps)
        self.module: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None
        self.layout: RoleLayout | None = None
        self.model_kind = ""  # "causal_lm" or "value", set by _build

    def profile_sections(self) -> list[tuple[Any, frozenset[str] | None]]:
        """``(config section with profile_ranks / profile_ranks_all / profile_discrete, the methods it
        covers or None for all)``, matched in order (each role lists its own; none by default)."""
        return []

    def profile_selections(self) -> list[ProfileSelection]:
        return [
            ProfileSelection(
                ranks=tuple(int(r) for r in (section.profile_ranks or ())),
                all_ranks=bool(section.profile_ranks_all),
                discrete=bool(section.profile_discrete),
                methods=methods,
            )
            for section, methods in self.profile_sections()
        ]

    def _build(self, kind: str, layout: RoleLayout, optim: OptimConfig | None) -> None:
        seed = int(self.config.trainer.seed)
        torch.manual_seed(seed)
        self.layout = layout
        self.model_kind = kind
        self.parallel = setup_role_parallel(self.world_size, layout, _hf_config(layout.model))
        self.device = current_device()
        dims = self.parallel.dims
        self.register_dispatch_info(self.mesh_name, dims.dp_rank, dims.is_collect_rank)
        self.module = build_role_module(kind, layout, self.parallel, seed)
        if optim is not None:
            key = f"{layout.key_prefix}.optim"
            # only what trains (all of it, or the LoRA adapters): frozen weights get no optimizer state
            trainable = [p for p in self.module.parameters() if p.requires_grad]
            self.optimizer = build_optimizer(trainable, optim)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, optim, self.total_training_steps, key)
        self._offload_optimizer()
        self._init_roles()

    def _init_roles(self) -> None:
        """Build what runs on the module (engine roles, rollout): the module, optimizer and parallel
        layout exist. Separate from `_build` so a test can place a module on another device."""

    def _groups(self) -> dict[str, Any]:
        p = self.parallel
        return {"dp_group": p.dp_group, "sp_group": p.sp_group, "sync_group": p.sync_group}

    @staticmethod
    def _step(data: DataProto) -> int:
        """The training step the driver states in ``meta_info["global_steps"]`` (required)."""
        if "global_steps" not in data.meta_info:
            raise ValueError("an update call needs meta_info['global_steps'] (the driver sets it per call)")
        return int(data.meta_info["global_steps"])

    def _optimizer_update(
        self, prefix: str, update: Callable[[DataProto, int], dict[str, float]], data: DataProto
    ) -> dict[str, float]:
        """Run ``update(data, step)`` with the optimizer state on the device; record its metrics, the lr,
        the timing and the peak memory; then step the lr scheduler once per training step."""
        metrics: dict[str, float] = {}
        self._load_optimizer()
        with timed_call(f"{prefix}/update", metrics, int(data.batch["attention_mask"].sum())):
            metrics.update(update(data, self._step(data)))
        self._offload_optimizer()
        metrics[f"{prefix}/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics.update(peak_memory_metrics("perf" if prefix == "actor" else f"perf/{prefix}"))
        self.lr_scheduler.step()
        return metrics

    def _offload_optimizer(self) -> None:
        """``fsdp_config.optimizer_offload``: keep the optimizer state on CPU between updates (GPU runs;
        a logged no-op on CPU, where it already is)."""
        if self.optimizer is not None and self.layout.fsdp.optimizer_offload:
            offload_optimizer_to_cpu(self.optimizer)

    def _load_optimizer(self) -> None:
        if self.optimizer is not None and self.layout.fsdp.optimizer_offload:
            load_optimizer_to_device(self.optimizer)

    def checkpoint_section(self) -> Any:
        """The role's ``checkpoint`` section (``save_contents``...), or None (the reference has none)."""
        return None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        """Sharded model, optimizer and scheduler (unless ``checkpoint.save_contents`` leaves them out) and
        RNG, plus ``huggingface/`` (config and tokenizer of the base model) so that ``python -m
        rlflow.model_merger`` needs nothing else; with ``hf_model`` in ``checkpoint.save_contents``,
        ``huggingface/`` is the whole model in HF format (collective)."""
        self._load_optimizer()
        section = self.checkpoint_section()
        contents = set(section.save_contents) if section is not None else {"optimizer", "extra"}
        save_checkpoint(
            path,
            self.module,
            self.optimizer if "optimizer" in contents else None,
            self.lr_scheduler if "extra" in contents else None,
            extra_state={"global_step": global_step},
        )
        self._offload_optimizer()
        model = self.layout.model
        hf_dir = os.path.join(path, "huggingface")
        tokenizer = role_tokenizer(model) if self.rank == 0 else None
        if saves_hf_model(self.checkpoint_section()):
            export_hf(
                self.module, tokenizer, hf_dir, state_fn=merge_lora_state_dict, split_fn=split_for_export
            )
        elif self.rank == 0:
            _hf_config(model).save_pretrained(hf_dir)
            tokenizer.save_pretrained(hf_dir)
        if self.layout.lora is not None:
            self._save_lora_adapter(os.path.join(path, ADAPTER_DIR))

    def _save_lora_adapter(self, out_dir: str) -> None:
        """The adapters in PEFT's format (``lora_adapter/``, what ``PeftModel.from_pretrained`` and
        ``lora_adapter_path`` load); gathered one parameter at a time, only the adapters kept, and the
        parameters that train in full beside them (a value model's head: PEFT's ``modules_to_save`` of a
        ``TOKEN_CLS`` adapter) (collective)."""
        in_full = {
            clean_param_name(n)
            for n, p in self.module.named_parameters()
            if p.requires_grad and n.rpartition(".")[2] not in ("lora_A", "lora_B")
        }
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        saved_in_full: dict[str, torch.Tensor] = {}
        for name, tensor in iter_full_params(self.module):
            prefix, _, leaf = name.rpartition(".")
            if self.rank != 0:
                continue
            if leaf in ("lora_A", "lora_B"):
                pairs.setdefault(prefix, {})[leaf] = tensor.cpu()
            elif name in in_full:
                saved_in_full[name] = tensor.cpu()
        if self.rank == 0:
            adapters = {n: (p["lora_A"], p["lora_B"]) for n, p in pairs.items()}
            save_peft_adapter(
                out_dir,
                adapters,
                self.layout.lora,
                model_path(self.layout.model),
                saved_in_full,
                "TOKEN_CLS" if self.model_kind == "value" else "CAUSAL_LM",
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what ``checkpoint.load_contents`` names: the model always; the optimizer state and the
        ``extra`` state (LR scheduler, RNG) unless left out, which starts them afresh (verl's meaning)."""
        section = self.checkpoint_section()
        contents = set(section.load_contents) if section is not None else {"optimizer", "extra"}
        for name in sorted({"optimizer", "extra"} - contents):
            if self.rank == 0:
                logger.warning("%s: %s not in checkpoint.load_contents, not restored", path, name)
        self._load_optimizer()
        load_checkpoint(
            path,
            self.module,
            self.optimizer if "optimizer" in contents else None,
            self.lr_scheduler if "extra" in contents else None,
            load_rng="extra" in contents,
        )
        self._offload_optimizer()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> None:
        """Write a HF model directory (with the tokenizer) that ``from_pretrained`` loads."""
        model = self.layout.model
        tokenizer = role_tokenizer(model)
        export_hf(self.module, tokenizer, out_dir, state_fn=merge_lora_state_dict, split_fn=split_for_export)
