"""Validation of the SFT trainer config: ``ValueError`` naming the key path, before any process starts.

Besides ranges and names it refuses, with what to do instead, the verl ``fsdp_sft_trainer`` keys rlflow
accepts in the schema but does not implement (multi-turn data, custom dataset classes, chat templates
given in the config, LoRA, Liger kernels, HDFS copies, per-rank loss normalisation).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlflow.config.checks import at_least, choice, every_or_never, flag, in_range, positive, value_at
from rlflow.config.trainer_checks import DEVICES, RESUME_MODES, check_cpu_linear_kernel
from rlflow.data.sft_dataset import SFT_TRUNCATION_MODES
from rlflow.data.tasks import TASKS
from rlflow.utils.checkpoint_files import check_mirror_destination
from rlflow.utils.dtypes import DTYPES

__all__ = ["sft_world_size", "validate_sft_config"]

STRATEGIES = ("fsdp", "fsdp2")
SCHEDULERS = ("constant", "cosine")

_REFUSED = (
    # key, the value that means "off", what to do instead
    ("data.micro_batch_size", None, "it is verl's deprecated spelling: set data.micro_batch_size_per_gpu"),
    ("data.multiturn.enable", False, "multi-turn SFT data is not supported: flatten to prompt/response"),
    ("data.chat_template", None, "set the chat template in the tokenizer (tokenizer_config.json)"),
    ("data.custom_cls.path", None, "custom dataset classes are not supported: write prompt/response columns"),
    ("data.balance_dp_token", True, "the loss is always divided by the response tokens of all ranks"),
    ("model.lora_rank", 0, "LoRA is not supported: fine-tune all parameters (lora_rank=0)"),
    ("model.use_liger", False, "Liger kernels are not supported"),
    ("model.fsdp_config.wrap_policy.min_num_params", 0, "rlflow shards every decoder layer (keep 0)"),
    (
        "model.fsdp_config.model_dtype",
        "fp32",
        "master weights stay fp32; set model.fsdp_config.mixed_precision.param_dtype=bf16 to compute in bf16",
    ),
)


def sft_world_size(cfg: Any) -> int:
    """``trainer.nnodes × trainer.n_gpus_per_node``."""
    return int(value_at(cfg, "trainer.nnodes")) * int(value_at(cfg, "trainer.n_gpus_per_node"))


def _check_refused(cfg: DictConfig) -> None:
    for key, off, instead in _REFUSED:
        value = value_at(cfg, key)
        if value != off:
            raise ValueError(f"{key}={value!r} is not supported by rlflow's SFT trainer: {instead}")


def _check_batches(cfg: DictConfig) -> None:
    world = sft_world_size(cfg)
    sp = at_least(cfg, "ulysses_sequence_parallel_size", 1)
    if world % sp:
        raise ValueError(
            f"ulysses_sequence_parallel_size={sp} must divide the world size {world} "
            "(trainer.nnodes × trainer.n_gpus_per_node)"
        )
    if sp > 1 and not value_at(cfg, "use_remove_padding"):
        raise ValueError(f"ulysses_sequence_parallel_size={sp} > 1 needs use_remove_padding=true")
    dp = world // sp
    batch = at_least(cfg, "data.train_batch_size", 1)
    if batch % dp:
        raise ValueError(
            f"data.train_batch_size={batch} must be divisible by the data-parallel size {dp} "
            f"(world {world} / ulysses_sequence_parallel_size {sp})"
        )
    at_least(cfg, "data.micro_batch_size_per_gpu", 1)
    if flag(cfg, "data.use_dynamic_bsz"):
        budget = at_least(cfg, "data.max_token_len_per_gpu", 1)
        longest = value_at(cfg, "data.max_length")
        if budget * sp < longest:
            raise ValueError(
                f"data.max_token_len_per_gpu={budget} (× ulysses size {sp}) must be >= data.max_length="
                f"{longest}, the longest sample"
            )


def _check_files(cfg: DictConfig) -> None:
    import os

    for key in ("data.train_files", "data.val_files"):
        value = value_at(cfg, key)
        if value is None:
            continue
        files = [value] if isinstance(value, str) else list(value)
        for f in files:
            if not os.path.isfile(os.path.expanduser(str(f))):
                raise ValueError(f"{key}: no such file {f!r}")


def validate_sft_config(cfg: DictConfig | Any) -> None:
    """Check the SFT config; raise ``ValueError`` naming the key path of the first problem."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg)
    _check_refused(cfg)
    if value_at(cfg, "data.train_files") is None or value_at(cfg, "data.val_files") is None:
        choice(cfg, "data.task", sorted(TASKS))
    choice(cfg, "data.truncation", SFT_TRUNCATION_MODES)
    at_least(cfg, "data.max_length", 2)
    choice(cfg, "model.strategy", STRATEGIES)
    flag(cfg, "model.tiled_mlp.enabled")
    at_least(cfg, "model.tiled_mlp.num_shards", 1)
    for part in ("param_dtype", "reduce_dtype", "buffer_dtype"):
        choice(cfg, f"model.fsdp_config.mixed_precision.{part}", sorted(DTYPES))
    positive(cfg, "optim.lr")
    in_range(cfg, "optim.warmup_steps_ratio", 0.0, 1.0, high_open=True)
    in_range(cfg, "optim.min_lr_ratio", 0.0, 1.0)
    choice(cfg, "optim.lr_scheduler", SCHEDULERS)
    at_least(cfg, "optim.clip_grad", 0.0, integer=False)
    at_least(cfg, "trainer.nnodes", 1)
    at_least(cfg, "trainer.n_gpus_per_node", 1)
    at_least(cfg, "trainer.total_epochs", 1)
    at_least(cfg, "trainer.total_training_steps", 1, allow_none=True)
    at_least(cfg, "trainer.max_ckpt_to_keep", 1, allow_none=True)
    every_or_never(cfg, "trainer.save_freq")
    every_or_never(cfg, "trainer.test_freq")
    choice(cfg, "trainer.device", DEVICES)
    check_cpu_linear_kernel(cfg)
    check_mirror_destination(
        value_at(cfg, "trainer.default_hdfs_dir"), str(value_at(cfg, "trainer.default_local_dir"))
    )
    mode = choice(cfg, "trainer.resume_mode", RESUME_MODES)
    new, old = value_at(cfg, "trainer.resume_from_path"), value_at(cfg, "trainer.resume_path")
    if new is not None and old is not None and new != old:
        raise ValueError(
            f"trainer.resume_path={old!r} and trainer.resume_from_path={new!r} disagree (resume_path is "
            "verl's older spelling): set one"
        )
    if mode == "resume_path" and (new or old) is None:
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
    _check_batches(cfg)
    _check_files(cfg)
