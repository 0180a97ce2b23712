"""AdamW and its learning-rate schedules, configured with verl's ``optim.*`` key names.

Config keys (``actor_rollout_ref.actor.optim.*``, ``critic.optim.*``), all validated by `OptimConfig`:

* ``lr``, ``betas``, ``eps``, ``weight_decay`` — AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101).
* ``clip_grad`` — max total gradient norm (used by the workers with `rlflow.parallel.fsdp.clip_grad_norm_`).
* ``lr_warmup_steps`` (``-1`` = use the ratio) / ``lr_warmup_steps_ratio`` — linear warmup length ``W``.
* ``lr_scheduler_type`` (or the older ``warmup_style``) — ``"constant"`` or ``"cosine"``.
* ``min_lr_ratio``, ``num_cycles`` — cosine floor (fraction of ``lr``) and number of cosine cycles.
* ``total_training_steps`` — ``T``, optimizer steps of the run (the trainer fills it in).

Schedules, as the factor applied to ``lr`` after ``k`` calls of ``scheduler.step()`` (verl / HF
conventions, so the first step of a warmup runs at lr 0):

* constant: ``k / W`` for ``k < W``, then ``1``.
* cosine: ``m + (1 - m) * k / W`` for ``k < W``, then ``m + (1 - m) * (1 + cos(2 pi c p)) / 2`` with
  ``p = min(1, (k - W) / max(1, T - W))``, ``m = min_lr_ratio``, ``c = num_cycles`` (``0.5``: one half
  cosine from ``lr`` down to ``m * lr`` at step ``T``, SGDR, Loshchilov & Hutter 2017, arXiv:1608.03983).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = [
    "SCHEDULER_TYPES",
    "OptimConfig",
    "WarmupSchedule",
    "build_lr_scheduler",
    "build_optimizer",
    "num_warmup_steps",
]

SCHEDULER_TYPES = ("constant", "cosine")
_FLOAT_KEYS = {
    "lr",
    "eps",
    "weight_decay",
    "clip_grad",
    "lr_warmup_steps_ratio",
    "min_lr_ratio",
    "num_cycles",
}
_INT_KEYS = {"lr_warmup_steps", "total_training_steps"}


def _number(value: Any, key: str) -> float:
    """``float(value)`` (YAML may give ``"1e-6"`` as a string), or ``ValueError`` naming ``key``."""
    if isinstance(value, bool):
        raise ValueError(f"{key}={value!r} must be a number")
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key}={value!r} must be a number") from exc


@dataclass
class OptimConfig:
    """Optimizer and LR-schedule settings of one role (verl key names).

    Attributes:
        lr: peak learning rate.
        betas: AdamW ``(beta1, beta2)``.
        eps: AdamW epsilon.
        weight_decay: decoupled weight decay.
        clip_grad: max total gradient L2 norm.
        lr_warmup_steps: warmup steps; ``-1`` (or any value <= 0) means "use ``lr_warmup_steps_ratio``".
        lr_warmup_steps_ratio: warmup length as a fraction of ``total_training_steps``.
        lr_scheduler_type: ``"constant"`` or ``"cosine"``; ``None`` falls back to ``warmup_style``.
        warmup_style: verl's older name for ``lr_scheduler_type``.
        min_lr_ratio: cosine floor as a fraction of ``lr``.
        num_cycles: cosine cycles over the post-warmup steps (0.5 = half a cosine).
        total_training_steps: optimizer steps of the run; ``-1`` = unknown (then given to
            `build_lr_scheduler`).
        optimizer: only ``"AdamW"``.
    """

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: str | None = None
    warmup_style: str | None = None
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    total_training_steps: int = -1
    optimizer: str = "AdamW"

    @classmethod
    def from_config(cls, cfg: Any, key_prefix: str = "optim") -> OptimConfig:
        """Build and validate from an `OptimConfig`, a mapping (dict, OmegaConf) or a dataclass.

        Args:
            cfg: the role's ``optim`` section; ``None`` = defaults.
            key_prefix: config path used in error messages, e.g. ``"critic.optim"``.

        Raises:
            ValueError: naming the key, for unknown keys and invalid values.
        """
        if isinstance(cfg, cls):
            values = dataclasses.asdict(cfg)
        elif cfg is None:
            values = {}
        elif isinstance(cfg, Mapping):
            values = dict(cfg)
        elif dataclasses.is_dataclass(cfg):
            values = dataclasses.asdict(cfg)
        else:
            values = dict(vars(cfg))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{key_prefix}: unknown keys {unknown}; known keys are {sorted(known)}")
        if "betas" in values:
            betas = values["betas"]
            if isinstance(betas, str) or not isinstance(betas, Sequence) or len(betas) != 2:
                raise ValueError(f"{key_prefix}.betas={betas!r} must be a pair [beta1, beta2]")
            values["betas"] = (
                _number(betas[0], f"{key_prefix}.betas"),
                _number(betas[1], f"{key_prefix}.betas"),
            )
        for name in _FLOAT_KEYS & set(values):
            values[name] = _number(values[name], f"{key_prefix}.{name}")
        for name in _INT_KEYS & set(values):
            value = _number(values[name], f"{key_prefix}.{name}")
            if value != int(value):
                raise ValueError(f"{key_prefix}.{name}={values[name]!r} must be an integer")
            values[name] = int(value)
        out = cls(**values)
        out.validate(key_prefix)
        return out

    @property
    def scheduler_type(self) -> str:
        """``lr_scheduler_type``, else ``warmup_style``, else ``"constant"``."""
        return self.lr_scheduler_type or self.warmup_style or "constant"

    def validate(self, key_prefix: str = "optim") -> None:
        """Raise ``ValueError`` naming the first invalid key."""
        k = key_prefix
        checks = [
            ("lr", self.lr >= 0, "must be >= 0"),
            ("betas", all(0.0 <= b < 1.0 for b in self.betas), "must both be in [0, 1)"),
            ("eps", self.eps > 0, "must be > 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("clip_grad", self.clip_grad > 0, "must be > 0"),
            ("lr_warmup_steps_ratio", 0.0 <= self.lr_warmup_steps_ratio <= 1.0, "must be in [0, 1]"),
            ("min_lr_ratio", 0.0 <= self.min_lr_ratio <= 1.0, "must be in [0, 1]"),
            ("num_cycles", self.num_cycles > 0, "must be > 0"),
            ("optimizer", self.optimizer == "AdamW", "must be 'AdamW' (the only optimizer built here)"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{k}.{name}={getattr(self, name)!r} {rule}")
        for name in ("lr_scheduler_type", "warmup_style"):
            value = getattr(self, name)
            if value is not None and value not in SCHEDULER_TYPES:
                raise ValueError(f"{k}.{name}={value!r} must be one of {SCHEDULER_TYPES}")
        if self.lr_scheduler_type and self.warmup_style and self.lr_scheduler_type != self.warmup_style:
            raise ValueError(
                f"{k}.lr_scheduler_type={self.lr_scheduler_type!r} and {k}.warmup_style={self.warmup_style!r} "
                "disagree; set only lr_scheduler_type"
            )


def build_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
    optim_config: Any,
    key_prefix: str = "optim",
) -> torch.optim.AdamW:
    """AdamW over ``params`` with ``lr``, ``betas``, ``eps`` and ``weight_decay`` from the config.

    Args:
        params: parameters (plain or DTensor shards) or parameter groups.
        optim_config: `OptimConfig`, mapping or dataclass with verl's ``optim`` keys.
        key_prefix: config path used in error messages.

    Returns:
        ``torch.optim.AdamW``.
    """
    cfg = OptimConfig.from_config(optim_config, key_prefix)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def num_warmup_steps(cfg: OptimConfig, total_steps: int | None, key_prefix: str = "optim") -> int:
    """Warmup length: ``lr_warmup_steps`` when > 0, else ``int(lr_warmup_steps_ratio * total_steps)``.

    Args:
        cfg: validated config.
        total_steps: optimizer steps of the run (needed only for the ratio).
        key_prefix: config path used in error messages.
    """
    if cfg.lr_warmup_steps > 0:
        warmup = int(cfg.lr_warmup_steps)
    elif cfg.lr_warmup_steps_ratio > 0:
        if total_steps is None or total_steps <= 0:
            raise ValueError(
                f"{key_prefix}.lr_warmup_steps_ratio={cfg.lr_warmup_steps_ratio} needs the total number of "
                f"training steps ({key_prefix}.total_training_steps), got {total_steps}"
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
    optim_config: Any,
    total_steps: int | None = None,
    key_prefix: str = "optim",
) -> LambdaLR:
    """LR scheduler for ``optimizer``: linear warmup, then constant or cosine (module docstring).

    Call ``scheduler.step()`` once after every ``optimizer.step()``.

    Args:
        optimizer: the optimizer whose ``lr`` is the peak learning rate.
        optim_config: `OptimConfig`, mapping or dataclass with verl's ``optim`` keys.
        total_steps: optimizer steps of the run; ``None`` uses ``total_training_steps`` from the config.
            Needed for the cosine schedule and for ``lr_warmup_steps_ratio``.
        key_prefix: config path used in error messages.

    Returns:
        A ``LambdaLR`` whose ``state_dict`` holds the schedule parameters and the step count.
    """
    cfg = OptimConfig.from_config(optim_config, key_prefix)
    if total_steps is None and cfg.total_training_steps > 0:
        total_steps = cfg.total_training_steps
    warmup = num_warmup_steps(cfg, total_steps, key_prefix)
    kind = cfg.scheduler_type
    if kind == "cosine" and (total_steps is None or total_steps <= 0):
        raise ValueError(
            f"{key_prefix}.lr_scheduler_type='cosine' needs {key_prefix}.total_training_steps > 0, got {total_steps}"
        )
    schedule = WarmupSchedule(kind, warmup, total_steps or 0, cfg.min_lr_ratio, cfg.num_cycles)
    return LambdaLR(optimizer, schedule)
