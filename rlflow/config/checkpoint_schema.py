"""``<role>.checkpoint``: what a role's checkpoint holds (verl's ``save_contents`` / ``load_contents``).

rlflow's checkpoints resume exactly: by default every one holds the sharded model, the optimizer state
and the ``extra`` state (LR scheduler, RNG). ``save_contents`` without ``optimizer`` / ``extra`` (verl's
way to save disk: the optimizer state is twice the model's size) writes checkpoints a resume can only
restart those from (warned when the config is checked). A resume restores what ``load_contents`` names
(by default what ``save_contents`` saves): the model always; leaving out ``optimizer`` / ``extra``
starts the optimizer state / the LR schedule and RNG afresh (logged), as in verl. ``hf_model`` in
``save_contents`` also writes the full model in Hugging Face format (safetensors, config, tokenizer) to
``<checkpoint>/huggingface/``, loadable with ``from_pretrained`` without running
``python -m rlflow.model_merger``; in ``load_contents`` it is accepted and not loaded (as in verl).

No OmegaConf import here: the typed schema loads on machines without it (``scripts/gpu_check.py``);
the checks of these keys are in `rlflow.config.checkpoint_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlflow.config.interpolation import II

__all__ = ["CHECKPOINT_CONTENTS", "REQUIRED_CONTENTS", "CheckpointContentsSection", "saves_hf_model"]

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
REQUIRED_CONTENTS = ("model", "optimizer", "extra")


@dataclass
class CheckpointContentsSection:
    """``actor_rollout_ref.actor.checkpoint`` / ``critic.checkpoint`` (see the module docstring).

    Attributes:
        save_contents: what each checkpoint holds: model (required), optimizer, extra, hf_model; without
            optimizer or extra a resume restarts them.
        load_contents: what a resume restores (default: ``save_contents``): model (required),
            optimizer, extra (each only when saved); hf_model is not read.
        async_save: verl's asynchronous save; false only (rlflow saves synchronously, then publishes
            the step atomically).
    """

    save_contents: list[str] = field(default_factory=lambda: list(REQUIRED_CONTENTS))
    load_contents: list[str] = II(".save_contents")  # noqa: RUF009 (a string: the interpolation)
    async_save: bool = False


def saves_hf_model(section: object) -> bool:
    """Whether a typed ``<role>.checkpoint`` section asks for the Hugging Face copy."""
    return "hf_model" in list(getattr(section, "save_contents", ()))
