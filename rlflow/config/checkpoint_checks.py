"""Validation of ``<role>.checkpoint`` (`rlflow.config.checkpoint_schema`), used by `config_validate`."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, ListConfig

from rlflow.config.checkpoint_schema import CHECKPOINT_CONTENTS, REQUIRED_CONTENTS
from rlflow.config.checks import flag, value_at

__all__ = ["check_checkpoint_contents"]

logger = logging.getLogger(__name__)


def check_checkpoint_contents(cfg: DictConfig, section: str) -> None:
    """Refuse contents rlflow does not write or read, naming the key (``section``: ``<role>.checkpoint``)."""
    for name in ("save_contents", "load_contents"):
        key = f"{section}.{name}"
        value = value_at(cfg, key)
        if not isinstance(value, list | ListConfig) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key}={value!r} must be a list of {list(CHECKPOINT_CONTENTS)}")
        unknown = [v for v in value if v not in CHECKPOINT_CONTENTS]
        if unknown:
            raise ValueError(f"{key}: {unknown} not among {list(CHECKPOINT_CONTENTS)}")
        if "model" not in value:
            raise ValueError(
                f"{key}={list(value)} lacks 'model': every checkpoint holds and restores the model"
            )
        if name == "load_contents":
            unsaved = [
                v
                for v in ("optimizer", "extra")
                if v in value and v not in value_at(cfg, f"{section}.save_contents")
            ]
            if unsaved:
                raise ValueError(
                    f"{key}={list(value)} restores {unsaved}, which {section}.save_contents leaves out of every "
                    "checkpoint: drop them from load_contents (a resume then starts them afresh) or save them"
                )
            continue
        missing = [v for v in REQUIRED_CONTENTS if v not in value]
        if missing:
            logger.warning(
                "%s=%s leaves %s out of every checkpoint: a resume starts %s afresh (the optimizer's moments, the "
                "LR schedule and the RNG), so it does not continue the run exactly",
                key, list(value), missing, " and ".join(missing),
            )  # fmt: skip
    if flag(cfg, f"{section}.async_save"):
        raise ValueError(
            f"{section}.async_save=true: rlflow saves checkpoints synchronously (each step's directory is "
            "published complete, then the pointer file moves); set it false"
        )
