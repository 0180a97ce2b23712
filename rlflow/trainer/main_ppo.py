"""``python -m rlflow.trainer.main_ppo [overrides]``: PPO (or GRPO, ...) with Hydra overrides.

The config starts from verl's defaults (``config/ppo_trainer.yaml``). ``--config-name demo`` starts from
the embedded CPU demo instead (``config/demo.yaml``): PPO with a critic on the embedded tiny model and the
easy synthetic task, one rank per role with every core, on a local Ray. Library use::

    from rlflow.config import load_config
    from rlflow.trainer.main_ppo import run_ppo

    cfg = load_config(["trainer.total_training_steps=3"], config_name="demo")
    result = run_ppo(cfg)          # {"final": {...}, "history": [...]}
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from rlflow.config import apply_critic_config_file, config_dir, to_typed, validate_config
from rlflow.config.aliases import rewrite_overrides
from rlflow.config.schema import PPOTrainerConfig
from rlflow.config.suggest import check_override_keys, drop_append_on_known_keys

logger = logging.getLogger(__name__)

__all__ = ["build_trainer", "main", "prepare_config", "run_ppo"]


def prepare_config(cfg: DictConfig, build_warm_start: bool = True) -> DictConfig:
    """Apply the critic config file, turn verl's global micro-batch sizes into per-rank ones (and a
    ``data.gen_batch_size`` without dynamic sampling into the step's size, as verl reads it), fill the
    embedded defaults (the warm-started tiny model of ``data.task``; the synthetic task files), validate, and
    check each role's LoRA selection and tiled MLP on its architecture and the resume checkpoint's adapters
    (`rlflow.config.architecture_checks`, `rlflow.trainer.checkpointing.check_resume_adapters`)
    — all before any Ray actor starts. Raises
    ``ValueError`` naming the key path. A warm start is built (once, into the cache) only after the
    config validated: it has the architecture of ``rlflow://tiny``, which stands in for it until then
    (and afterwards too with ``build_warm_start=False``: `rlflow.trainer.check_config`)."""
    from rlflow.config.architecture_checks import check_role_architectures
    from rlflow.config.global_sizes import convert_global_micro_batch_sizes, step_size_from_gen_batch_size
    from rlflow.config.megatron_checks import check_router_losses, check_router_replay
    from rlflow.config.validate import need_critic
    from rlflow.data.tasks import ensure_task_files
    from rlflow.models.loader import load_model_config
    from rlflow.models.tiny import TINY_MODEL_SENTINEL, resolve_model_path
    from rlflow.trainer.checkpointing import check_resume_adapters
    from rlflow.trainer.warm_start import ensure_warm_start, warm_start_task
    from rlflow.utils.import_utils import import_external_libs

    cfg = convert_global_micro_batch_sizes(step_size_from_gen_batch_size(apply_critic_config_file(cfg)))
    import_external_libs(cfg.actor_rollout_ref.model.external_lib)  # registers names validation checks
    model, task = cfg.actor_rollout_ref.model, str(cfg.data.task)
    critic = cfg.critic.model
    actor_warm = warm_start_task(model.path, task)
    model.path = resolve_model_path(TINY_MODEL_SENTINEL if actor_warm else model.path)
    critic_warm = None
    if critic.path is None or str(critic.path).startswith("rlflow://"):
        critic_warm = warm_start_task(critic.path, task)
        critic.path = resolve_model_path(TINY_MODEL_SENTINEL if critic_warm else critic.path)
    if cfg.data.train_files is None or cfg.data.val_files is None:
        train, val = ensure_task_files(task)
        if cfg.data.train_files is None:
            cfg.data.train_files = train
        if cfg.data.val_files is None:
            cfg.data.val_files = val
    hf = load_model_config(model.path, bool(model.trust_remote_code), dict(model.override_config or {}))
    validate_config(
        cfg, num_attention_heads=hf.num_attention_heads, num_key_value_heads=hf.num_key_value_heads
    )
    check_router_losses(cfg, hf)
    check_router_replay(cfg, hf)
    _check_chat_template(model)
    critic_on = need_critic(cfg)
    check_resume_adapters(cfg.trainer, check_role_architectures(cfg, critic=critic_on), critic=critic_on)
    if actor_warm and build_warm_start:
        model.path = ensure_warm_start(actor_warm)
    if critic_warm and build_warm_start:
        critic.path = ensure_warm_start(critic_warm)
    return cfg


def _check_chat_template(model: Any) -> None:
    """``actor_rollout_ref.model.custom_chat_template`` renders a sample conversation (before Ray starts:
    a Jinja error names the key)."""
    from rlflow.models.loader import load_tokenizer

    template = model.custom_chat_template
    if template is None:
        return
    key = "actor_rollout_ref.model.custom_chat_template"
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"{key}={template!r} must be a Jinja chat template (a non-empty string) or null")
    tokenizer = load_tokenizer(
        str(model.tokenizer_path or model.path), bool(model.trust_remote_code), chat_template=template
    )
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "1 + 1 = ?"}], tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:
        raise ValueError(f"{key} does not render a conversation: {type(exc).__name__}: {exc}") from exc


def _files(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def build_data(config: PPOTrainerConfig, tokenizer: Any) -> tuple[Any, Any]:
    """Train and validation dataloaders (the train one is resumable)."""
    from rlflow.data.custom_dataset import build_rl_dataset, load_dataset_class
    from rlflow.data.rl_dataset import create_rl_dataloader

    data = config.data
    dataset_cls = load_dataset_class(data.custom_cls.path, data.custom_cls.name)
    train_limit = ("data.train_max_samples", int(data.train_max_samples))
    train = build_rl_dataset(dataset_cls, _files(data.train_files), tokenizer, data, train_limit)
    val_limit = ("data.val_max_samples", int(data.val_max_samples))
    val = build_rl_dataset(dataset_cls, _files(data.val_files), tokenizer, data, val_limit)
    workers = int(data.dataloader_num_workers)
    train_loader = create_rl_dataloader(
        train,
        int(data.gen_batch_size),
        shuffle=bool(data.shuffle),
        seed=int(data.seed),
        num_workers=workers,
    )
    val_bs = int(data.val_batch_size or len(val))
    val_loader = create_rl_dataloader(
        val,
        val_bs,
        shuffle=bool(data.validation_shuffle),
        seed=int(data.seed),
        drop_last=False,
        num_workers=workers,
    )
    return train_loader, val_loader


def _default_score(config: PPOTrainerConfig) -> Any:
    """The default scorer, with the SandboxFusion service of ``reward_model.sandbox_fusion`` (None: the
    manager's own default)."""
    import functools

    from rlflow.reward.default import default_compute_score
    from rlflow.reward.sandbox_fusion import SandboxSettings

    box = config.reward_model.sandbox_fusion
    url, concurrent, memory = box.url, int(box.max_concurrent), int(box.memory_limit_mb)
    if url is None:
        return None
    return functools.partial(default_compute_score, sandbox=SandboxSettings(str(url), concurrent, memory))


def build_reward_fns(config: PPOTrainerConfig, tokenizer: Any) -> tuple[Any, Any]:
    """Reward managers for training and validation (``reward_model.reward_manager`` with its
    ``reward_kwargs``; the custom score function if configured). The built-in managers score in a process
    pool with ``reward_model.num_workers``; a registered one is built with verl's arguments."""
    from rlflow.reward import (
        BUILTIN_REWARD_MANAGERS,
        OverlongBuffer,
        get_custom_reward_fn,
        get_reward_manager_cls,
    )

    custom = get_custom_reward_fn(config.custom_reward_function)
    rm = config.reward_model
    name = str(rm.reward_manager)
    logger.info(
        "reward: %s, then the %r reward manager (reward_model.use_reward_loop=%s: rlflow has one reward path)",
        "the reward-model group's scores" if rm.enable else "the score function",
        name,
        bool(rm.use_reward_loop),
    )
    manager = get_reward_manager_cls(name)
    score = custom if custom is not None else _default_score(config)
    common: dict[str, Any] = {"compute_score": score, "reward_fn_key": str(config.data.reward_fn_key)}
    if name not in BUILTIN_REWARD_MANAGERS:
        kwargs = {**common, **dict(rm.reward_kwargs)}
        return (
            manager(tokenizer=tokenizer, num_examine=0, **kwargs),
            manager(tokenizer=tokenizer, num_examine=1, **kwargs),
        )
    if name == "dapo":
        common["overlong"] = OverlongBuffer.from_reward_kwargs(
            dict(rm.reward_kwargs), int(config.data.max_response_length)
        )
    workers, timeout = int(rm.num_workers), rm.timeout_s
    if name == "prime":  # verl's pool: its defaults where the config leaves the pool unset
        from rlflow.reward.prime import PRIME_TIMEOUT_S, prime_workers

        workers, timeout = workers or prime_workers(), PRIME_TIMEOUT_S if timeout is None else timeout
    train = manager(
        tokenizer,
        num_examine=0,
        num_workers=workers,
        timeout_s=timeout,
        timeout_score=float(rm.timeout_score),
        **common,
    )
    val = manager(tokenizer, num_examine=1, **common)
    return train, val


def rollout_summary(config: PPOTrainerConfig) -> str:
    """One line on how responses are generated, logged when the trainer is built (``rollout.mode`` read)."""
    rollout = config.actor_rollout_ref.rollout
    mode = str(rollout.mode)
    how = (
        "verl's served-engine mode; rlflow's single-turn engine serves the batch in the actor workers"
        if mode == "async"
        else "one engine call per batch in the actor workers"
    )
    return f"rollout: engine {rollout.name!r}, mode={mode} ({how}), n={int(rollout.n)}"


def build_tracker(config: PPOTrainerConfig) -> Any:
    """The run's tracker (``trainer.logger`` backends under ``trainer.log_dir``)."""
    from rlflow.logging.tracking import Tracking, run_log_dir

    t = config.trainer
    log_dir = run_log_dir(t.log_dir, t.project_name, t.experiment_name)
    return Tracking(
        str(t.project_name),
        str(t.experiment_name),
        list(t.logger),
        config=dataclasses.asdict(config),
        log_dir=log_dir,
        system_metrics=bool(t.log_system_metrics),
    )


def megatron_summaries(config: PPOTrainerConfig) -> list[str]:
    """How each role's Megatron layout (verl's ``<role>.megatron``, from a ported script) runs here: one
    line per role of this run whose layout is not the default (`rlflow.config.megatron_checks`)."""
    from rlflow.config.megatron_checks import megatron_summary
    from rlflow.config.validate import need_critic, need_reference_policy

    arr = config.actor_rollout_ref
    roles = [("actor_rollout_ref.actor", arr.actor)]
    if need_reference_policy(config):
        roles.append(("actor_rollout_ref.ref", arr.ref))
    if need_critic(config):
        roles.append(("critic", config.critic))
    lines = [megatron_summary(key, role.megatron, role.ulysses_sequence_parallel_size) for key, role in roles]
    return [line for line in lines if line]


def _trainer(config: PPOTrainerConfig, tracker: Any | None) -> Any:
    from rlflow.config.trainer_checks import runtime_env_vars
    from rlflow.models.loader import load_tokenizer
    from rlflow.single_controller import init_ray
    from rlflow.trainer.ray_trainer import RayPPOTrainer

    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(
        str(config.data.tokenizer or model.tokenizer_path or model.path),
        trust_remote_code=bool(model.trust_remote_code or config.data.trust_remote_code),
        chat_template=model.custom_chat_template,
    )
    train_loader, val_loader = build_data(config, tokenizer)
    reward_fn, val_reward_fn = build_reward_fns(config, tokenizer)
    logger.info("%s", rollout_summary(config))
    for line in megatron_summaries(config):
        logger.info("%s", line)
    custom_adv = None
    spec = config.algorithm.custom_advantage_function
    if spec.path:
        from rlflow.algos.custom import load_custom_advantage_fn

        custom_adv = load_custom_advantage_fn(str(spec.path), str(spec.name))
    ray_cfg = config.ray_init
    init_ray(
        address=ray_cfg.address,
        num_cpus=ray_cfg.num_cpus,
        object_store_memory=ray_cfg.object_store_memory,
        runtime_env={**ray_cfg.runtime_env, "env_vars": runtime_env_vars(ray_cfg.runtime_env)},
    )
    return RayPPOTrainer(
        config, tokenizer, reward_fn, val_reward_fn, train_loader, val_loader, custom_adv, tracker=tracker
    )


def build_trainer(cfg: DictConfig, tracker: Any | None = None) -> Any:
    """Prepare and validate ``cfg``, start (or join) Ray and return a ready ``RayPPOTrainer``
    (workers not created yet: ``trainer.init_workers()`` or ``trainer.fit()`` does it)."""
    return _trainer(to_typed(prepare_config(cfg)), tracker)


def run_ppo(cfg: DictConfig, tracker: Any | None = None) -> dict[str, Any]:
    """Prepare, validate, start Ray, train, shut the workers down. Returns the last metrics and the
    per-step history."""
    config = to_typed(prepare_config(cfg))
    own_tracker = tracker is None
    if own_tracker:
        tracker = build_tracker(config)
    trainer = _trainer(config, tracker)
    try:
        final = trainer.fit()
    finally:
        trainer.shutdown()
        if own_tracker:
            tracker.finish()
    return {"final": final, "history": trainer.history}


@hydra.main(config_path=str(config_dir()), config_name="ppo_trainer", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_ppo(cfg)


def main() -> None:
    """Command-line entry point: Hydra, after rewriting verl's spellings of renamed keys."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rlflow.trainer.cli import hydra_options_first

    overrides = drop_append_on_known_keys(
        rewrite_overrides(hydra_options_first(sys.argv[1:])), PPOTrainerConfig
    )
    try:
        check_override_keys(overrides, PPOTrainerConfig)
    except ValueError as err:
        raise SystemExit(f"rlflow.trainer.main_ppo: {err}") from None
    sys.argv = [sys.argv[0], *overrides]
    _hydra_main()


if __name__ == "__main__":
    main()
