"""Checks of ``trainer`` and ``ray_init`` (part of `rlflow.config.validate.validate_config`; the schema:
`rlflow.config.trainer_schema`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig

from rlflow.config.checks import at_least, choice, every_or_never, flag, optional_flag, positive, value_at
from rlflow.config.global_sizes import role_world_size
from rlflow.models.cpu_linear import CPU_LINEAR_KERNELS, check_onednn_usable
from rlflow.utils.checkpoint_files import check_mirror_destination

__all__ = [
    "DEVICES",
    "LOGGERS",
    "PROFILED_SECTIONS",
    "RESUME_MODES",
    "check_cpu_linear_kernel",
    "check_profiler",
    "check_trainer",
    "forward_ahead_blocker",
    "runtime_env_vars",
]

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
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
    positive(cfg, "trainer.cpus_per_worker", allow_none=True)
    positive(cfg, "trainer.placement_timeout_s")
    positive(cfg, "trainer.worker_start_timeout_s")
    choice(cfg, "trainer.device", DEVICES)
    overlap = optional_flag(cfg, "trainer.overlap_updates", "on for CPU runs where it helps")
    if overlap and value_at(cfg, "trainer.device") == "cuda":
        raise ValueError(
            "trainer.overlap_updates=true runs the critic's and the actor's updates at the same time on "
            "shared CPU cores; with trainer.device=cuda the colocated roles of a bundle share one GPU. "
            "Set trainer.overlap_updates to null (on only where it helps) or false"
        )
    if optional_flag(cfg, "trainer.forward_ahead", "on where it applies and the updates overlap"):
        blocker = forward_ahead_blocker(cfg)
        if blocker is not None:
            raise ValueError(
                f"trainer.forward_ahead=true, but {blocker}. Set trainer.forward_ahead to null (on where it "
                "applies) or false"
            )
    check_cpu_linear_kernel(cfg)
    runtime_env_vars(value_at(cfg, "ray_init.runtime_env"))
    choice(cfg, "trainer.resume_mode", RESUME_MODES)
    check_mirror_destination(
        value_at(cfg, "trainer.default_hdfs_dir"), str(value_at(cfg, "trainer.default_local_dir"))
    )
    at_least(cfg, "trainer.log_val_generations", 0)
    if flag(cfg, "trainer.balance_keep_minibatch") and not flag(cfg, "trainer.balance_batch"):
        raise ValueError(
            "trainer.balance_keep_minibatch=true orders the rows within each mini-batch when the batch is "
            "balanced, but trainer.balance_batch=false: set balance_batch=true or drop balance_keep_minibatch"
        )
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
    flag(cfg, "trainer.log_system_metrics")
    check_profiler(cfg)
    at_least(cfg, "ray_init.num_cpus", 1, allow_none=True)
    at_least(cfg, "ray_init.object_store_memory", 1, allow_none=True)


def forward_ahead_blocker(cfg: Any) -> str | None:
    """What keeps ``trainer.forward_ahead`` from applying to the run (`rlflow.engine.forward_ahead`), naming
    the key, or None when it applies.

    Args:
        cfg: the composed config (``DictConfig``) or the typed `PPOTrainerConfig`.
    """
    from rlflow.algos.cov_losses import COV_LOSS_MODES
    from rlflow.config.validate import need_critic

    arr, critic, algo = cfg.actor_rollout_ref, cfg.critic, cfg.algorithm
    batch = int(cfg.data.train_batch_size)
    if not need_critic(cfg):
        return f"algorithm.adv_estimator={algo.adv_estimator} trains no critic"
    for role, section in (("actor_rollout_ref.actor", arr.actor), ("critic", critic)):
        if int(section.ppo_epochs) != 1 or int(section.ppo_mini_batch_size) != batch:
            return (
                f"{role}'s update is not a single pass (ppo_epochs={section.ppo_epochs}, "
                f"ppo_mini_batch_size={section.ppo_mini_batch_size} of data.train_batch_size={batch})"
            )
    for key, on in (
        ("actor_rollout_ref.model.enable_activation_offload", arr.model.enable_activation_offload),
        ("critic.model.enable_activation_offload", critic.model.enable_activation_offload),
        ("actor_rollout_ref.model.mtp.enable_train", arr.model.mtp.enable and arr.model.mtp.enable_train),
        ("actor_rollout_ref.actor.moe_aux_loss_coef", float(arr.actor.moe_aux_loss_coef) != 0),
        ("actor_rollout_ref.actor.moe_z_loss_coef", float(arr.actor.moe_z_loss_coef) != 0),
        ("algorithm.use_pf_ppo", algo.use_pf_ppo),
    ):
        if on:
            return f"{key} is set"
    if str(arr.actor.router_replay.mode) != "disabled":
        return f"actor_rollout_ref.actor.router_replay.mode={arr.actor.router_replay.mode}"
    loss_mode = str(arr.actor.policy_loss.loss_mode)
    if loss_mode in COV_LOSS_MODES and not algo.rollout_correction.use_policy_gradient:
        return (
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} selects tokens from a pass of its own"
        )
    return None


def check_cpu_linear_kernel(cfg: DictConfig) -> None:
    """``trainer.cpu_linear_kernel`` (`rlflow.models.cpu_linear`, the PPO and SFT trainers' key): one of
    `CPU_LINEAR_KERNELS`; ``onednn`` needs the CPU (``trainer.device=cuda`` is refused here, a GPU that
    ``trainer.device=auto`` finds when the run starts) and this torch build's oneDNN (`check_onednn_usable`)."""
    if choice(cfg, "trainer.cpu_linear_kernel", CPU_LINEAR_KERNELS) == "onednn":
        check_onednn_usable("cuda" if value_at(cfg, "trainer.device") == "cuda" else "cpu")


PROFILED_SECTIONS = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "critic",
)
"""Sections with verl's ``profile_ranks`` / ``profile_ranks_all`` / ``profile_discrete``."""


def _int_list(cfg: DictConfig, key: str, minimum: int, below: int | None = None) -> list[int]:
    value = value_at(cfg, key)
    if value is None:
        return []
    items = list(value) if not isinstance(value, int | str) else None
    if items is None or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise ValueError(f"{key}={value!r} must be a list of integers or null")
    for v in items:
        if v < minimum or (below is not None and v >= below):
            bound = f"in [{minimum}, {below})" if below is not None else f">= {minimum}"
            raise ValueError(f"{key}: {v} must be {bound}")
    return items


def check_profiler(cfg: DictConfig) -> None:
    """``trainer.profile_steps`` and each role's profiled ranks (within the role's world size)."""
    steps = _int_list(cfg, "trainer.profile_steps", 1)
    selected = False
    for section in PROFILED_SECTIONS:
        key = f"{section}.profile_ranks"
        ranks = (
            _int_list(cfg, key, 0, role_world_size(cfg, section)) if value_at(cfg, key) is not None else []
        )
        every = flag(cfg, f"{section}.profile_ranks_all")
        flag(cfg, f"{section}.profile_discrete")
        selected = selected or every or bool(ranks)
    if steps and not selected:
        raise ValueError(
            f"trainer.profile_steps={steps} but no role selects a rank to profile: set "
            "<role>.profile_ranks (e.g. actor_rollout_ref.actor.profile_ranks=[0]) or <role>.profile_ranks_all=true"
        )


PER_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RLFLOW_WORKER_GROUP")
"""Variables rlflow sets for each worker process itself."""


def runtime_env_vars(runtime_env: Any) -> dict[str, str]:
    """``ray_init.runtime_env.env_vars`` as strings, checked: a mapping of names to scalar values, none of
    them one rlflow sets per rank (`PER_RANK_VARS`) or per pool (``OMP_NUM_THREADS``)."""
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, Mapping):
        raise ValueError(f"ray_init.runtime_env={runtime_env!r} must be a mapping (Ray's runtime_env)")
    env = runtime_env.get("env_vars") or {}
    if not isinstance(env, Mapping):
        raise ValueError(
            f"ray_init.runtime_env.env_vars={env!r} must be a mapping of variable names to values"
        )
    out = {}
    for name, value in env.items():
        key = f"ray_init.runtime_env.env_vars.{name}"
        if isinstance(value, Mapping | list | tuple | ListConfig | DictConfig):
            raise ValueError(f"{key}={value!r}: an environment variable's value must be a string or a number")
        if name in PER_RANK_VARS:
            raise ValueError(f"{key}: rlflow sets {name} for each worker process itself; drop it")
        if name == "OMP_NUM_THREADS":
            raise ValueError(
                f"{key}: a rank's threads follow its CPUs (trainer.cpus_per_worker, trainer.n_gpus_per_node); "
                "drop it"
            )
        out[str(name)] = "" if value is None else str(value)
    return out
