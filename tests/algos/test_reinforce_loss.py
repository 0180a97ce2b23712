"""`compute_policy_loss_reinforce` (``rollout_correction.use_policy_gradient``) against hand-computed values.

Two responses, 3 and 2 tokens, with chosen log-ratios ``r = log pi - log pi_rollout``:
row 0 ``(0, 0.4, -0.9)``, row 1 ``(1.2, -0.2)``. The loss is ``-A * log pi * w`` on the kept tokens,
divided by the mini-batch's 5 response tokens (the global count), so its gradient with respect to
``log pi`` is ``-A * w * keep / 5``.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.algos.reinforce_loss import compute_policy_loss_reinforce

R = [[0.0, 0.4, -0.9], [1.2, -0.2, 0.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0]])
A = torch.tensor([[1.0, -1.0, 2.0], [0.5, 2.0, 0.0]])
NORM = {"global_token_num": 5, "global_seq_num": 2, "dp_size": 1, "loss_scale_factor": 3}


def _inputs():
    log_prob = LP.clone().requires_grad_(True)
    rollout = (LP - torch.tensor(R)) * MASK
    return log_prob, rollout


def _grad(**kwargs) -> tuple[float, torch.Tensor, dict]:
    log_prob, rollout = _inputs()
    loss, metrics = compute_policy_loss_reinforce(rollout, log_prob, A, MASK, "token-mean", **kwargs, **NORM)
    loss.backward()
    return float(loss.detach()), log_prob.grad, metrics


def test_token_weights_truncated_and_token_rejection():
    loss, grad, metrics = _grad(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token")
    ratio = [[math.exp(x) for x in row] for row in R]
    w = [[min(x, 2.0) for x in row] for row in ratio]
    # bounds [1/2, 2]: token (0, 2) (ratio 0.41) and token (1, 0) (ratio 3.32) leave the loss
    keep = [[1, 1, 0], [0, 1, 0]]
    expected = sum(
        -float(A[i, j]) * float(LP[i, j]) * w[i][j] * keep[i][j] for i in range(2) for j in range(3)
    )
    assert loss == pytest.approx(expected / 5, rel=1e-6)
    want = torch.tensor([[-float(A[i, j]) * w[i][j] * keep[i][j] / 5 for j in range(3)] for i in range(2)])
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-7)
    assert metrics["actor/ppo_kl"] == pytest.approx((-(0.0 + 0.4 - 0.2) / 3, 3.0), rel=1e-6)
    assert metrics["rollout_corr/kl"] == pytest.approx((-(0.0 + 0.4 - 0.9 + 1.2 - 0.2) / 5, 5.0), rel=1e-6)
    raw = [ratio[0][0], ratio[0][1], ratio[0][2], ratio[1][0], ratio[1][1]]
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((sum(raw) / 5, 5.0), rel=1e-6)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx((2 / 5, 5.0))
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx((1.0, 2.0))
    assert "rollout_corr/rollout_is_max" not in metrics  # a max of micro-batches is not their weighted mean


def test_sequence_weights_and_the_veto():
    loss, grad, metrics = _grad(
        rollout_is="sequence", rollout_is_threshold=2.0, rollout_token_veto_threshold=0.45
    )
    # the veto drops row 0 (its token ratio exp(-0.9) = 0.41 < 0.45); row 1's weight exp(1.0) -> 2.0
    w1 = min(math.exp(1.2 - 0.2), 2.0)
    want = torch.zeros(2, 3)
    want[1, :2] = -A[1, :2] * w1 / 5
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-7)
    assert loss == pytest.approx(-(0.5 * -1.5 + 2.0 * -1.0) * w1 / 5, rel=1e-6)
    assert metrics["rollout_corr/rollout_is_veto_fraction"] == pytest.approx((0.5, 2.0))
    seq_weights = [math.exp(0.4 - 0.9), math.exp(1.0)]
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((sum(seq_weights) / 2, 2.0), rel=1e-6)


def test_without_weights_it_is_plain_reinforce():
    loss, grad, metrics = _grad()
    torch.testing.assert_close(grad, -A * MASK / 5)
    assert loss == pytest.approx(float((-A * LP * MASK).sum()) / 5, rel=1e-6)
    assert set(metrics) == {"actor/ppo_kl", "rollout_corr/kl", "rollout_corr/log_ppl_diff"}


def test_micro_batches_add_up_to_the_whole_batch():
    """Per-row calls with the mini-batch's counts sum to the whole call; weighted metrics recombine."""
    kwargs = {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "geometric"}
    log_prob, rollout = _inputs()
    whole, whole_metrics = compute_policy_loss_reinforce(rollout, log_prob, A, MASK, **kwargs, **NORM)
    parts = [
        compute_policy_loss_reinforce(
            rollout[i : i + 1], log_prob[i : i + 1], A[i : i + 1], MASK[i : i + 1], **kwargs, **NORM
        )
        for i in range(2)
    ]
    assert float(sum(p[0].detach() for p in parts)) == pytest.approx(float(whole.detach()), rel=1e-6)
    for key, (value, weight) in whole_metrics.items():
        total = sum(p[1][key][1] for p in parts)
        assert total == weight, key
        combined = sum(p[1][key][0] * p[1][key][1] for p in parts) / max(total, 1.0)
        assert combined == pytest.approx(value, rel=1e-6, abs=1e-9), key
