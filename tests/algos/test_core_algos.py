"""core_algos against hand-computed numbers: estimators, losses, aggregation, KL, controllers, registries.

Expected values are worked out by hand in the comments (binary fractions where possible, so many checks are
exact); whitening is recomputed in plain Python from the hand-computed raw values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlflow.protocol import DataProto
from rlflow.trainer.ppo import core_algos as ca
from rlflow.trainer.ppo.core_algos import (
    AGG_LOSS_MODES,
    AdaptiveKLController,
    AdvantageEstimator,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    compute_entropy_loss,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_kl_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rollout_is_weights,
    compute_value_loss,
    get_adv_estimator_fn,
    get_kl_controller,
    get_policy_loss_fn,
    kl_penalty,
    register_adv_est,
    register_policy_loss,
)

TOL = {"rtol": 1e-6, "atol": 1e-6}
EXACT = {"rtol": 0.0, "atol": 0.0}


def _close(actual, expected, tol=TOL):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **tol)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


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
        adv, ret = get_adv_estimator_fn(name)(**inputs)
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


# -------------------------------------------------------------------------------------------- agg_loss

LOSS = _t([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
LOSS_MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])  # the last row is not a sequence


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, 29 / 6),  # (1 + 2 + 5 + 6 + 7 + 8) / 6
        ("seq-mean-token-sum", {}, (3 + 26) / 2),
        ("seq-mean-token-mean", {}, (1.5 + 6.5) / 2),
        ("seq-mean-token-sum-norm", {}, (3 / 4 + 26 / 4) / 2),  # default scale: response_len 4
        ("seq-mean-token-sum-norm", {"loss_scale_factor": 2}, (3 / 2 + 26 / 2) / 2),
        ("token-mean", {"global_token_num": 10, "dp_size": 2}, 29 / 10 * 2),
        ("token-mean", {"global_token_num": torch.tensor(58)}, 29 / 58),
        ("seq-mean-token-sum", {"global_seq_num": 5, "dp_size": 2}, 29 / 5 * 2),
        ("seq-mean-token-mean", {"global_seq_num": 4, "dp_size": 4}, 8 / 4 * 4),
        (
            "seq-mean-token-sum-norm",
            {"global_seq_num": 4, "dp_size": 2, "loss_scale_factor": 8},
            29 / 8 / 4 * 2,
        ),
        # the count a mode does not use is ignored
        ("token-mean", {"global_seq_num": 999}, 29 / 6),
        ("seq-mean-token-sum", {"global_token_num": 999}, 29 / 2),
    ],
)
def test_agg_loss_modes_by_hand(mode, kwargs, expected):
    _close(agg_loss(LOSS, LOSS_MASK, mode, **kwargs), expected)


def test_agg_loss_empty_mask_is_zero_with_zero_gradient():
    loss = LOSS.clone().requires_grad_(True)
    for mode in AGG_LOSS_MODES:
        out = agg_loss(loss, torch.zeros_like(LOSS_MASK), mode)
        _close(out.detach(), 0.0, EXACT)
        out.backward()
        _close(loss.grad, torch.zeros_like(LOSS), EXACT)


def test_agg_loss_errors():
    with pytest.raises(ValueError, match="invalid loss_agg_mode 'mean'"):
        agg_loss(LOSS, LOSS_MASK, "mean")
    with pytest.raises(ValueError, match="differ"):
        agg_loss(LOSS, LOSS_MASK[:, :3], "token-mean")
    with pytest.raises(ValueError, match="needs global_token_num"):
        agg_loss(LOSS, LOSS_MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="needs global_seq_num"):
        agg_loss(LOSS, LOSS_MASK, "seq-mean-token-mean", global_token_num=6, dp_size=2)
    with pytest.raises(ValueError, match="dp_size"):
        agg_loss(LOSS, LOSS_MASK, "token-mean", dp_size=0)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", loss_scale_factor=0)


@pytest.mark.parametrize("mode", AGG_LOSS_MODES)
def test_agg_loss_global_counts_make_micro_batch_and_rank_splits_exact(mode):
    """Sum over a rank's micro-batches, then average over 2 ranks == the whole mini-batch (value and grad)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 1, 0, 3, 5, 2, 6, 4, 0, 2])  # two empty rows (e.g. padding)
    bs, width = len(lengths), 6
    feats = torch.randn(bs, width, 3, generator=g)
    mask = (torch.arange(width) < lengths[:, None]).long()
    theta0 = torch.randn(3, generator=g)

    def loss_mat(theta, rows, cols):
        return (feats[rows, :cols] @ theta) ** 2 + feats[rows, :cols, 0]

    theta = theta0.clone().requires_grad_(True)
    full = agg_loss(loss_mat(theta, slice(None), width), mask, mode, loss_scale_factor=6)
    full.backward()
    full_grad = theta.grad.clone()

    counts = {"global_token_num": int(mask.sum()), "global_seq_num": int((mask.sum(-1) > 0).sum())}
    # uneven micro-batches on 2 uneven ranks; each micro-batch trimmed to its own longest response
    ranks = [[slice(0, 1), slice(1, 5)], [slice(5, 6), slice(6, 9), slice(9, 10)]]
    rank_losses, rank_grads = [], []
    for micro_batches in ranks:
        theta = theta0.clone().requires_grad_(True)
        total = torch.zeros(())
        for rows in micro_batches:
            cols = max(int(lengths[rows].max()), 1)
            micro = agg_loss(
                loss_mat(theta, rows, cols), mask[rows, :cols], mode, **counts, dp_size=2, loss_scale_factor=6
            )
            micro.backward()  # gradients accumulate over micro-batches
            total = total + micro.detach()
        rank_losses.append(total)
        rank_grads.append(theta.grad.clone())
    torch.testing.assert_close(
        sum(rank_losses) / 2, full.detach(), **TOL
    )  # what FSDP's all-reduce mean gives
    torch.testing.assert_close(sum(rank_grads) / 2, full_grad, **TOL)

    if (
        mode == "token-mean"
    ):  # the naive per-micro-batch mean is not split invariant (the test is not vacuous)
        naive = [agg_loss(loss_mat(theta0, rows, width), mask[rows], mode) for r in ranks for rows in r]
        assert abs(float(sum(naive).detach()) / len(naive) - float(full.detach())) > 1e-2


# --------------------------------------------------------------------------------------- policy losses


def _actor(**kw) -> SimpleNamespace:
    """An actor config with the clip keys the policy losses read (attribute access, like the schema's)."""
    return SimpleNamespace(
        **{"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": 3.0, **kw}
    )


CLIP_CFG = _actor(clip_ratio_low=0.2, clip_ratio_high=0.28)
# (advantage, ratio) per token; row 1 ends with two masked tokens (ratio 100 must be ignored)
PG_ADV = _t([[1.0, 2.0, -1.0, -1.0], [1.0, -1.0, 5.0, 5.0]])
PG_RATIO = _t([[1.1, 1.5, 0.5, 4.0], [0.5, 2.0, 100.0, 100.0]])
PG_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
# per-token losses: unclipped -1.1; clipped high -2 * 1.28 = -2.56; clipped low -(-1) * 0.8 = 0.8;
# dual clip min(4, 3) = 3; positive A below the range -0.5 (not clipped); negative A, ratio 2: 2 (< 3)
PG_TOKEN_LOSS = [[-1.1, -2.56, 0.8, 3.0], [-0.5, 2.0, 0.0, 0.0]]
# d loss / d log_prob = -A * ratio where the unclipped branch is active, 0 where clipped
PG_TOKEN_GRAD = [[-1.1, 0.0, 0.0, 0.0], [-0.5, 2.0, 0.0, 0.0]]


def _pg_inputs():
    old = torch.full((2, 4), -1.0)
    log_prob = (old + PG_RATIO.log()).requires_grad_(True)
    return old, log_prob


def test_vanilla_ppo_unclipped_clipped_high_low_and_dual_clip():
    old, log_prob = _pg_inputs()
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_vanilla(
        old, log_prob, PG_ADV, PG_MASK, "token-mean", CLIP_CFG
    )
    _close(loss.detach(), sum(map(sum, PG_TOKEN_LOSS)) / 6)  # 1.64 / 6
    _close(clipfrac, 2 / 6)  # clipped high and clipped low; the dual-clipped token is not "clipped"
    _close(clipfrac_lower, 1 / 6)
    _close(ppo_kl, -math.log(1.1 * 1.5 * 0.5 * 4.0 * 0.5 * 2.0) / 6)
    loss.backward()
    _close(log_prob.grad, [[v / 6 for v in row] for row in PG_TOKEN_GRAD])


def test_vanilla_ppo_aggregation_globals_and_is_weights_pass_through():
    old, log_prob = _pg_inputs()
    loss, *_ = compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, "seq-mean-token-mean", CLIP_CFG)
    _close(loss, ((-1.1 - 2.56 + 0.8 + 3.0) / 4 + (-0.5 + 2.0) / 2) / 2)
    loss, *_ = compute_policy_loss_vanilla(
        old, log_prob, PG_ADV, PG_MASK, "token-mean", CLIP_CFG, global_token_num=12, dp_size=3
    )
    _close(loss, 1.64 / 12 * 3)
    weights = _t([[2, 0, 1, 1], [0.5, 1, 7, 7]])
    loss, *_ = compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, "token-mean", CLIP_CFG, weights)
    _close(loss, (-2.2 + 0.8 + 3.0 - 0.25 + 2.0) / 6)
    with pytest.raises(ValueError, match="rollout_is_weights has shape"):
        compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, "token-mean", CLIP_CFG, weights[:, :2])


def test_vanilla_symmetric_clip_and_config_errors_and_legacy_signature():
    old, log_prob = _pg_inputs()
    sym = compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, config=_actor())
    # token 2 is now clipped at 1.2: -2.4 instead of -2.56
    _close(sym[0], (1.64 + 0.16) / 6)
    legacy = compute_policy_loss(old, log_prob, PG_ADV, PG_MASK, cliprange=0.2, cliprange_high=0.28)
    for a, b in zip(
        legacy, compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, "token-mean", CLIP_CFG)
    ):
        _close(a, b, EXACT)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, config=_actor(clip_ratio_c=1.0))
    with pytest.raises(ValueError, match=r"needs actor\.clip_ratio"):
        compute_policy_loss_vanilla(old, log_prob, PG_ADV, PG_MASK, config=_actor(clip_ratio=None))


def test_rollout_is_weights_truncated():
    old = _t([[-1.0, -1.0, -1.0, -1.0]])
    rollout = _t([[-1.5, -0.5, -30.0, -1.0]])
    w = compute_rollout_is_weights(old, rollout, torch.tensor([[1, 1, 1, 0]]), imp_ratio_cap=2.0)
    _close(w, [[math.exp(0.5), math.exp(-0.5), 2.0, 0.0]])
    with pytest.raises(ValueError, match="imp_ratio_cap"):
        compute_rollout_is_weights(old, rollout, torch.ones(1, 4), imp_ratio_cap=0)


def test_gspo_sequence_ratio_value_and_gradient():
    # per-token log ratios; the third column is masked (values 7 / 9 / 9 must be ignored)
    log_ratio = _t([[0.1, 0.3, 7.0], [0.5, 0.1, 9.0], [-0.5, -0.3, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0]])
    adv = _t([[1, 1, 1], [1, 1, 1], [-1, -1, -1]])
    old = torch.full((3, 3), -2.0)
    log_prob = (old + log_ratio).requires_grad_(True)
    loss, clipfrac, ppo_kl, lower = compute_policy_loss_gspo(old, log_prob, adv, mask, config=CLIP_CFG)
    # sequence ratios e^0.2 (inside [0.8, 1.28]), e^0.3 = 1.3499 (clipped to 1.28), e^-0.4 = 0.670 (clipped
    # to 0.8, the loss -A * 0.8 = 0.8 is the max); seq-mean-token-mean over 3 sequences
    _close(loss.detach(), (-math.exp(0.2) - 1.28 + 0.8) / 3)
    _close(clipfrac, 4 / 6)
    _close(ppo_kl, -(0.1 + 0.3 + 0.5 + 0.1 - 0.5 - 0.3) / 6)
    _close(lower, 0.0, EXACT)
    loss.backward()
    # GSPO-token: d ratio / d log_prob_t = s_i; row 0 per token -A * s / (2 tokens * 3 seqs)
    g0 = -math.exp(0.2) / 6
    _close(log_prob.grad, [[g0, g0, 0], [0, 0, 0], [0, 0, 0]])
    tok, *_ = compute_policy_loss_gspo(old, log_prob, adv, mask, "token-mean", CLIP_CFG)
    _close(tok, (-2 * math.exp(0.2) - 2 * 1.28 + 2 * 0.8) / 6)


# ------------------------------------------------------------------------------------------ value loss

# tokens: (value, vpred, return); c = 0.5
# t1 (1, 1.2, 2): within the clip range, 0.64; t2 (0, 2, 1): unclipped 1 > clipped (0.5 - 1)^2 = .25 -> 1;
# t3 (0, 2, 3): clipped (0.5 - 3)^2 = 6.25 > 1 -> 6.25 (clipfrac); last token masked
VF_VALUES = _t([[1.0, 0.0], [0.0, 50.0]])
VF_RETURNS = _t([[2.0, 1.0], [3.0, -50.0]])
VF_MASK = torch.tensor([[1, 1], [1, 0]])


def _vpreds():
    return _t([[1.2, 2.0], [2.0, 0.0]]).requires_grad_(True)


def test_value_loss_clipped():
    vpreds = _vpreds()
    loss, clipfrac = compute_value_loss(vpreds, VF_RETURNS, VF_VALUES, VF_MASK, 0.5)
    _close(loss.detach(), 0.5 * (0.64 + 1 + 6.25) / 3)
    _close(clipfrac, 1 / 3)
    loss.backward()
    # 0.5 * 2 (vpred - ret) / 3 on the unclipped branch; the clipped branch has no gradient
    _close(vpreds.grad, [[-0.8 / 3, 1 / 3], [0.0, 0.0]])
    seq, _ = compute_value_loss(_vpreds(), VF_RETURNS, VF_VALUES, VF_MASK, 0.5, "seq-mean-token-mean")
    _close(seq, 0.5 * ((0.64 + 1) / 2 + 6.25) / 2)
    glob, _ = compute_value_loss(
        _vpreds(), VF_RETURNS, VF_VALUES, VF_MASK, 0.5, global_token_num=10, dp_size=2
    )
    _close(glob, 0.5 * 7.89 / 10 * 2)


@pytest.mark.parametrize("cliprange_value", [None, 10.0])
def test_value_loss_unclipped(cliprange_value):
    vpreds = _vpreds()
    loss, clipfrac = compute_value_loss(vpreds, VF_RETURNS, VF_VALUES, VF_MASK, cliprange_value)
    _close(loss.detach(), 0.5 * (0.64 + 1 + 1) / 3)
    _close(clipfrac, 0.0, EXACT)
    loss.backward()
    _close(vpreds.grad, [[-0.8 / 3, 1 / 3], [-1 / 3, 0.0]])


def test_value_loss_bad_cliprange():
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(_vpreds(), VF_RETURNS, VF_VALUES, VF_MASK, 0.0)


def test_entropy_loss():
    logits = torch.zeros(2, 2, 4)
    logits[1, 0] = torch.tensor([0.0, math.log(3.0), float("-inf"), float("-inf")])  # p = (1/4, 3/4)
    h2 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    mask = torch.tensor([[1, 1], [1, 0]])
    _close(compute_entropy_loss(logits, mask), (2 * math.log(4) + h2) / 3)
    _close(
        compute_entropy_loss(logits, mask, "seq-mean-token-sum", global_seq_num=4), (2 * math.log(4) + h2) / 4
    )


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
