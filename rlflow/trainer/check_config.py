"""``python -m rlflow.trainer.check_config [overrides]``: validate a ``main_ppo`` command line, start nothing.

Hydra's ``--cfg job`` prints the composed config without validating it. This runs everything
``main_ppo`` checks before Ray starts — verl spellings rewritten, unknown keys refused with the closest
ones, the critic config file applied, files and model paths checked, every layout and batch-size rule
(`rlflow.config.validate.validate_config`) — then prints a one-line summary (``--print``: the resolved
config as YAML too) and exits 0, or prints the problem and exits 1. A warm-started embedded model is not
built: its architecture (the tiny model's) is what validation needs.

    python -m rlflow.trainer.check_config algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4
    python -m rlflow.trainer.check_config --config-name demo trainer.total_training_steps=300

``--config-name NAME`` (or ``-cn NAME``) picks the config file as it does for ``main_ppo``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

__all__ = ["check_config", "main", "summary"]


def check_config(overrides: Sequence[str], config_name: str | None = None) -> DictConfig:
    """Compose and validate ``overrides`` as ``main_ppo`` would (a warm start is not built).

    Args:
        overrides: Hydra overrides.
        config_name: the config file (``ppo_trainer``, verl's defaults, when None; ``demo``: the CPU demo).

    Returns:
        The validated config.

    Raises:
        ValueError: the first problem, naming the key.
        hydra.errors.ConfigCompositionException: a value of the wrong type.
    """
    from rlflow.config import CONFIG_NAME, load_config
    from rlflow.trainer.main_ppo import prepare_config

    cfg = load_config(list(overrides), config_name=config_name or CONFIG_NAME)
    return prepare_config(cfg, build_warm_start=False)


def summary(cfg: DictConfig) -> str:
    """One line: the estimator, the roles that will start, the layout and the step geometry."""
    from rlflow.config import needed_roles

    trainer, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    names = {"actor": "actor+rollout", "ref": "reference", "reward_model": "reward model"}
    roles = [names.get(role, role) for role in needed_roles(cfg)]
    steps = trainer.total_training_steps if trainer.total_training_steps is not None else "from total_epochs"
    return (
        f"config OK: {cfg.algorithm.adv_estimator}; roles: {', '.join(roles)}; "
        f"{trainer.nnodes} x {trainer.n_gpus_per_node} ranks; {cfg.data.train_batch_size} prompts x "
        f"{rollout.n} responses per step; steps: {steps}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    from hydra.errors import HydraException

    from rlflow.trainer.cli import split_config_name

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config_name, overrides = split_config_name([a for a in args if a != "--print"])
        cfg = check_config(overrides, config_name)
    except (ValueError, HydraException) as err:  # HydraException: composition and override-parse errors
        print(f"rlflow.trainer.check_config: {err}", file=sys.stderr)
        return 1
    if "--print" in args:
        print(OmegaConf.to_yaml(cfg, resolve=True))
    print(summary(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
