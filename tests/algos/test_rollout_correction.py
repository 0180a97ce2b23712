"""`compute_rollout_correction` against weights, masks and metrics computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.algos.rollout_correction import compute_rollout_correction

# Two responses of 3 and 2 tokens (one padding column in the second). Per-token log-ratios
# log pi_old - log pi_rollout: row 0 = ln 2, 0, ln 0.5 (product 1, geometric mean 1);
# row 1 = ln 3, ln 1.2 (product 3.6, geometric mean sqrt(3.6)).
LN = math.log
RATIOS = [[2.0, 1.0, 0.5], [3.0, 1.2, 7.0]]  # 7.0 sits on padding: never read
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)


def _inputs():
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, -0.7]], dtype=torch.float64)
    old = rollout + torch.tensor([[LN(r) for r in row] for row in RATIOS], dtype=torch.float64)
    return old, rollout, MASK


def test_token_weights_truncated_and_zero_on_padding():
    out = compute_rollout_correction(*_inputs(), rollout_is="token", rollout_is_threshold=2.5)
    expected = torch.tensor([[2.0, 1.0, 0.5], [2.5, 1.2, 0.0]])
    torch.testing.assert_close(out.weights.float(), expected, rtol=1e-6, atol=1e-7)
    m = out.metrics
    raw = [2.0, 1.0, 0.5, 3.0, 1.2]  # before truncation
    mean = sum(raw) / 5
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(mean)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in raw) / 5))
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(3.0)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # 3.0 > 2.5
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(0.0)  # none < 0.4
    trunc = [2.0, 1.0, 0.5, 2.5, 1.2]
    tm = sum(trunc) / 5
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(
        1 / (sum((x / tm) ** 2 for x in trunc) / 5)
    )
    # KL(rollout || old) by k1 = mean of -log_ratio over the 5 tokens; log ppl diff = mean of per-row means
    assert m["rollout_corr/kl"] == pytest.approx(-(LN(2) + LN(0.5) + LN(3) + LN(1.2)) / 5)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx((0.0 + (LN(3) + LN(1.2)) / 2) / 2)
    assert out.keep_mask is None


def test_sequence_weights_and_batch_normalisation():
    out = compute_rollout_correction(*_inputs(), rollout_is="sequence", rollout_is_threshold=3.0)
    torch.testing.assert_close(
        out.weights.float(), torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 0.0]]), rtol=1e-6, atol=1e-7
    )
    m = out.metrics  # one weight per response: 1 and 3.6 before truncation
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx((1 + 3.6) / 2)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(3.6)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    normed = compute_rollout_correction(
        *_inputs(), rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True
    )
    # normalised over responses (mean of 1 and 3 = 2), not over tokens
    torch.testing.assert_close(
        normed.weights.float(), torch.tensor([[0.5, 0.5, 0.5], [1.5, 1.5, 0.0]]), rtol=1e-6, atol=1e-7
    )
    token = compute_rollout_correction(
        *_inputs(), rollout_is="token", rollout_is_threshold=10.0, rollout_is_batch_normalize=True
    )
    tm = (2.0 + 1.0 + 0.5 + 3.0 + 1.2) / 5
    torch.testing.assert_close(
        token.weights.float(),
        torch.tensor([[2.0, 1.0, 0.5], [3.0, 1.2, 0.0]]) / tm,
        rtol=1e-6,
        atol=1e-7,
    )


@pytest.mark.parametrize(
    ("level", "upper", "lower", "expected"),
    [
        # token: bounds [1/2.5, 2.5] drop row 1's 3.0 only
        ("token", 2.5, None, [[1, 1, 1], [0, 1, 0]]),
        # token, explicit lower 0.6 also drops row 0's 0.5
        ("token", 2.5, 0.6, [[1, 1, 0], [0, 1, 0]]),
        # sequence: products 1 and 3.6 against [1/3, 3]: row 1 leaves
        ("sequence", 3.0, None, [[1, 1, 1], [0, 0, 0]]),
        # geometric: 1 and sqrt(3.6) = 1.897 against [0.5, 2]: both stay; against [0.5, 1.5]: row 1 leaves
        ("geometric", 2.0, None, [[1, 1, 1], [1, 1, 0]]),
        ("geometric", 1.5, 0.5, [[1, 1, 1], [0, 0, 0]]),
    ],
)
def test_rejection_levels(level, upper, lower, expected):
    out = compute_rollout_correction(
        *_inputs(), rollout_rs=level, rollout_rs_threshold=upper, rollout_rs_threshold_lower=lower
    )
    keep = torch.tensor(expected, dtype=torch.float32)
    torch.testing.assert_close(out.keep_mask, keep)
    assert out.weights is None
    dropped = float((MASK - keep).sum())
    assert out.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(dropped / 5)
    rows = sum(1 for r in range(2) if float((MASK[r] - keep[r]).sum()) > 0)
    assert out.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(rows / 2)


def test_rejection_upper_bound_defaults_to_the_is_threshold():
    out = compute_rollout_correction(*_inputs(), rollout_rs="token", rollout_is_threshold=2.5)
    torch.testing.assert_close(out.keep_mask, torch.tensor([[1, 1, 1], [0, 1, 0]], dtype=torch.float32))


def test_veto_drops_a_response_with_one_catastrophic_token():
    old, rollout, mask = _inputs()
    old[1, 1] = rollout[1, 1] + LN(1e-5)  # unclamped ratio 1e-5 < 1e-4
    old[1, 2] = rollout[1, 2] + LN(1e-9)  # on padding: ignored
    out = compute_rollout_correction(old, rollout, mask, rollout_token_veto_threshold=1e-4)
    torch.testing.assert_close(out.keep_mask, torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.float32))
    m = out.metrics
    assert m["rollout_corr/rollout_is_veto_fraction"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_catastrophic_token_fraction"] == pytest.approx(1 / 5)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)


def test_identical_policies_give_unit_weights_and_keep_everything():
    _, rollout, mask = _inputs()
    out = compute_rollout_correction(
        rollout.clone(),
        rollout,
        mask,
        rollout_is="token",
        rollout_rs="geometric",
        rollout_rs_threshold=1.0001,
        rollout_token_veto_threshold=1e-4,
    )
    torch.testing.assert_close(out.weights.float(), mask)
    torch.testing.assert_close(out.keep_mask, mask)
    assert (
        out.metrics["rollout_corr/kl"] == 0.0
        and out.metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    )


def test_bad_levels_and_shapes_are_refused():
    old, rollout, mask = _inputs()
    with pytest.raises(ValueError, match="rollout_is='seq'"):
        compute_rollout_correction(old, rollout, mask, rollout_is="seq")
    with pytest.raises(ValueError, match="rollout_rs='mask'"):
        compute_rollout_correction(old, rollout, mask, rollout_rs="mask")
    with pytest.raises(ValueError, match="shapes differ"):
        compute_rollout_correction(old[:, :2], rollout, mask)
