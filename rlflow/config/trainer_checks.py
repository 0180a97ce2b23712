"""Checks of ``trainer`` and ``ray_init`` (part of `rlflow.config.validate.validate_config`; the schema:
`rlflow.config.trainer_schema`)."""

from __future__ import annotations

from omegaconf import DictConfig

from rlflow.config.checks import at_least, choice, every_or_never, positive, value_at

__all__ = ["DEVICES", "LOGGERS", "RESUME_MODES", "check_trainer"]

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")


def check_trainer(cfg: DictConfig) -> None:
    """``trainer`` and ``ray_init``: run length, resources, checkpoints, loggers, verl's legacy values."""
    at_least(cfg, "trainer.nnodes", 1)
    at_least(cfg, "trainer.n_gpus_per_node", 1)
    at_least(cfg, "trainer.total_epochs", 1)
    at_least(cfg, "trainer.total_training_steps", 1, allow_none=True)
    every_or_never(cfg, "trainer.save_freq")
    every_or_never(cfg, "trainer.test_freq")
    at_least(cfg, "trainer.critic_warmup", 0)
    at_least(cfg, "trainer.max_actor_ckpt_to_keep", 1, allow_none=True)
    at_least(cfg, "trainer.max_critic_ckpt_to_keep", 1, allow_none=True)
    positive(cfg, "trainer.cpus_per_worker")
    positive(cfg, "trainer.placement_timeout_s")
    positive(cfg, "trainer.worker_start_timeout_s")
    choice(cfg, "trainer.device", DEVICES)
    choice(cfg, "trainer.resume_mode", RESUME_MODES)
    hdfs = value_at(cfg, "trainer.default_hdfs_dir")
    if hdfs is not None:
        raise ValueError(
            f"trainer.default_hdfs_dir={hdfs!r} (older verl's HDFS copy of checkpoints): rlflow writes them to "
            "trainer.default_local_dir only; point that at the shared file system, or copy from it"
        )
    at_least(cfg, "trainer.log_val_generations", 0)
    legacy = value_at(cfg, "trainer.use_legacy_worker_impl")
    if str(legacy).lower() not in ("auto", "disable", "false"):  # false: the boolean of older verl scripts
        raise ValueError(
            f"trainer.use_legacy_worker_impl={legacy!r}: rlflow has one worker implementation "
            "(rlflow/workers, one file per role); 'auto', 'disable' (or false) run it, and there is no legacy "
            "one to enable"
        )
    loggers = value_at(cfg, "trainer.logger")
    loggers = [loggers] if isinstance(loggers, str) else loggers
    for i, name in enumerate(loggers):
        if name not in LOGGERS:
            raise ValueError(f"trainer.logger[{i}]={name!r} is not one of {list(LOGGERS)}")
    at_least(cfg, "ray_init.num_cpus", 1, allow_none=True)
    at_least(cfg, "ray_init.object_store_memory", 1, allow_none=True)
