"""Validation of ``<role>.checkpoint`` (`rlflow.config.checkpoint_schema`), used by `config_validate`."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig

from rlflow.config.checkpoint_schema import CHECKPOINT_CONTENTS, REQUIRED_CONTENTS
from rlflow.config.checks import flag, value_at

__all__ = ["check_checkpoint_contents"]


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
        if name == "load_contents":
            if "model" not in value:
                raise ValueError(f"{key}={list(value)} lacks 'model': a resume always restores the model")
            continue
        missing = [v for v in REQUIRED_CONTENTS if v not in value]
        if missing:
            raise ValueError(
                f"{key}={list(value)} lacks {missing}: rlflow's checkpoints always hold the model, the "
                "optimizer and the extra state (LR scheduler, RNG, step) so that a resume continues exactly; "
                f"add them (hf_model adds a Hugging Face copy of the model)"
            )
    if flag(cfg, f"{section}.async_save"):
        raise ValueError(
            f"{section}.async_save=true: rlflow saves checkpoints synchronously (each step's directory is "
            "published complete, then the pointer file moves); set it false"
        )
