"""SAPO's gated loss and CISPO's clipped-weight REINFORCE (`rlflow.algos.pg_variants`) against
hand-computed values and gradients, and, through the trainer, their first update against PPO's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlflow.algos.losses import get_policy_loss_fn
from rlflow.algos.pg_variants import compute_policy_loss_cispo, compute_policy_loss_sapo

CFG = SimpleNamespace(
    clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05
)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_gate_value_and_gradient():
    # one row, two tokens at ratio 1.2: A = +1 (tau 1) and A = -1 (tau 1.05)
    log_prob = torch.full((1, 2), math.log(1.2), dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_sapo(
        old, log_prob, adv, mask, "token-mean", CFG
    )
    pos = -4.0 * _sigmoid(0.2)  # -f(1.2, 1) * 1
    neg = 4.0 / 1.05 * _sigmoid(1.05 * 0.2)  # -f(1.2, 1.05) * (-1)
    assert loss.item() == pytest.approx((pos + neg) / 2, abs=1e-12)
    assert clipfrac.item() == 0.0 and clipfrac_lower.item() == 0.0
    assert ppo_kl.item() == pytest.approx(-math.log(1.2), abs=1e-12)
    loss.backward()
    # dL/dlog_prob = -A * f'(r) * r / 2 tokens, f'(r) = 4 sigma(tau (r - 1)) (1 - sigma(tau (r - 1)))
    slope = [4 * _sigmoid(t * 0.2) * (1 - _sigmoid(t * 0.2)) for t in (1.0, 1.05)]
    want = [-1.0 * slope[0] * 1.2 / 2, 1.0 * slope[1] * 1.2 / 2]
    torch.testing.assert_close(log_prob.grad, torch.tensor([want], dtype=torch.float64), rtol=0, atol=1e-12)


def test_sapo_at_ratio_one_has_ppos_gradient():
    log_prob = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[0.5, 0.5, 0.5], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    loss, *_ = compute_policy_loss_sapo(torch.zeros(2, 3), log_prob, adv, torch.ones(2, 3), "token-mean", CFG)
    loss.backward()
    # f'(1) = 1 whatever tau: the gradient of -A * r at r = 1, over 6 tokens
    torch.testing.assert_close(log_prob.grad, -adv / 6, rtol=0, atol=1e-12)


def test_cispo_weights_are_clipped_and_detached():
    # ratios 1.5, 0.5, 1.1 with clip 0.2: weights 1.2, 0.8, 1.1
    ratios = [1.5, 0.5, 1.1]
    log_prob = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_cispo(
        torch.zeros(1, 3), log_prob, adv, torch.ones(1, 3), "token-mean", CFG
    )
    weights = [1.2, 0.8, 1.1]
    want = sum(-w * a * math.log(r) for w, a, r in zip(weights, [1.0, -1.0, 2.0], ratios)) / 3
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert clipfrac.item() == pytest.approx(2 / 3) and clipfrac_lower.item() == pytest.approx(1 / 3)
    assert ppo_kl.item() == pytest.approx(-sum(math.log(r) for r in ratios) / 3, abs=1e-12)
    loss.backward()  # the weight carries no gradient: dL/dlog_prob = -w * A / 3
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[-1.2 / 3, 0.8 / 3, -2.2 / 3]], dtype=torch.float64), rtol=0, atol=1e-12
    )


def test_registered_under_verls_names():
    assert get_policy_loss_fn("sapo") is compute_policy_loss_sapo
    assert get_policy_loss_fn("cispo") is compute_policy_loss_cispo


def test_sapo_temperatures_are_checked_before_ray_starts(caplog):
    from rlflow.trainer.check_config import check_config

    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.tau_neg=0\.0 must be > 0"):
        check_config(
            ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_neg=0"],
            "demo",
        )
    with caplog.at_level("WARNING"):
        check_config(["actor_rollout_ref.actor.policy_loss.loss_mode=sapo"], "demo")
    assert "verl always aggregates sapo as seq-mean-token-mean" in caplog.text


def test_cispo_may_leave_its_weight_without_a_lower_bound():
    from rlflow.trainer.check_config import check_config

    low = ["actor_rollout_ref.actor.clip_ratio_low=10", "actor_rollout_ref.actor.clip_ratio_high=0.28"]
    check_config([*low, "actor_rollout_ref.actor.policy_loss.loss_mode=cispo"], "demo")
    with pytest.raises(ValueError, match=r"clip_ratio_low=10\.0 must be < 1"):
        check_config(low, "demo")  # PPO's clip at 1 - 10 would be no clip
    log_prob = torch.log(torch.tensor([[0.01, 2.0]], dtype=torch.float64))
    cfg = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=10.0, clip_ratio_high=0.28)
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, clipfrac, _, lower = compute_policy_loss_cispo(
        torch.zeros(1, 2), log_prob, adv, torch.ones(1, 2), "token-mean", cfg
    )
    # weights 0.01 (no lower bound) and 1.28
    assert loss.item() == pytest.approx(-(0.01 * math.log(0.01) + 1.28 * math.log(2.0)) / 2, abs=1e-12)
    assert clipfrac.item() == 0.5 and lower.item() == 0.0


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_first_update_has_ppos_gradient(tmp_path):
    """At the first mini-batch of a run every ratio is 1 (the old log-probs are the policy's own): SAPO's
    gate and CISPO's weight both have PPO's gradient there, so the first update's gradient norm is PPO's
    (the rollout's log-probs stand for the old ones to float rounding: rel 1e-4)."""
    from rlflow.config import load_config
    from rlflow.trainer.main_ppo import run_ppo

    norms = {}
    for mode in ("vanilla", "sapo", "cispo"):
        result = run_ppo(
            load_config(
                [
                    "algorithm.adv_estimator=grpo",
                    "actor_rollout_ref.rollout.n=4",
                    "data.train_batch_size=4",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                    f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}",
                    "trainer.total_training_steps=1",
                    "trainer.test_freq=-1",
                    "trainer.val_before_train=false",
                    "trainer.logger=[jsonl]",
                    f"trainer.log_dir={tmp_path / mode / 'logs'}",
                    f"trainer.default_local_dir={tmp_path / mode / 'ckpt'}",
                ],
                "demo",
            )
        )
        (h,) = [h for h in result["history"] if h["step"] == 1]
        norms[mode] = h["actor/grad_norm"]
    assert norms["vanilla"] > 1e-3
    assert norms["sapo"] == pytest.approx(norms["vanilla"], rel=1e-4)
    assert norms["cispo"] == pytest.approx(norms["vanilla"], rel=1e-4)
