"""Trainer checkpoints: ``default_local_dir/global_step_N/{actor,critic,ref}/`` plus the driver's state
(``ref/`` only when the reference is synced with the actor).

The pointer file ``latest_checkpointed_iteration.txt`` is written last and atomically (write a temporary
file, then ``os.replace``), so a crash while saving never leaves a pointer to a partial checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlflow.utils.checkpoint_files import LATEST_FILE, CheckpointMirror, write_latest_pointer

logger = logging.getLogger(__name__)

__all__ = [
    "LATEST_FILE",
    "TrainerCheckpointer",
    "check_resume_adapters",
    "latest_checkpoint_dir",
    "read_latest_pointer",
    "resume_dir",
    "saved_steps",
    "write_latest_pointer",
]

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def saved_steps(root: str | os.PathLike) -> list[int]:
    """The steps of the ``global_step_N`` directories under ``root``, ascending."""
    return sorted(
        int(m.group(1)) for p in Path(root).iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()
    )


def read_latest_pointer(
    root: str | os.PathLike, is_complete: Callable[[Path], bool], expected: str
) -> str | None:
    """The ``global_step_N`` directory the pointer file under ``root`` names, or None when there is none.

    Args:
        root: the checkpoint root (``trainer.default_local_dir``).
        is_complete: whether a step directory holds a complete checkpoint.
        expected: what a complete step directory has, for the error message.

    Raises:
        ValueError: the pointer is not a step number, or names an incomplete step directory.
    """
    pointer = Path(root) / LATEST_FILE
    if not pointer.is_file():
        return None
    text = pointer.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{pointer}: expected a step number, found {text!r}")
    path = Path(root) / f"global_step_{int(text)}"
    if not is_complete(path):
        raise ValueError(f"{pointer} names step {text} but {path} has no {expected}")
    return str(path)


def latest_checkpoint_dir(root: str | os.PathLike) -> str | None:
    """The PPO trainer's ``global_step_N`` directory the pointer file names, or None when there is none."""
    return read_latest_pointer(root, lambda path: (path / STATE_FILE).is_file(), STATE_FILE)


def resume_dir(mode: str, resume_from_path: Any, root: str | os.PathLike) -> str | None:
    """Where a run resumes from per ``trainer.resume_mode`` (auto | disable | resume_path): None for a
    fresh start; under auto, the step the pointer file under ``root`` (``default_local_dir``) names.

    Raises:
        ValueError: an unknown mode, or a ``resume_from_path`` that is not a complete checkpoint.
    """
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = Path(str(resume_from_path))
        if not (path / STATE_FILE).is_file():
            raise ValueError(f"trainer.resume_from_path={path}: not a complete checkpoint (no {STATE_FILE})")
        return str(path)
    if mode != "auto":
        raise ValueError(f"trainer.resume_mode={mode!r} must be auto, disable or resume_path")
    return latest_checkpoint_dir(root)


def _adapters(modules: dict[str, int]) -> str:
    if not modules:
        return "no LoRA adapters"
    ranks = sorted(set(modules.values()))
    return f"LoRA adapters of rank {ranks[0] if len(ranks) == 1 else ranks} on {len(modules)} linear layers"


def check_resume_adapters(trainer: Any, adapters: dict[str, dict[str, int]], critic: bool) -> None:
    """Before Ray starts: the checkpoint a run resumes from holds, for the actor and the critic, the LoRA
    adapters the run's config gives them (the same adapted layers, the same ranks), else ``ValueError``
    naming the checkpoint, the role's keys and what to do (a worker would otherwise fail on the
    mismatched tensors after start-up, `rlflow.parallel.checkpoint.check_model_matches`).

    Args:
        trainer: the ``trainer`` config (``resume_mode``, ``resume_from_path``, ``default_local_dir``).
        adapters: ``{"actor" | "critic": {adapted module: rank}}`` of the roles with adapters
            (`rlflow.config.architecture_checks.check_role_architectures`).
        critic: the run has a critic (else the checkpoint's critic, which it does not load, is not read).
    """
    from rlflow.config.lora_checks import CRITIC_MODEL, MODEL
    from rlflow.parallel.checkpoint import is_checkpoint_complete, saved_model_shapes

    path = resume_dir(str(trainer.resume_mode), trainer.resume_from_path, str(trainer.default_local_dir))
    if path is None:
        return
    for role, key in (("actor", MODEL), ("critic", CRITIC_MODEL)):
        role_dir = Path(path) / role
        if role == "critic" and not critic:
            continue
        if not is_checkpoint_complete(role_dir):
            continue
        saved = {
            name.removesuffix(".lora_A"): shape[0]
            for name, shape in saved_model_shapes(role_dir).items()
            if name.endswith(".lora_A")
        }
        wanted = adapters.get(role, {})
        if saved != wanted:
            raise ValueError(
                f"trainer.resume_mode={trainer.resume_mode}: {role_dir} was saved with {_adapters(saved)}, "
                f"this run gives the {role} {_adapters(wanted)} ({key}.lora_rank / lora_alpha / "
                "target_modules): set them as the checkpoint was saved, or start afresh "
                "(trainer.resume_mode=disable)"
            )


class TrainerCheckpointer:
    """Saves and restores worker checkpoints and the driver state under ``trainer.default_local_dir``.

    Args:
        trainer: the ``trainer`` config (``default_local_dir``, ``resume_mode``, ``resume_from_path``,
            ``max_actor_ckpt_to_keep``, ``max_critic_ckpt_to_keep``, ``default_hdfs_dir``: where each
            complete checkpoint is copied, `rlflow.utils.checkpoint_files`).
        save_ref: also save and restore the reference policy (``ref.sync_ref_model``: it moves with the
            actor, so a resume needs its weights; kept as long as the actor's).
    """

    def __init__(self, trainer: Any, save_ref: bool = False) -> None:
        self.root = Path(str(trainer.default_local_dir))
        self.resume_mode = str(trainer.resume_mode)
        self.resume_from_path = trainer.resume_from_path
        self.keep = {
            "actor": trainer.max_actor_ckpt_to_keep,
            "ref": trainer.max_actor_ckpt_to_keep,
            "critic": trainer.max_critic_ckpt_to_keep,
        }
        self.save_ref = bool(save_ref)
        mirror = trainer.default_hdfs_dir
        self.mirror = None if mirror is None else CheckpointMirror(str(mirror))

    def save(self, step: int, groups: Any, state: dict[str, Any]) -> str:
        """Write step ``step``: every role's shards, then the driver state, then the pointer."""
        step_dir = self.root / f"global_step_{step}"
        step_dir.mkdir(parents=True, exist_ok=True)
        groups.actor.save_checkpoint(str(step_dir / "actor"), step)
        if self.save_ref and groups.ref is not None:  # a synced reference is not the initial model any more
            groups.ref.save_checkpoint(str(step_dir / "ref"), step)
        if groups.critic is not None:
            groups.critic.save_checkpoint(str(step_dir / "critic"), step)
        tmp = step_dir / (STATE_FILE + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, step_dir / STATE_FILE)
        write_latest_pointer(self.root, step)
        self._prune(step)
        logger.info("saved checkpoint %s", step_dir)
        if self.mirror is not None:
            self.mirror.copy(step_dir, step)
        return str(step_dir)

    def _prune(self, current: int) -> None:
        steps = saved_steps(self.root)
        for role, keep in self.keep.items():
            if keep is None or int(keep) <= 0:
                continue
            for old in [s for s in steps if s != current][: max(0, len(steps) - int(keep))]:
                shutil.rmtree(self.root / f"global_step_{old}" / role, ignore_errors=True)
        for old in steps:
            step_dir = self.root / f"global_step_{old}"
            if old != current and not any((step_dir / r).exists() for r in ("actor", "ref", "critic")):
                shutil.rmtree(step_dir, ignore_errors=True)

    def resume_dir(self) -> str | None:
        """Where to resume from per ``trainer.resume_mode`` (`resume_dir`)."""
        return resume_dir(self.resume_mode, self.resume_from_path, self.root)

    def load(self, groups: Any) -> dict[str, Any] | None:
        """Restore every role from the resume directory; returns the driver state (None: fresh start)."""
        path = self.resume_dir()
        if path is None:
            return None
        step_dir = Path(path)
        roles = [("actor", groups.actor)]
        if self.save_ref and groups.ref is not None:
            if not (step_dir / "ref").exists():
                raise ValueError(
                    f"checkpoint {step_dir} has no ref/ but this run syncs the reference policy "
                    "(actor_rollout_ref.ref.sync_ref_model=true): the reference weights are not in it"
                )
            roles.append(("ref", groups.ref))
        if groups.critic is not None:
            if not (step_dir / "critic").exists():
                raise ValueError(f"checkpoint {step_dir} has no critic/ but this run uses a critic")
            roles.append(("critic", groups.critic))
        for role, group in roles:
            _note_resume_differences(step_dir / role, group.world_size)
            group.load_checkpoint(str(step_dir / role))
        return torch.load(step_dir / STATE_FILE, weights_only=True)


def _note_resume_differences(role_dir: Path, world_size: int) -> None:
    """Log what a resume does not restore: the per-rank RNG states on another number of ranks, the
    optimizer state when the checkpoint was saved without it."""
    from rlflow.parallel.checkpoint import checkpoint_meta

    meta = checkpoint_meta(role_dir)
    saved = int(meta["world_size"])
    if saved != world_size:
        logger.warning(
            "resuming %s written by %d rank(s), this run has %d: model, optimizer and lr schedule are "
            "resharded by torch.distributed.checkpoint; the per-rank python/numpy/torch RNG states are not "
            "restored, every rank is re-seeded from trainer.seed (rollout sampling is keyed by step and global "
            "row, mini-batch shuffles by step: neither reads those states)",
            role_dir,
            saved,
            world_size,
        )
    if role_dir.name != "ref" and not meta["has_optimizer"]:
        logger.warning(
            "resuming %s: the checkpoint holds no optimizer state (checkpoint.save_contents without 'optimizer'), "
            "so the optimizer's moments start afresh and the run does not continue exactly",
            role_dir,
        )
