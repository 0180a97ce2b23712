"""core_algos' advantage estimators and registries against hand-computed numbers.

Expected values are worked out by hand in the comments (binary fractions where possible, so many checks are
exact); whitening is recomputed in plain Python from the hand-computed raw values.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlflow.trainer.ppo import core_algos as ca
from rlflow.trainer.ppo.core_algos import (
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from tests.algos.hand_values import EXACT, _close, _t


def _whiten_valid(raw, mask):
    """Plain-Python masked whitening (unbiased var, +1e-8) of hand-computed raw values; 0 on masked."""
    vals = [v for row, mrow in zip(raw, mask) for v, m in zip(row, mrow) if m]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    std = math.sqrt(var + 1e-8)
    return [[(v - mean) / std if m else 0.0 for v, m in zip(row, mrow)] for row, mrow in zip(raw, mask)]


# ------------------------------------------------------------------------------------------------- GAE

# row 0: full; row 1: masked token in the middle (its reward 5 and value 9 must be ignored);
# row 2: masked tail (rewards 5 and values 7 there must be ignored).
GAE_VALUES = _t([[1, 2, 3, 4], [1, 9, 3, 4], [1, 2, 7, 7]])
GAE_REWARDS = _t([[0, 0, 0, 1], [0, 5, 0, 1], [0, 1, 5, 5]])
GAE_MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 0]])

# raw advantages by hand: delta_t = r_t + gamma V(next valid) - V_t, A_t = delta_t + gamma lam A(next)
GAE_RAW = {
    # gamma = lam = 1: A_t = (sum of later rewards) - V_t
    (1.0, 1.0): [[0, -1, -2, -3], [0, 0, -2, -3], [0, -1, 0, 0]],
    # row0: t3 -3; t2 (0 + .5*4 - 3) + .25*-3 = -1.75; t1 (1.5 - 2) + .25*-1.75 = -0.9375;
    #       t0 (1 - 1) + .25*-0.9375 = -0.234375.  row1: t0 (1.5 - 1) + .25*-1.75 = 0.0625 (skips t1)
    (0.5, 0.5): [[-0.234375, -0.9375, -1.75, -3], [0.0625, 0, -1.75, -3], [-0.25, -1, 0, 0]],
    # gamma 1, lam .5: row0 t2 1 + .5*-3 = -.5; t1 1 + .5*-.5 = .75; t0 1 + .5*.75 = 1.375
    (1.0, 0.5): [[1.375, 0.75, -0.5, -3], [1.75, 0, -0.5, -3], [0.5, -1, 0, 0]],
}


@pytest.mark.parametrize(("gamma", "lam"), list(GAE_RAW))
def test_gae_hand_computed(gamma, lam):
    adv, ret = compute_gae_advantage_return(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=gamma, lam=lam)
    raw = GAE_RAW[(gamma, lam)]
    mask = GAE_MASK.tolist()
    values = GAE_VALUES.tolist()
    expected_ret = [[(a + v) * m for a, v, m in zip(*rows)] for rows in zip(raw, values, mask)]
    _close(ret, expected_ret, EXACT)  # binary fractions: exact
    _close(adv, _whiten_valid(raw, mask))


def test_gae_reads_gamma_lam_from_config_and_ignores_masked_inputs():
    cfg = OmegaConf.create({"gamma": 0.5, "lam": 0.5})
    adv, ret = compute_gae_advantage_return(GAE_REWARDS, GAE_VALUES, GAE_MASK, config=cfg)
    noisy_rewards, noisy_values = GAE_REWARDS.clone(), GAE_VALUES.clone()
    noisy_rewards[GAE_MASK == 0] = float("nan")
    noisy_values[GAE_MASK == 0] = 1e6
    adv2, ret2 = compute_gae_advantage_return(noisy_rewards, noisy_values, GAE_MASK, 0.5, 0.5)
    _close(adv2, adv, EXACT)
    _close(ret2, ret, EXACT)
    with pytest.raises(ValueError, match="gamma and lam"):
        compute_gae_advantage_return(GAE_REWARDS, GAE_VALUES, GAE_MASK)
    with pytest.raises(ValueError, match="values has shape"):
        compute_gae_advantage_return(GAE_REWARDS, GAE_VALUES[:, :3], GAE_MASK, 1.0, 1.0)


# --------------------------------------------------------------------------------------------- outcome

# groups of size 1 (a), 2 (b), 3 (c), 4 (d, all equal); scores a: 2; b: 1, 3; c: 0, 1, 5; d: 0.5 x4.
GROUP_INDEX = np.array(list("abbcccdddd"), dtype=object)
GROUP_SCORES = [2, 1, 3, 0, 1, 5, 0.5, 0.5, 0.5, 0.5]
GROUP_LENGTHS = [3, 1, 2, 3, 2, 1, 3, 3, 2, 1]


def _outcome_batch():
    mask = (torch.arange(3) < torch.tensor(GROUP_LENGTHS)[:, None]).long()
    rewards = torch.zeros(10, 3)
    for i, (score, length) in enumerate(zip(GROUP_SCORES, GROUP_LENGTHS)):
        rewards[i, length - 1] = score  # the score on the last valid token
        if length < 3:
            rewards[i, length] = 100.0  # a reward on a masked token is ignored
    return rewards, mask


def _broadcast(per_seq, mask):
    return torch.tensor(per_seq, dtype=torch.float32)[:, None] * mask.float()


def test_grpo_groups_of_size_1_to_4_both_normalisations():
    rewards, mask = _outcome_batch()
    eps = 1e-6
    s2, s7 = math.sqrt(2), math.sqrt(7)  # unbiased stds of b (1, 3) and c (0, 1, 5)
    expected = [
        2 / (1 + eps),
        -1 / (s2 + eps),
        1 / (s2 + eps),
        -2 / (s7 + eps),
        -1 / (s7 + eps),
        3 / (s7 + eps),
    ]
    expected += [0.0] * 4  # std 0: 0 / (0 + eps)
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, GROUP_INDEX)
    _close(adv, _broadcast(expected, mask))
    _close(ret, adv, EXACT)
    # Dr. GRPO: no division by std; a singleton keeps its score (mean 0)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, GROUP_INDEX, norm_adv_by_std_in_grpo=False)
    _close(adv, _broadcast([2, -1, 1, -2, -1, 3, 0, 0, 0, 0], mask), EXACT)


def test_grpo_index_errors():
    rewards, mask = _outcome_batch()
    with pytest.raises(ValueError, match="needs `index`"):
        compute_grpo_outcome_advantage(rewards, mask, None)
    with pytest.raises(ValueError, match="index has 3 entries"):
        compute_grpo_outcome_advantage(rewards, mask, np.array(["a", "b", "c"], dtype=object))


def test_rloo_leave_one_out():
    rewards, mask = _outcome_batch()
    # b: 1 - 3, 3 - 1; c: 0 - 3, 1 - 2.5, 5 - 0.5; d: 0; a (alone) keeps 2
    adv, ret = compute_rloo_outcome_advantage(rewards, mask, GROUP_INDEX)
    _close(adv, _broadcast([2, -2, 2, -3, -1.5, 4.5, 0, 0, 0, 0], mask))
    _close(ret, adv, EXACT)


RPP_REWARDS = _t([[0, 0, 0, 1], [0, 2, 9, 9], [1, 7, 0, 1]])
RPP_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 1]])
RPP_RETURNS = {
    # row2: the masked token (reward 7) is skipped: t2 0 + .5*1, t0 1 + .5*.5
    0.5: [[0.125, 0.25, 0.5, 1], [1, 2, 0, 0], [1.25, 0, 0.5, 1]],
    1.0: [[1, 1, 1, 1], [2, 2, 0, 0], [2, 0, 1, 1]],
}


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_reinforce_plus_plus_discounted_returns(gamma):
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(RPP_REWARDS, RPP_MASK, gamma=gamma)
    _close(ret, RPP_RETURNS[gamma], EXACT)
    _close(adv, _whiten_valid(RPP_RETURNS[gamma], RPP_MASK.tolist()))
    adv_cfg, _ = compute_reinforce_plus_plus_outcome_advantage(
        RPP_REWARDS, RPP_MASK, config=SimpleNamespace(gamma=gamma)
    )
    _close(adv_cfg, adv, EXACT)


def test_reinforce_plus_plus_baseline():
    rewards = _t([[0, 1, 50], [1, 0, 2], [5, 0, 0]])  # scores 1 (50 is masked), 3, 5
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    index = np.array(["a", "a", "b"], dtype=object)
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    # a: mean 2 -> -1, 1; b alone -> 5. Valid tokens -1 -1 1 1 1 5: mean 1, unbiased var 24 / 5
    std = math.sqrt(4.8 + 1e-8)
    expected = [[-2 / std, -2 / std, 0], [0, 0, 0], [4 / std, 0, 0]]
    _close(adv, expected)
    _close(ret, adv, EXACT)


def test_remax_reward_to_go_minus_greedy_baseline():
    rewards = _t([[0, 0, 1], [0, 2, 9], [1, 4, 2]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1]])
    baselines = _t([0.5, 3.0, 1.0])
    adv, ret = compute_remax_outcome_advantage(rewards, baselines, mask)
    _close(ret, [[1, 1, 1], [2, 2, 0], [3, 0, 2]], EXACT)
    _close(adv, [[0.5, 0.5, 0.5], [-1, -1, 0], [2, 0, 1]], EXACT)
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_remax_outcome_advantage(rewards, baselines[:2], mask)


def test_every_estimator_accepts_the_uniform_keyword_call():
    rewards, mask = _outcome_batch()
    inputs = {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "values": torch.zeros(10, 3),
        "index": GROUP_INDEX,
        "reward_baselines": torch.zeros(10),
        "gamma": 1.0,
        "lam": 1.0,
        "config": OmegaConf.create({"gamma": 1.0, "lam": 1.0}),
    }
    for name in AdvantageEstimator:
        pairs = {"index": np.arange(10) // 2} if name == AdvantageEstimator.GRPO_PASSK else {}  # groups >= 2
        adv, ret = get_adv_estimator_fn(name)(**{**inputs, **pairs})
        assert adv.shape == ret.shape == (10, 3)
    # GRPO through the registry equals the direct call
    _close(
        get_adv_estimator_fn("grpo")(**inputs)[0],
        compute_grpo_outcome_advantage(rewards, mask, GROUP_INDEX)[0],
    )


def test_registries():
    assert get_adv_estimator_fn(AdvantageEstimator.GAE) is compute_gae_advantage_return
    assert get_adv_estimator_fn("rloo") is compute_rloo_outcome_advantage
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    assert get_policy_loss_fn("gspo") is compute_policy_loss_gspo
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        get_adv_estimator_fn("nope")
    with pytest.raises(ValueError, match="unsupported policy loss 'nope'"):
        get_policy_loss_fn("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("gae")(lambda **kw: None)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda **kw: None)
    register_adv_est("gae")(compute_gae_advantage_return)  # the same function again is fine

    def my_est(**kwargs):
        return kwargs["token_level_rewards"], kwargs["token_level_rewards"]

    try:
        register_adv_est("test_only_estimator")(my_est)
        assert get_adv_estimator_fn("test_only_estimator") is my_est
    finally:
        ca.ADV_ESTIMATOR_REGISTRY.pop("test_only_estimator", None)
