"""KL-Cov and Clip-Cov (`rlflow.algos.cov_losses`) against hand-computed values, the selection over ranks
against the single-rank selection of the whole batch, and the config keys (verl's names and defaults)."""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.algos.cov_losses import select_cov_tokens, token_covariance, token_keys
from rlflow.algos.losses import get_policy_loss_fn
from rlflow.algos.policy_loss_call import PolicyLossCall
from rlflow.config import config_section, load_config, validate_config
from rlflow.parallel.distributed import spawn_workers

# 5 valid tokens: mean(A) = 0.5, mean(log_prob) = -1.5
ADV = torch.tensor([[1.0, -1.0, 2.0], [0.5, 0.0, 0.0]])
LOGP = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, 0.0]])
OLD = torch.tensor([[-1.1, -2.0, -2.9], [-0.4, -1.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
COV = [[0.5 * 0.5, -1.5 * -0.5, 1.5 * -1.5], [0.0 * 1.0, -0.5 * 0.5, 0.0]]


def _actor(**policy_loss):
    return config_section(
        "actor_rollout_ref.actor",
        clip_ratio=0.2,
        **{f"policy_loss__{k}": v for k, v in policy_loss.items()},
    )


def test_token_covariance_by_hand():
    torch.testing.assert_close(token_covariance(ADV, LOGP, MASK), torch.tensor(COV, dtype=torch.float64))


def test_kl_cov_penalises_the_largest_covariance_by_hand():
    cfg = _actor(loss_mode="kl_cov", kl_cov_ratio=0.3, ppo_kl_coef=0.5)  # k = max(1, int(5 * 0.3)) = 1
    selected = select_cov_tokens("kl_cov", ADV, LOGP, OLD, MASK, cfg)
    assert selected.tolist() == [[False, True, False], [False, False, False]]  # cov 0.75
    log_prob = LOGP.clone().requires_grad_(True)
    loss, frac, ppo_kl, lower = get_policy_loss_fn("kl_cov")(OLD, log_prob, ADV, MASK, "token-mean", cfg)
    # -A * ratio on every token, unclipped; + 0.5 * |d| on token (0, 1) whose d = 0
    terms = [
        -a * math.exp(lp - o)
        for row in range(2)
        for a, lp, o, m in zip(ADV[row].tolist(), LOGP[row].tolist(), OLD[row].tolist(), MASK[row].tolist())
        if m
    ]
    assert float(loss.detach()) == pytest.approx(sum(terms) / 5, rel=1e-6)
    assert float(frac) == pytest.approx(1 / 5)
    assert float(ppo_kl) == pytest.approx((-0.1 + 0.0 + 0.1 + 0.1 + 0.0) / 5, abs=1e-7)
    assert float(lower) == 0.0
    loss.backward()
    # d/dlogp of -A*exp(d): -A*exp(d) / 5; ratio 1.22 > 1 + clip at (0, 0) is not clipped in KL-Cov
    assert float(log_prob.grad[0, 0]) == pytest.approx(-1.0 * math.exp(0.1) / 5, rel=1e-6)


def test_kl_cov_penalty_reaches_the_gradient_of_selected_tokens():
    cfg = _actor(loss_mode="kl_cov", kl_cov_ratio=0.3, ppo_kl_coef=0.5)
    old = OLD.clone()
    old[0, 1] = -2.2  # the selected token now has d = 0.2
    log_prob = LOGP.clone().requires_grad_(True)
    loss, *_ = get_policy_loss_fn("kl_cov")(old, log_prob, ADV, MASK, "token-mean", cfg)
    loss.backward()
    # -A * exp(d) + 0.5 * |d| with A = -1, d = 0.2: gradient (exp(0.2) + 0.5) / 5
    assert float(log_prob.grad[0, 1]) == pytest.approx((math.exp(0.2) + 0.5) / 5, rel=1e-6)


def test_clip_cov_cuts_drawn_candidates_by_hand():
    cfg = _actor(loss_mode="clip_cov", clip_cov_ratio=0.4, clip_cov_lb=-0.5, clip_cov_ub=0.7)
    # candidates: cov in (-0.5, 0.7) and not held by PPO's clip: (0, 0) 0.25 [ratio 1.105, A > 0: free],
    # (1, 0) 0.0, (1, 1) -0.25; (0, 1) 0.75 and (0, 2) -2.25 are outside. k = int(5 * 0.4) = 2 smallest keys.
    keys = torch.tensor([[0.9, 0.0, 0.0], [0.3, 0.5, 0.0]])
    selected = select_cov_tokens("clip_cov", ADV, LOGP, OLD, MASK, cfg, keys=keys)
    assert selected.tolist() == [[False, False, False], [True, True, False]]
    log_prob = LOGP.clone().requires_grad_(True)
    loss, frac, _, _ = get_policy_loss_fn("clip_cov")(
        OLD, log_prob, ADV, MASK, "token-mean", cfg, cov_selected=selected
    )
    kept = [(0, 0), (0, 1), (0, 2)]
    expected = 0.0
    for i, j in kept:
        a, ratio = float(ADV[i, j]), math.exp(float(LOGP[i, j] - OLD[i, j]))
        expected += max(-a * ratio, -a * min(max(ratio, 0.8), 1.2))
    assert float(loss.detach()) == pytest.approx(expected / 5, rel=1e-6)  # the cut tokens stay in the count
    assert float(frac) == pytest.approx(2 / 5)
    loss.backward()
    assert log_prob.grad[1].abs().sum() == 0


def test_clip_cov_skips_tokens_the_ppo_clip_holds():
    cfg = _actor(loss_mode="clip_cov", clip_cov_ratio=1.0, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    old = OLD.clone()
    old[0, 0] = -1.5  # ratio exp(0.5) > 1.2 with A > 0: PPO's clip holds it
    selected = select_cov_tokens("clip_cov", ADV, LOGP, old, MASK, cfg, keys=torch.zeros(2, 3))
    assert selected.tolist() == [[False, True, True], [True, True, False]]


def test_ties_at_the_threshold_are_all_selected():
    cfg = _actor(loss_mode="kl_cov", kl_cov_ratio=0.2)  # k = 1 of 6
    adv = torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 0.0]])
    logp = torch.tensor([[-1.0, -3.0, -2.0], [-1.0, -3.0, -2.0]])  # two identical rows
    selected = select_cov_tokens("kl_cov", adv, logp, logp, torch.ones(2, 3), cfg)
    assert selected.tolist() == [[True, True, False], [True, True, False]]  # four tied at cov 1


def test_token_keys_follow_the_sequence_not_its_place():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 50, (6, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[2, :4] = 0
    keys = token_keys(ids, mask, 5, seed=11)
    order = torch.tensor([4, 2, 0])
    torch.testing.assert_close(token_keys(ids[order], mask[order], 5, seed=11), keys[order], rtol=0, atol=0)
    assert not torch.equal(token_keys(ids, mask, 5, seed=12), keys)
    many = token_keys(torch.randint(1, 50, (400, 12), generator=g), torch.ones(400, 12), 50, seed=0)
    assert float(many.min()) >= 0.0 and float(many.max()) < 1.0
    assert float(many.mean()) == pytest.approx(0.5, abs=0.01)  # 20000 uniforms: sd 0.002


def test_loss_without_selection_selects_over_its_own_tokens():
    cfg = _actor(loss_mode="kl_cov", kl_cov_ratio=0.3, ppo_kl_coef=0.5)
    fn = get_policy_loss_fn("kl_cov")
    own = fn(OLD, LOGP, ADV, MASK, "token-mean", cfg)
    given = fn(
        OLD,
        LOGP,
        ADV,
        MASK,
        "token-mean",
        cfg,
        cov_selected=select_cov_tokens("kl_cov", ADV, LOGP, OLD, MASK, cfg),
    )
    assert [float(x) for x in own] == [float(x) for x in given]


def _two_ranks(rank: int, world: int, mode: str) -> torch.Tensor:
    cfg = _actor(loss_mode=mode, kl_cov_ratio=0.1, clip_cov_ratio=0.1, clip_cov_lb=-0.5, clip_cov_ub=0.5)
    adv, logp, old, mask, ids = _big_batch()
    part = slice(rank * 8, (rank + 1) * 8) if world > 1 else slice(None)
    keys = token_keys(ids[part], torch.ones_like(ids[part]), 10, seed=5) if mode == "clip_cov" else None
    group = torch.distributed.group.WORLD if world > 1 else None
    return select_cov_tokens(mode, adv[part], logp[part], old[part], mask[part], cfg, keys=keys, group=group)


def _big_batch():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(16, 10, generator=g) > 0.3).long()
    adv = torch.randn(16, 10, generator=g) * mask
    logp = -torch.rand(16, 10, generator=g) * 3 * mask
    old = logp + 0.1 * torch.randn(16, 10, generator=g) * mask
    ids = torch.randint(1, 90, (16, 14), generator=g)
    return adv, logp, old, mask, ids


@pytest.mark.parametrize("mode", ["kl_cov", "clip_cov"])
def test_selection_over_two_ranks_equals_the_whole_batch(mode):
    whole = _two_ranks(0, 1, mode)
    assert 1 < int(whole.sum()) < 30
    parts = spawn_workers(_two_ranks, 2, args=(2, mode))
    assert torch.equal(torch.cat(parts), whole)


def test_policy_loss_call_passes_the_selection_and_refuses_a_loss_without_it():
    cfg = _actor(loss_mode="kl_cov", kl_cov_ratio=0.3, ppo_kl_coef=0.5)
    counts = {"global_token_num": 5.0, "global_seq_num": 2.0, "dp_size": 1, "loss_scale_factor": 3}
    selected = torch.zeros(2, 3, dtype=torch.bool)
    loss, metrics = PolicyLossCall(get_policy_loss_fn("kl_cov"), "kl_cov")(
        OLD, LOGP, ADV, MASK, "token-mean", cfg, None, counts, {"cov_selected": selected}
    )
    direct = get_policy_loss_fn("kl_cov")(OLD, LOGP, ADV, MASK, "token-mean", cfg, cov_selected=selected)
    assert float(loss) == pytest.approx(float(direct[0]), rel=1e-6)  # 5 tokens, dp 1: the same aggregate
    assert metrics["actor/pg_clipfrac"] == 0.0
    with pytest.raises(TypeError, match="takes no 'cov_selected'"):
        PolicyLossCall(get_policy_loss_fn("gpg"), "gpg")(
            OLD, LOGP, ADV, MASK, "token-mean", cfg, None, counts, {"cov_selected": selected}
        )


def test_config_keys_have_verls_defaults_and_are_checked():
    pl = load_config([]).actor_rollout_ref.actor.policy_loss
    assert (pl.clip_cov_ratio, pl.clip_cov_lb, pl.clip_cov_ub, pl.kl_cov_ratio, pl.ppo_kl_coef) == (
        0.0002,
        1.0,
        5.0,
        0.0002,
        0.1,
    )
    key = "actor_rollout_ref.actor.policy_loss"
    for override, message in (
        ("kl_cov_ratio=0", "kl_cov_ratio=0.0 must be > 0"),
        ("clip_cov_ratio=1.5", r"clip_cov_ratio=1.5 must be in \(0, 1\]"),
        ("clip_cov_lb=5.0", "clip_cov_lb=5.0 must be < "),
        ("ppo_kl_coef=-0.1", "ppo_kl_coef=-0.1 must be >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            validate_config(load_config([f"{key}.{override}"], config_name="demo_two_ranks"))
