"""rlflow.engine.optim: AdamW settings and LR schedules at given steps, from the schema's ``optim`` section
(its validation is in tests/config/test_config.py)."""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.config.schema import OptimConfig
from rlflow.engine.optim import build_lr_scheduler, build_optimizer


def _lrs(optim: dict, total_steps: int | None, n: int, lr: float = 1.0) -> list[float]:
    """Learning rate used by the optimizer step after ``k`` scheduler steps, k = 0..n-1."""
    param = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimConfig(**{**optim, "lr": lr})
    optimizer = build_optimizer([param], cfg)
    scheduler = build_lr_scheduler(optimizer, cfg, total_steps)
    out = []
    for _ in range(n):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_adamw_hyperparameters_and_one_hand_computed_step() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    cfg = OptimConfig(lr=0.1, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01)
    optimizer = build_optimizer([param], cfg)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        0.1,
        (0.9, 0.999),
        1e-8,
        0.01,
    )
    param.grad = torch.tensor([0.5], dtype=torch.float64)
    optimizer.step()
    # Decoupled decay: 1 * (1 - 0.1 * 0.01) = 0.999; m_hat = 0.5, v_hat = 0.25 after bias correction;
    # update = 0.1 * 0.5 / (0.5 + 1e-8).
    expected = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8)
    assert param.item() == pytest.approx(expected, abs=1e-12)


def test_constant_schedule_without_warmup() -> None:
    assert _lrs({"lr_scheduler_type": "constant"}, None, 3, lr=2e-5) == [2e-5] * 3


def test_constant_schedule_with_warmup_steps() -> None:
    # lr * k / W for k < W = 4, then lr (the first step runs at lr 0, verl/HF convention).
    got = _lrs({"lr_warmup_steps": 4, "warmup_style": "constant"}, None, 6, lr=1e-3)
    assert got == pytest.approx([0.0, 0.25e-3, 0.5e-3, 0.75e-3, 1e-3, 1e-3], abs=1e-15)


def test_warmup_ratio_uses_total_steps() -> None:
    # W = int(0.25 * 10) = 2.
    got = _lrs({"lr_warmup_steps_ratio": 0.25}, 10, 4)
    assert got == pytest.approx([0.0, 0.5, 1.0, 1.0], abs=1e-15)
    # lr_warmup_steps > 0 wins over the ratio.
    assert _lrs({"lr_warmup_steps": 1, "lr_warmup_steps_ratio": 0.5}, 10, 2) == pytest.approx([0.0, 1.0])


def test_cosine_schedule_with_warmup_and_floor() -> None:
    # W = 2, T = 10, m = 0.1: warmup 0.1 + 0.9 * k / 2; then 0.1 + 0.9 * (1 + cos(pi * (k - 2) / 8)) / 2.
    got = _lrs({"lr_scheduler_type": "cosine", "lr_warmup_steps": 2, "min_lr_ratio": 0.1}, 10, 13)
    expected = [0.1, 0.55, 1.0]
    expected += [0.1 + 0.45 * (1 + math.cos(math.pi * (k - 2) / 8)) for k in range(3, 11)]
    expected += [0.1, 0.1]  # stays at the floor after T
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[6] == pytest.approx(0.55, abs=1e-12)  # half way through the decay: (1 + 0.1) / 2


def test_cosine_with_zero_floor() -> None:
    got = _lrs({"lr_scheduler_type": "cosine"}, 4, 5)
    assert got == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    )


def test_scheduler_state_dict_round_trip() -> None:
    optim = OptimConfig(lr_scheduler_type="cosine", lr_warmup_steps=2, min_lr_ratio=0.1)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = build_optimizer([param], optim)
    scheduler = build_lr_scheduler(optimizer, optim, 10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    optimizer2 = build_optimizer([torch.nn.Parameter(torch.zeros(1))], optim)
    scheduler2 = build_lr_scheduler(optimizer2, OptimConfig(), None)  # replaced by load
    scheduler2.load_state_dict(state)
    for _ in range(3):
        optimizer.step()
        optimizer2.step()
        scheduler.step()
        scheduler2.step()
        assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_verl_warmup_style_is_the_fallback_scheduler_name() -> None:
    assert OptimConfig(warmup_style="cosine").scheduler_type == "cosine"
    assert OptimConfig(warmup_style="constant", lr_scheduler_type="cosine").scheduler_type == "cosine"


@pytest.mark.parametrize(
    ("optim", "total", "message"),
    [
        (
            {"lr_scheduler_type": "cosine"},
            None,
            r"critic.optim.lr_scheduler_type='cosine' needs the run's total training steps",
        ),
        ({"lr_warmup_steps_ratio": 0.1}, None, r"critic.optim.lr_warmup_steps_ratio=0.1 needs the total"),
        (
            {"lr_warmup_steps": 20},
            10,
            r"critic.optim.lr_warmup_steps=20 must be <= the total training steps 10",
        ),
    ],
)
def test_schedule_errors_name_the_key(optim: dict, total: int | None, message: str) -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimConfig(**optim)
    with pytest.raises(ValueError, match=message):
        build_lr_scheduler(build_optimizer([param], cfg), cfg, total, key_prefix="critic.optim")
