"""GPG (estimator and loss) and GMPO (geometric-mean loss) against hand-computed numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlflow.algos.advantages import compute_gpg_outcome_advantage
from rlflow.algos.losses import get_policy_loss_fn
from rlflow.algos.pg_variants import compute_policy_loss_geo_mean, compute_policy_loss_gpg
from tests.algos.hand_values import _close, _t

CFG = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0)


def test_gpg_advantage_by_hand():
    # groups a: scores 1, 0; b: 0, 0; c (alone): 1 -> B = 5, two non-zero scores: alpha = 5 / 2
    # means a 0.5, b 0, c 0 (a group of one has mean 0) -> A = 2.5 * [0.5, -0.5, 0, 0, 1]
    rewards = _t([[0, 1], [0, 0], [0, 0], [0, 0], [1, 0]])
    mask = _t([[1, 1], [1, 1], [1, 0], [1, 1], [1, 1]])
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    adv, returns = compute_gpg_outcome_advantage(rewards, mask, index)
    expected = [[1.25, 1.25], [-1.25, -1.25], [0, 0], [0, 0], [2.5, 2.5]]
    _close(adv, expected)
    assert torch.equal(adv, returns)
    _close(compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0)[0], _t(expected) / 2)


def test_gpg_advantage_with_no_reward_at_all_is_zero():
    adv, _ = compute_gpg_outcome_advantage(
        torch.zeros(4, 3), torch.ones(4, 3), np.array([0, 0, 1, 1], dtype=object)
    )
    assert torch.equal(adv, torch.zeros(4, 3))


def test_gpg_loss_is_minus_advantage_times_log_prob():
    log_prob = _t([[-1.0, -2.0], [-0.5, -4.0]]).requires_grad_()
    old = _t([[-1.5, -2.0], [-0.5, -3.0]])
    adv = _t([[2.0, 2.0], [-1.0, -1.0]])
    mask = _t([[1, 1], [1, 0]])
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_gpg(old, log_prob, adv, mask, "token-mean", CFG)
    # valid tokens: -2*-1, -2*-2, -(-1)*-0.5 -> (2 + 4 - 0.5) / 3
    _close(loss, 5.5 / 3)
    (grad,) = torch.autograd.grad(loss, log_prob)
    _close(grad, [[-2 / 3, -2 / 3], [1 / 3, 0.0]])
    _close(ppo_kl, (-0.5 + 0.0 + 0.0) / 3)
    assert clipfrac == 0 and lower == 0
    assert get_policy_loss_fn("gpg") is compute_policy_loss_gpg


def _gmpo_inputs():
    # seq 1: A = +1 on 2 tokens, log-ratios 0.1, 0.5 (the second clipped to 0.2)
    # seq 2: A = -2 on 2 valid tokens, log-ratios -0.5 (clipped to -0.2), 0.1; the third token is masked
    old = torch.zeros(2, 3)
    log_prob = _t([[0.1, 0.5, 0.0], [-0.5, 0.1, 9.0]]).requires_grad_()
    adv = _t([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]])
    mask = _t([[1, 1, 0], [1, 1, 0]])
    return old, log_prob, adv, mask


def test_gmpo_loss_clipped_geometric_mean_by_hand():
    old, log_prob, adv, mask = _gmpo_inputs()
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_geo_mean(old, log_prob, adv, mask, "token-mean", CFG)
    # seq 1 (A > 0): min(d, clip d) = 0.1, 0.2 -> rho = e^0.15, L = -e^0.15
    # seq 2 (A < 0): pessimistic = max(d, clip d) = -0.2, 0.1 -> rho = e^-0.05, L = 2 e^-0.05
    expected = (-math.exp(0.15) + 2 * math.exp(-0.05)) / 2
    _close(loss, expected)
    (grad,) = torch.autograd.grad(loss, log_prob)
    # d L_1 / d d_1 = -1 * rho_1 / 2 tokens (token 2 clipped: 0); d L_2 / d d_2 = 2 * rho_2 / 2 (token 1
    # clipped: 0); the loss averages the two sequences
    _close(grad, [[-math.exp(0.15) / 4, 0.0, 0.0], [0.0, math.exp(-0.05) / 2, 0.0]])
    _close(clipfrac, 0.25)
    _close(lower, 0.25)
    _close(ppo_kl, -(0.1 + 0.5 - 0.5 + 0.1) / 4)


def test_gmpo_global_sequence_count_and_weights():
    old, log_prob, adv, mask = _gmpo_inputs()
    local, *_ = compute_policy_loss_geo_mean(old, log_prob, adv, mask, "token-mean", CFG)
    # the same two sequences as a rank's share of 8 sequences over dp 2: sum / 8 * 2
    share, *_ = compute_policy_loss_geo_mean(
        old, log_prob, adv, mask, "token-mean", CFG, global_seq_num=8, dp_size=2
    )
    _close(share, local * 2 * 2 / 8)
    # token weights 4, 1 on seq 1 -> geometric mean 2 doubles L_1; weights 1 leave seq 2
    weights = _t([[4.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    weighted, *_ = compute_policy_loss_geo_mean(old, log_prob, adv, mask, "token-mean", CFG, weights)
    _close(weighted, (-2 * math.exp(0.15) + 2 * math.exp(-0.05)) / 2)
    with pytest.raises(ValueError, match="rollout_is_weights"):
        compute_policy_loss_geo_mean(old, log_prob, adv, mask, "token-mean", CFG, torch.ones(2, 2))
