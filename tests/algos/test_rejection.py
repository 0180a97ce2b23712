"""verl's current rejection options (`rlflow.algos.rejection`) against hand-computed statistics."""

from __future__ import annotations

import math
import re

import pytest
import torch

from rlflow.algos.rejection import RejectionRule, parse_rejection, reject
from rlflow.algos.rollout_correction import compute_rollout_correction


def _batch(log_ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of per-token log-ratios (nan = padding) -> (old, rollout, mask) with rollout log-probs of -1."""
    lr = torch.tensor(log_ratios, dtype=torch.float64)
    mask = (~lr.isnan()).to(torch.float64)
    rollout = torch.full_like(lr, -1.0)
    old = torch.where(mask.bool(), rollout + lr.nan_to_num(0.0), torch.zeros_like(lr))
    return old, rollout, mask


def test_k1_bounds_are_on_the_ratio_old_over_rollout():
    old, rollout, mask = _batch([[math.log(0.5), math.log(0.7), math.log(1.5), math.log(1.7)]])
    keep, metrics = reject(old, rollout, mask, parse_rejection("token_k1", "0.6_1.6"))
    assert keep.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_rs_token_k1_min"] == pytest.approx(math.log(0.5))
    keep, _ = reject(old, rollout, mask, parse_rejection("token_k1", 1.6))  # one number: [1/1.6, 1.6]
    assert keep.tolist() == [[0.0, 1.0, 1.0, 0.0]]


def test_sequence_k1_bounds_the_product_and_the_geometric_mean():
    rows = [[math.log(1.5), math.log(1.5), float("nan")], [math.log(1.2), math.log(1.2), math.log(1.2)]]
    old, rollout, mask = _batch(rows)
    # products 2.25 and 1.728; geometric means 1.5 and 1.2
    keep, metrics = reject(old, rollout, mask, parse_rejection("seq_sum_k1", "0.5_2.0"))
    assert keep.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert metrics["rollout_corr/rollout_rs_seq_sum_k1_seq_masked_fraction"] == 0.5
    assert metrics["rollout_corr/rollout_rs_seq_sum_k1_max"] == pytest.approx(math.log(2.25))
    keep, _ = reject(old, rollout, mask, parse_rejection("seq_mean_k1", "0.8_1.4"))
    assert keep.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    keep, _ = reject(old, rollout, mask, parse_rejection("seq_mean_k1", "0.8_1.6"))
    assert keep.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]  # padding stays 0


def test_k2_and_k3_statistics_and_their_aggregations():
    x = [0.1, -0.2, 0.3]
    old, rollout, mask = _batch([x, [0.05, float("nan"), float("nan")]])
    k2 = [0.5 * v * v for v in x]  # 0.005, 0.02, 0.045
    k3 = [math.exp(v) - 1 - v for v in x]  # 0.00517, 0.01873, 0.04986
    keep, m = reject(old, rollout, mask, parse_rejection("token_k2", 0.03))
    assert keep.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert m["rollout_corr/rollout_rs_token_k2_max"] == pytest.approx(max(k2))
    keep, m = reject(old, rollout, mask, parse_rejection("seq_max_k3", 0.04))
    assert keep.tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert m["rollout_corr/rollout_rs_seq_max_k3_max"] == pytest.approx(max(k3))
    assert m["rollout_corr/rollout_rs_seq_max_k3_min"] == pytest.approx(math.exp(0.05) - 1.05)
    keep, m = reject(old, rollout, mask, parse_rejection("seq_sum_k3", 0.07))
    assert sum(k3) == pytest.approx(0.07376, abs=1e-5) and keep[0].sum() == 0 and keep[1, 0] == 1
    keep, m = reject(old, rollout, mask, parse_rejection("seq_mean_k2", 0.0234))
    assert sum(k2) / 3 == pytest.approx(0.023333, abs=1e-6) and keep[0].tolist() == [1.0, 1.0, 1.0]


def test_binary_kl_is_the_larger_bernoulli_kl_of_the_sampled_token():
    old = torch.tensor([[math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    rollout = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    mask = torch.ones_like(old)
    forward = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # KL(p_old || p_rollout)
    backward = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    keep, m = reject(old, rollout, mask, parse_rejection("binary_kl", 0.14))
    assert max(forward, backward) == pytest.approx(0.14384, abs=1e-5)
    assert m["rollout_corr/rollout_rs_binary_kl_max"] == pytest.approx(max(forward, backward))
    assert keep.tolist() == [[0.0, 1.0]]


def test_options_combine_and_each_keeps_its_threshold():
    old, rollout, mask = _batch([[math.log(1.7), 0.0], [0.3, 0.0], [0.0, 0.01]])
    rules = parse_rejection("token_k1,seq_max_k2", "0.5_1.6,0.01")
    assert rules == [RejectionRule("token_k1", 0.5, 1.6), RejectionRule("seq_max_k2", None, 0.01)]
    keep, m = reject(old, rollout, mask, rules)
    # row 0: token 0's ratio 1.7 > 1.6, and its k2 0.14 > 0.01 drops the row; row 1: k2 0.045 drops it
    assert keep.tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(1 / 6)
    assert m["rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("legacy", "option", "lower", "upper"),
    [
        ("token", "token_k1", 0.7, 1.3),
        ("sequence", "seq_sum_k1", 0.7, 1.3),
        ("geometric", "seq_mean_k1", 0.95, 1.05),
    ],
)
def test_k1_options_reject_what_the_earlier_levels_reject(
    legacy: str, option: str, lower: float, upper: float
):
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(16, 12, generator=g, dtype=torch.float64) * 3
    old = rollout + torch.randn(16, 12, generator=g, dtype=torch.float64) * 0.3
    mask = (torch.arange(12) < torch.randint(3, 13, (16, 1), generator=g)).to(torch.float64)
    before = compute_rollout_correction(
        old, rollout, mask, rollout_rs=legacy, rollout_rs_threshold=upper, rollout_rs_threshold_lower=lower
    )
    after = compute_rollout_correction(
        old, rollout, mask, rollout_rs=option, rollout_rs_threshold=f"{lower}_{upper}"
    )
    assert 0 < after.keep_mask.sum() < mask.sum()  # the bounds bite
    assert torch.equal(before.keep_mask, after.keep_mask)
    assert after.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
        before.metrics["rollout_corr/rollout_rs_masked_fraction"]
    )


@pytest.mark.parametrize(
    ("rollout_rs", "threshold", "message"),
    [
        ("token_k1", None, "needs a threshold"),
        ("token_k1", "2.0_0.5", "bounds [2.0, 0.5] are reversed"),
        ("token_k1", 0.52, "are reversed"),  # what Hydra makes of 0.5_2
        ("token_k2", "0.5_2.0", "takes one upper bound"),
        ("token_k1,token_k2", "0.5_2.0,0.1,0.2", "one threshold for all"),
        ("token_k3", "-1", "must be a number > 0"),
        ("token_k3", "abc", "'abc' (for token_k3) is not a number"),
        ("token_k4", 1.0, "['token_k4'] not among verl's rejection options"),
    ],
)
def test_bad_options_and_thresholds_are_refused(rollout_rs: str, threshold, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_rejection(rollout_rs, threshold)
