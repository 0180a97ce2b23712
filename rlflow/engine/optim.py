"""AdamW and its learning-rate schedules, configured by a role's ``optim`` section (verl key names).

The section (`rlflow.config.schema.OptimConfig`, validated by `rlflow.config.validate`) gives:

* ``lr``, ``betas``, ``eps``, ``weight_decay`` — AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101).
* ``lr_warmup_steps`` (``-1`` = use the ratio) / ``lr_warmup_steps_ratio`` — linear warmup length ``W``.
* ``lr_scheduler_type`` (or the older ``warmup_style``) — ``"constant"`` or ``"cosine"``.
* ``min_lr_ratio``, ``num_cycles`` — cosine floor (fraction of ``lr``) and number of cosine cycles.

``T``, the optimizer steps of the run, is the trainer's ``total_training_steps``.

Schedules, as the factor applied to ``lr`` after ``k`` calls of ``scheduler.step()`` (verl / HF
conventions, so the first step of a warmup runs at lr 0):

* constant: ``k / W`` for ``k < W``, then ``1``.
* cosine: ``m + (1 - m) * k / W`` for ``k < W``, then ``m + (1 - m) * (1 + cos(2 pi c p)) / 2`` with
  ``p = min(1, (k - W) / max(1, T - W))``, ``m = min_lr_ratio``, ``c = num_cycles`` (``0.5``: one half
  cosine from ``lr`` down to ``m * lr`` at step ``T``, SGDR, Loshchilov & Hutter 2017, arXiv:1608.03983).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LambdaLR

if TYPE_CHECKING:
    from rlflow.config.schema import OptimConfig

__all__ = [
    "SCHEDULER_TYPES",
    "WarmupSchedule",
    "build_lr_scheduler",
    "build_optimizer",
    "num_warmup_steps",
]

SCHEDULER_TYPES = ("constant", "cosine")


def build_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], optim: OptimConfig
) -> torch.optim.AdamW:
    """AdamW over ``params`` with the section's ``lr``, ``betas``, ``eps`` and ``weight_decay``.

    Args:
        params: parameters (plain or DTensor shards) or parameter groups.
        optim: the role's ``optim`` section.

    Returns:
        ``torch.optim.AdamW``.
    """
    betas = (float(optim.betas[0]), float(optim.betas[1]))
    return torch.optim.AdamW(
        params, lr=float(optim.lr), betas=betas, eps=float(optim.eps), weight_decay=float(optim.weight_decay)
    )


def num_warmup_steps(cfg: OptimConfig, total_steps: int | None, key_prefix: str = "optim") -> int:
    """Warmup length: ``lr_warmup_steps`` when > 0, else ``int(lr_warmup_steps_ratio * total_steps)``.

    Args:
        cfg: the role's ``optim`` section.
        total_steps: optimizer steps of the run (needed only for the ratio).
        key_prefix: config path used in error messages.
    """
    if cfg.lr_warmup_steps > 0:
        warmup = int(cfg.lr_warmup_steps)
    elif cfg.lr_warmup_steps_ratio > 0:
        if total_steps is None or total_steps <= 0:
            raise ValueError(
                f"{key_prefix}.lr_warmup_steps_ratio={cfg.lr_warmup_steps_ratio} needs the total number of "
                f"training steps (trainer.total_training_steps), got {total_steps}"
            )
        warmup = int(cfg.lr_warmup_steps_ratio * total_steps)
    else:
        warmup = 0
    if total_steps is not None and total_steps > 0 and warmup > total_steps:
        raise ValueError(
            f"{key_prefix}.lr_warmup_steps={warmup} must be <= the total training steps {total_steps}"
        )
    return warmup


@dataclass
class WarmupSchedule:
    """LR factor ``f(k)`` of the module docstring; a picklable callable so the scheduler state saves.

    Attributes:
        kind: ``"constant"`` or ``"cosine"``.
        warmup_steps: ``W``.
        total_steps: ``T`` (cosine only).
        min_lr_ratio: ``m`` (cosine only).
        num_cycles: ``c`` (cosine only).
    """

    kind: str
    warmup_steps: int
    total_steps: int = 0
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5

    def __call__(self, step: int) -> float:
        if self.kind == "constant":
            return step / self.warmup_steps if step < self.warmup_steps else 1.0
        m = self.min_lr_ratio
        if step < self.warmup_steps:
            return m + (1.0 - m) * step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(2.0 * math.pi * self.num_cycles * progress))


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    optim: OptimConfig,
    total_steps: int | None = None,
    key_prefix: str = "optim",
) -> LambdaLR:
    """LR scheduler for ``optimizer``: linear warmup, then constant or cosine (module docstring).

    Call ``scheduler.step()`` once after every ``optimizer.step()``.

    Args:
        optimizer: the optimizer whose ``lr`` is the peak learning rate.
        optim: the role's ``optim`` section.
        total_steps: optimizer steps of the run; needed for the cosine schedule and for
            ``lr_warmup_steps_ratio``.
        key_prefix: config path used in error messages.

    Returns:
        A ``LambdaLR`` whose ``state_dict`` holds the schedule parameters and the step count.
    """
    kind = optim.lr_scheduler_type or optim.warmup_style
    if kind not in SCHEDULER_TYPES:
        raise ValueError(f"{key_prefix}.lr_scheduler_type={kind!r} must be one of {SCHEDULER_TYPES}")
    warmup = num_warmup_steps(optim, total_steps, key_prefix)
    if kind == "cosine" and (total_steps is None or total_steps <= 0):
        raise ValueError(
            f"{key_prefix}.lr_scheduler_type='cosine' needs the run's total training steps, got {total_steps}"
        )
    schedule = WarmupSchedule(
        kind, warmup, total_steps or 0, float(optim.min_lr_ratio), float(optim.num_cycles)
    )
    return LambdaLR(optimizer, schedule)
