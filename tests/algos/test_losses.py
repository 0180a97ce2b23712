"""core_algos' losses against hand-computed numbers: agg_loss modes, policy losses, value and entropy losses.

Expected values are worked out by hand in the comments (binary fractions where possible, so many checks are
exact).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlflow.trainer.ppo.core_algos import (
    AGG_LOSS_MODES,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_rollout_is_weights,
    compute_value_loss,
)
from tests.algos.hand_values import EXACT, TOL, _close, _t

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
