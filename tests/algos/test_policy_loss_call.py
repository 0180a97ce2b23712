"""Registered policy losses in either of verl's conventions plug into the actor and keep batch invariance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlflow.algos.losses import agg_loss, compute_policy_loss_vanilla
from rlflow.algos.policy_loss_call import PolicyLossCall
from rlflow.engine.ppo_loop import loss_normalisers

CFG = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0)


def verl_09_style(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode="token-mean",
    config=None,
    rollout_is_weights=None,
):
    """A loss written for verl >= 0.9: local aggregate, ``(pg_loss, metrics)``."""
    ratio = torch.exp(log_prob - old_log_prob)
    loss = agg_loss(-advantages * ratio, response_mask, loss_agg_mode)
    return loss, {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0, "my_stat": 2.0}


def verl_08_style(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    """A loss written for verl < 0.9: local aggregate, the 4-tuple, no importance weights."""
    loss = agg_loss(-advantages * torch.exp(log_prob - old_log_prob), response_mask, loss_agg_mode)
    zero = torch.tensor(0.0)
    return loss, zero, zero, zero


def verl_current_style(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None
):
    """A loss written for verl's current convention: ``agg_loss(..., **config.global_batch_info)``."""
    ratio = torch.exp(log_prob - old_log_prob)
    loss = agg_loss(-advantages * ratio, response_mask, loss_agg_mode, **config.global_batch_info)
    return loss, {"actor/pg_clipfrac": 0.0}


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    old = -1.0 + 0.1 * torch.randn(4, 4, generator=g)
    new = (old + 0.05 * torch.randn(4, 4, generator=g)).requires_grad_()
    adv = torch.randn(4, 4, generator=g)
    return old, new, adv, mask


def _assert_split_sums_to_whole(call, mode, whole, old, new, adv, mask, counts):
    """The call's losses of micro-batches rows [0:1] and [1:4] sum to ``whole``, gradient included."""
    split = sum(
        call(old[s], new[s], adv[s], mask[s], mode, CFG, None, counts)[0] for s in (slice(0, 1), slice(1, 4))
    )
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-7)
    (grad_split,) = torch.autograd.grad(split, new)
    (grad_whole,) = torch.autograd.grad(whole, new)
    torch.testing.assert_close(grad_split, grad_whole, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fn", [verl_09_style, verl_08_style])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_loss_without_global_counts_sums_over_micro_batches_to_the_mini_batch_loss(fn, mode):
    old, new, adv, mask = _batch()
    counts = loss_normalisers({"response_mask": mask, "responses": mask}, None)
    whole = fn(old, new, adv, mask, mode, CFG)[0]  # the local aggregate of the whole mini-batch
    _assert_split_sums_to_whole(PolicyLossCall(fn, "custom"), mode, whole, old, new, adv, mask, counts)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_a_loss_aggregating_with_verls_global_batch_info_is_not_rescaled_again(mode):
    old, new, adv, mask = _batch()
    counts = loss_normalisers({"response_mask": mask, "responses": mask}, None)
    call = PolicyLossCall(verl_current_style, "current")
    assert not call.takes_counts  # verl's parameters only: its counts come from config.global_batch_info
    # the local aggregate of the whole mini-batch (loss_scale_factor: the response width, 4)
    whole = agg_loss(-adv * torch.exp(new - old), mask, mode, loss_scale_factor=4)
    _assert_split_sums_to_whole(call, mode, whole, old, new, adv, mask, counts)


def test_verl_keyword_names_of_agg_loss():
    _, new, adv, mask = _batch()
    ours = agg_loss(adv * new, mask, "token-mean", global_token_num=20, dp_size=2)
    torch.testing.assert_close(agg_loss(adv * new, mask, "token-mean", batch_num_tokens=20, dp_size=2), ours)
    ours = agg_loss(adv * new, mask, "seq-mean-token-sum", global_seq_num=8, dp_size=2)
    torch.testing.assert_close(
        agg_loss(adv * new, mask, "seq-mean-token-sum", global_batch_size=8, dp_size=2), ours
    )
    with pytest.raises(ValueError, match="global_token_num or verl's batch_num_tokens, not both"):
        agg_loss(adv, mask, "token-mean", global_token_num=20, batch_num_tokens=20)


def test_return_shapes_become_one_metrics_dict():
    old, new, adv, mask = _batch()
    counts = loss_normalisers({"response_mask": mask, "responses": mask}, None)
    loss, metrics = PolicyLossCall(verl_09_style, "v09")(old, new, adv, mask, "token-mean", CFG, None, counts)
    assert set(metrics) == {"actor/pg_clipfrac", "actor/ppo_kl", "actor/my_stat"}
    builtin = PolicyLossCall(compute_policy_loss_vanilla, "vanilla")
    loss, metrics = builtin(old, new, adv, mask, "token-mean", CFG, None, counts)
    direct = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", CFG, None, **counts)
    assert torch.equal(loss, direct[0])
    assert [metrics[k] for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")] == list(
        direct[1:]
    )


def test_what_cannot_work_is_refused_naming_the_loss():
    old, new, adv, mask = _batch()
    counts = loss_normalisers({"response_mask": mask, "responses": mask}, None)
    with pytest.raises(ValueError, match=r"seq-mean-token-sum-norm.*'v08' does neither"):
        PolicyLossCall(verl_08_style, "v08")(
            old, new, adv, mask, "seq-mean-token-sum-norm", CFG, None, counts
        )
    with pytest.raises(ValueError, match=r"tis_imp_ratio_cap.*'v08' has none"):
        PolicyLossCall(verl_08_style, "v08")(old, new, adv, mask, "token-mean", CFG, torch.ones(4, 4), counts)
    with pytest.raises(TypeError, match=r"'short' .* must take"):
        PolicyLossCall(lambda a, b, c: 1.0, "short")
    with pytest.raises(TypeError, match=r"'bad' returned float"):
        PolicyLossCall(lambda a, b, c, d, e, f: 1.0, "bad")(
            old, new, adv, mask, "token-mean", CFG, None, counts
        )
