"""``FSDPSFTTrainer``: supervised fine-tuning with FSDP on every rank of a process group (no Ray).

Every rank runs the same loop (launched by ``torchrun``, Slurm's ``srun`` or `rlflow.trainer.main_sft`):

1. build the model sharded over the world (`rlflow.workers.role_setup.build_role_module`, the PPO
   actor's code: FSDP1/FSDP2, mixed precision, offload, gradient checkpointing, packed attention,
   Ulysses meshes) and AdamW with warm-up + constant/cosine;
2. read the dataset (`rlflow.data.sft_dataset.SFTDataset`) on every rank; a seeded, resumable loader
   gives the same global batch of ``data.train_batch_size`` samples everywhere and each data-parallel
   rank takes its contiguous share (Ulysses peers the same share);
3. each step: `rlflow.engine.sft.SFTEngine.train_step` (token-mean NLL over the whole batch, one
   optimizer step); metrics to ``trainer.logger`` (rank 0), a progress bar;
4. validation every ``trainer.test_freq`` steps and at the end: the token-mean NLL of the whole
   validation set (``val/loss``);
5. checkpoints every ``trainer.save_freq`` steps and at the end, in ``trainer.default_local_dir``:
   ``global_step_<n>/model`` (sharded model, optimizer, scheduler, RNG and loader position: exact resume,
   also on another world size) and ``global_step_<n>/huggingface`` (a full HF model + tokenizer:
   ``actor_rollout_ref.model.path`` of a PPO run), then ``latest_checkpointed_iteration.txt``.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from rlflow.config.schema import FSDPConfig, ModelConfig, OptimConfig
from rlflow.config.sft_schema import SFTConfig
from rlflow.data.sampler import StatefulDataLoader, StatefulSampler
from rlflow.data.sft_dataset import SFTDataset, collate_sft
from rlflow.data.tasks import ensure_task_files
from rlflow.engine.batching import MicroBatchSpec
from rlflow.engine.optim import build_lr_scheduler, build_optimizer
from rlflow.engine.sft import SFTEngine
from rlflow.logging.tracking import ProgressBar, Tracking
from rlflow.models.loader import load_tokenizer
from rlflow.parallel.checkpoint import export_hf, is_checkpoint_complete, load_checkpoint, save_checkpoint
from rlflow.parallel.distributed import current_device, init_distributed
from rlflow.trainer.checkpointing import read_latest_pointer, saved_steps, write_latest_pointer
from rlflow.utils.checkpoint_files import CheckpointMirror
from rlflow.workers.role_setup import RoleLayout, build_role_module, model_path, setup_role_parallel

__all__ = ["HF_DIR", "FSDPSFTTrainer", "latest_sft_checkpoint", "sft_layout"]

logger = logging.getLogger(__name__)

HF_DIR = "huggingface"
_MODEL_DIR = "model"


def latest_sft_checkpoint(root: str | os.PathLike) -> str | None:
    """The ``global_step_<n>`` directory ``latest_checkpointed_iteration.txt`` names, or None."""
    return read_latest_pointer(
        root, lambda path: is_checkpoint_complete(path / _MODEL_DIR), f"complete checkpoint in {_MODEL_DIR}/"
    )


def sft_layout(config: SFTConfig) -> RoleLayout:
    """The SFT model's `RoleLayout` (the PPO roles' sharding path, `build_role_module`)."""
    m, f = config.model, config.model.fsdp_config
    offload = bool(f.cpu_offload or f.offload_params)
    model = ModelConfig(
        path=m.partial_pretrain,
        trust_remote_code=m.trust_remote_code,
        attn_implementation=m.attn_implementation,
        use_remove_padding=config.use_remove_padding,
        enable_gradient_checkpointing=m.enable_gradient_checkpointing,
        tiled_mlp=m.tiled_mlp,
    )
    fsdp = FSDPConfig(
        fsdp_size=f.fsdp_size,
        param_offload=offload,
        optimizer_offload=offload,
        reshard_after_forward=f.reshard_after_forward,
        mixed_precision=f.mixed_precision,
    )
    sp = int(config.ulysses_sequence_parallel_size)
    return RoleLayout(
        "model", model, m.strategy, sp, fsdp, cpu_linear_kernel=config.trainer.cpu_linear_kernel
    )


def _optim(config: SFTConfig) -> OptimConfig:
    o = config.optim
    return OptimConfig(
        lr=o.lr,
        lr_warmup_steps_ratio=o.warmup_steps_ratio,
        warmup_style=o.lr_scheduler,
        min_lr_ratio=o.min_lr_ratio,
        weight_decay=o.weight_decay,
        betas=list(o.betas),
        eps=o.eps,
    )


class FSDPSFTTrainer:
    """The SFT loop on this rank (see the module docstring). Call `fit` on every rank.

    Args:
        config: the typed SFT config (validated: `rlflow.config.sft_validate.validate_sft_config`).
    """

    def __init__(self, config: SFTConfig) -> None:
        init_distributed()
        self.config = config
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(int(config.trainer.seed))
        if config.model.external_lib:
            importlib.import_module(config.model.external_lib)
        self.layout = sft_layout(config)
        self.device = current_device()
        path = model_path(self.layout.model)
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=bool(config.model.trust_remote_code))
        self.parallel = setup_role_parallel(self.world_size, self.layout, hf_config)
        dims = self.parallel.dims
        self.dp_rank, self.dp_size = dims.dp_rank, dims.dp_size
        self.tokenizer = load_tokenizer(path, trust_remote_code=bool(config.model.trust_remote_code))
        self._build_data()
        self.module = build_role_module("causal_lm", self.layout, self.parallel, int(config.trainer.seed))
        optim = _optim(config)
        self.optimizer = build_optimizer(self.module.parameters(), optim)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim, self.total_steps, "optim")
        d = config.data
        micro = MicroBatchSpec(
            use_dynamic_bsz=bool(d.use_dynamic_bsz),
            samples_per_micro_batch=int(d.micro_batch_size_per_gpu),
            max_tokens_per_rank=int(d.max_token_len_per_gpu) * dims.sp_size,
        )
        p = self.parallel
        self.engine = SFTEngine(
            self.module,
            self.optimizer,
            self.lr_scheduler,
            micro=micro,
            grad_clip=float(config.optim.clip_grad),
            use_remove_padding=bool(config.use_remove_padding),
            dp_group=p.dp_group,
            sp_group=p.sp_group,
            sync_group=p.sync_group,
        )
        self.global_step = 0

    # ---- data ------------------------------------------------------------------------------------------

    def _build_data(self) -> None:
        d = self.config.data
        train, val = d.train_files, d.val_files
        if train is None or val is None:
            task_train, task_val = ensure_task_files(str(d.task))
            train, val = train or task_train, val or task_val
        self.train_dataset = SFTDataset(train, self.tokenizer, d)
        self.val_dataset = SFTDataset(val, self.tokenizer, d) if val else None
        batch = int(d.train_batch_size)
        steps_per_epoch = len(self.train_dataset) // batch
        if steps_per_epoch == 0:
            raise ValueError(
                f"data.train_batch_size={batch} is larger than the {len(self.train_dataset)} training samples"
            )
        sampler = StatefulSampler(len(self.train_dataset), shuffle=bool(d.shuffle), seed=int(d.seed))
        self.train_loader = StatefulDataLoader(self.train_dataset, batch, sampler, list, drop_last=True)
        t = self.config.trainer
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = int(t.total_training_steps or int(t.total_epochs) * steps_per_epoch)

    def _my_share(self, items: list[dict[str, Any]]) -> TensorDict:
        """This data-parallel rank's contiguous share of a global batch, collated, on the device."""
        per = len(items) // self.dp_size
        mine = items[self.dp_rank * per : (self.dp_rank + 1) * per]
        batch = collate_sft(mine, int(self.tokenizer.pad_token_id))
        return TensorDict(batch, batch_size=[len(mine)]).to(self.device)

    # ---- loop ------------------------------------------------------------------------------------------

    def validate(self) -> float:
        """Token-mean NLL of the whole validation set (every rank returns it)."""
        items = [self.val_dataset[i] for i in range(len(self.val_dataset))]
        per = -(-len(items) // self.dp_size)  # ranks get equal counts: pads carry an all-zero loss mask
        padded = items + [{**items[0], "pad": True}] * (per * self.dp_size - len(items))
        mine = padded[self.dp_rank * per : (self.dp_rank + 1) * per]
        chunk = int(self.config.data.micro_batch_size_per_gpu)
        nll, tokens = 0.0, 0.0
        for start in range(0, per, chunk):
            part = mine[start : start + chunk]
            batch = collate_sft(part, int(self.tokenizer.pad_token_id))
            batch["response_mask"][[i for i, x in enumerate(part) if x.get("pad")]] = 0
            s, n = self.engine.nll_sums(TensorDict(batch, batch_size=[len(part)]).to(self.device))
            nll, tokens = nll + s, tokens + n
        return nll / max(tokens, 1.0)

    def fit(self) -> dict[str, Any]:
        """Train to ``total_steps`` (resuming per ``trainer.resume_mode``); returns the last metrics and
        the HF directory of the final checkpoint."""
        t = self.config.trainer
        tracker = None
        if self.rank == 0:
            log_dir = t.log_dir or os.path.join("outputs", t.project_name, t.experiment_name)
            tracker = Tracking(
                t.project_name, t.experiment_name, list(t.logger), asdict(self.config), log_dir
            )
        self._resume()
        bar = ProgressBar(self.total_steps, self.global_step, desc="sft", disable=self.rank != 0)
        last: dict[str, float] = {}
        hf_dir = None
        try:
            batches = iter(self.train_loader)
            while self.global_step < self.total_steps:
                try:
                    items = next(batches)
                except StopIteration:
                    batches = iter(self.train_loader)
                    items = next(batches)
                start = time.perf_counter()
                metrics = self.engine.train_step(self._my_share(items))
                self.global_step += 1
                elapsed = time.perf_counter() - start
                metrics["train/epoch"] = float((self.global_step - 1) // self.steps_per_epoch)
                metrics["timing_s/step"] = elapsed
                metrics["perf/throughput"] = metrics["train/tokens"] / elapsed
                end = self.global_step == self.total_steps
                if self.val_dataset is not None and (
                    end or (t.test_freq > 0 and self.global_step % t.test_freq == 0)
                ):
                    metrics["val/loss"] = self.validate()
                if end or (t.save_freq > 0 and self.global_step % t.save_freq == 0):
                    hf_dir = self.save_checkpoint()
                last = metrics
                if tracker is not None:
                    tracker.log(metrics, step=self.global_step)
                bar.update(metrics)
        finally:
            bar.close()
            if tracker is not None:
                tracker.finish()
        if hf_dir is None and self.global_step == self.total_steps:  # resumed from the final checkpoint
            hf_dir = str(Path(str(t.default_local_dir)) / f"global_step_{self.global_step}" / HF_DIR)
        return {"final": last, "global_step": self.global_step, "hf_dir": hf_dir}

    # ---- checkpoints -----------------------------------------------------------------------------------

    def save_checkpoint(self) -> str:
        """Write ``global_step_<n>/{model,huggingface}`` and the pointer file (collective), then copy the
        step to ``trainer.default_hdfs_dir`` when set; returns the HF directory."""
        t = self.config.trainer
        root = Path(str(t.default_local_dir))
        step_dir = root / f"global_step_{self.global_step}"
        extra = {"global_step": self.global_step, "loader": self.train_loader.state_dict()}
        save_checkpoint(step_dir / _MODEL_DIR, self.module, self.optimizer, self.lr_scheduler, extra)
        hf_dir = export_hf(self.module, self.tokenizer, step_dir / HF_DIR)
        if self.rank == 0:
            write_latest_pointer(root, self.global_step)
            self._prune(root)
            logger.info("saved %s", step_dir)
            if t.default_hdfs_dir is not None:
                CheckpointMirror(str(t.default_hdfs_dir)).copy(step_dir, self.global_step)
        dist.barrier()
        return str(hf_dir)

    def _prune(self, root: Path) -> None:
        keep = self.config.trainer.max_ckpt_to_keep
        if not keep:
            return
        steps = saved_steps(root)
        for old in steps[: max(0, len(steps) - int(keep))]:
            shutil.rmtree(root / f"global_step_{old}", ignore_errors=True)

    def _resume(self) -> None:
        t = self.config.trainer
        if t.resume_mode == "disable":
            return
        if t.resume_mode == "resume_path":
            path = t.resume_from_path or t.resume_path
            if not is_checkpoint_complete(Path(path) / _MODEL_DIR):
                raise ValueError(
                    f"trainer.resume_from_path={path}: no complete checkpoint in {path}/{_MODEL_DIR}"
                )
        else:
            path = latest_sft_checkpoint(t.default_local_dir)
            if path is None:
                return
        extra = load_checkpoint(Path(path) / _MODEL_DIR, self.module, self.optimizer, self.lr_scheduler)
        self.global_step = int(extra["global_step"])
        self.train_loader.load_state_dict(extra["loader"])
        if self.rank == 0:
            logger.info("resumed from %s (step %d)", path, self.global_step)
