"""``<role>.checkpoint``: what a role's checkpoint holds (verl's ``save_contents`` / ``load_contents``).

rlflow's checkpoints resume exactly: every one holds the sharded model, the optimizer state and the
``extra`` state (LR scheduler, RNG, step), so those three are required in ``save_contents``. A resume
restores what ``load_contents`` names: the model always; leaving out ``optimizer`` / ``extra`` starts
the optimizer state / the LR schedule and RNG afresh (logged), as in verl. ``hf_model`` in
``save_contents`` also writes the full model in Hugging Face format (safetensors, config, tokenizer) to
``<checkpoint>/huggingface/``, loadable with ``from_pretrained`` without running
``python -m rlflow.model_merger``; in ``load_contents`` it is accepted and not loaded (as in verl).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, ListConfig

from rlflow.config.checks import flag, value_at
from rlflow.config.interpolation import II

__all__ = ["CHECKPOINT_CONTENTS", "CheckpointContentsSection", "check_checkpoint_contents", "saves_hf_model"]

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
_REQUIRED = ("model", "optimizer", "extra")


@dataclass
class CheckpointContentsSection:
    """``actor_rollout_ref.actor.checkpoint`` / ``critic.checkpoint`` (see the module docstring).

    Attributes:
        save_contents: what each checkpoint holds: model, optimizer, extra (required), hf_model.
        load_contents: what a resume restores (default: ``save_contents``): model (required),
            optimizer, extra; hf_model is not read.
        async_save: verl's asynchronous save; false only (rlflow saves synchronously, then publishes
            the step atomically).
    """

    save_contents: list[str] = field(default_factory=lambda: list(_REQUIRED))
    load_contents: list[str] = II(".save_contents")  # noqa: RUF009 (a string: the interpolation)
    async_save: bool = False


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
        missing = [v for v in _REQUIRED if v not in value]
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


def saves_hf_model(section: object) -> bool:
    """Whether a typed ``<role>.checkpoint`` section asks for the Hugging Face copy."""
    return "hf_model" in list(getattr(section, "save_contents", ()))
