"""core_algos' KL penalties, KL controllers and the KL-in-reward penalty against hand-computed numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlflow.protocol import DataProto
from rlflow.trainer.ppo.core_algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
)
from tests.algos.hand_values import _close, _t

# -------------------------------------------------------------------------------------------------- KL

LP = _t([[-1.0, -2.0, -3.0]])
REF = _t([[-1.5, -1.0, 27.0]])  # log ratios 0.5, -1, -30
K3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1, 10.0]  # the third clamps (exp(20) - 21 -> 10)
KL_VALUES = {
    "kl": [0.5, -1.0, -30.0],
    "k1": [0.5, -1.0, -30.0],
    "abs": [0.5, 1.0, 30.0],
    "mse": [0.125, 0.5, 450.0],
    "k2": [0.125, 0.5, 450.0],
    "low_var_kl": K3,
    "k3": K3,
}
KL_GRADS = {  # d / d logprob
    "kl": [1.0, 1.0, 1.0],
    "abs": [1.0, -1.0, -1.0],
    "mse": [0.5, -1.0, -30.0],
    "low_var_kl": [1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0],  # 1 - exp(ref - lp); 0 where clamped
}
KL_GRADS["k1"], KL_GRADS["k2"], KL_GRADS["k3"] = KL_GRADS["kl"], KL_GRADS["mse"], KL_GRADS["low_var_kl"]


@pytest.mark.parametrize("name", list(KL_VALUES))
def test_kl_penalty_values_and_gradients(name):
    lp = LP.clone().requires_grad_(True)
    out = kl_penalty(lp, REF, name)
    _close(out.detach(), [KL_VALUES[name]])
    out.sum().backward()
    _close(lp.grad, [KL_GRADS[name]])


@pytest.mark.parametrize("name", list(KL_VALUES))
def test_kl_penalty_straight_through_has_value_of_estimator_and_gradient_of_k2(name):
    lp = LP.clone().requires_grad_(True)
    out = kl_penalty(lp, REF, name + "+")
    _close(out.detach(), [KL_VALUES[name]])
    out.sum().backward()
    _close(lp.grad, [[0.5, -1.0, -30.0]])  # d/dlp 0.5 (lp - ref)^2


def test_kl_penalty_errors_and_kl_loss():
    with pytest.raises(ValueError, match="'full' needs full-vocabulary logits"):
        kl_penalty(LP, REF, "full")
    with pytest.raises(ValueError, match="unknown kl_penalty 'k4'"):
        kl_penalty(LP, REF, "k4")
    mask = torch.tensor([[1, 1, 0]])
    _close(compute_kl_loss(LP, REF, mask, "k1"), (0.5 - 1.0) / 2)
    _close(compute_kl_loss(LP, REF, mask, "k2", "seq-mean-token-sum", global_seq_num=2, dp_size=2), 0.625)


def test_fixed_kl_controller_never_moves():
    ctrl = get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.05))
    assert isinstance(ctrl, FixedKLController)
    for kl, n in [(0.0, 8), (1.0, 8), (100.0, 1000)]:
        ctrl.update(current_kl=kl, n_steps=n)
        assert ctrl.value == 0.05


def test_adaptive_kl_controller_over_several_updates():
    ctrl = get_kl_controller(
        OmegaConf.create({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.05, "horizon": 100})
    )
    assert isinstance(ctrl, AdaptiveKLController)
    expected = 0.1
    # (kl, n_steps) -> error clip(kl / 0.05 - 1, -0.2, 0.2) -> factor 1 + e n / 100
    for kl, n, factor in [
        (0.06, 10, 1.02),
        (0.04, 20, 0.96),
        (0.5, 50, 1.1),
        (0.05, 100, 1.0),
        (0.0, 100, 0.8),
    ]:
        ctrl.update(current_kl=kl, n_steps=n)
        expected *= factor
        assert ctrl.value == pytest.approx(expected, rel=1e-12, abs=0)
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.96 * 1.1 * 0.8, rel=1e-12)


def test_get_kl_controller_from_dataclass_and_errors():
    @dataclass
    class KLCtrl:
        type: str = "adaptive"
        kl_coef: float = 0.2
        target_kl: float = 0.1
        horizon: int = 10

    ctrl = get_kl_controller(KLCtrl())
    assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.2, 0.1, 10)
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.type"):
        get_kl_controller(KLCtrl(type="pid"))
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.horizon"):
        get_kl_controller(KLCtrl(horizon=0))
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.target_kl"):
        get_kl_controller(KLCtrl(target_kl=0.0))
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.kl_coef"):
        get_kl_controller(KLCtrl(type="fixed", kl_coef=None))


def _kl_batch():
    return DataProto.from_dict(
        tensors={
            "token_level_scores": _t([[0, 0, 1], [0, 2, 0]]),
            "old_log_probs": _t([[-1, -2, -3], [-0.5, -1, -9]]),
            "ref_log_prob": _t([[-1.5, -1, -3], [-1, -1, 0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        }
    )


def test_apply_kl_penalty_fixed_and_adaptive():
    # k1 = old - ref: [0.5, -1, 0], [0.5, 0, masked]; beta 0.1
    data, metrics = apply_kl_penalty(_kl_batch(), FixedKLController(0.1), kl_penalty="kl")
    _close(data.batch["token_level_rewards"], [[-0.05, 0.1, 1.0], [-0.05, 2.0, 0.0]])
    # per-sequence means -1/6 and 1/4, averaged: 1/24
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(1 / 24, abs=1e-7)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)

    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=10)
    _, metrics = apply_kl_penalty(_kl_batch(), ctrl, kl_penalty="kl")
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)  # beta used, before the update
    # error 1/24 / 0.05 - 1 = -1/6; n_steps = bs = 2: factor 1 - (1/6) * 2 / 10
    assert ctrl.value == pytest.approx(0.1 * (1 - 1 / 30), rel=1e-6)

    bad = _kl_batch()
    bad.batch.pop("ref_log_prob")
    with pytest.raises(ValueError, match="no 'ref_log_prob'"):
        apply_kl_penalty(bad, FixedKLController(0.1))
