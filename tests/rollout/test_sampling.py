"""Sampling primitives of the HF rollout: filters, counter-based uniforms, token choice and log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.rollout.base import SamplingParams
from rlflow.rollout.sampling import apply_top_k, apply_top_p, counter_uniform, row_keys, sample_next_token

NEG_INF = float("-inf")


def _params(**kw) -> SamplingParams:
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "do_sample": True, "n": 1, "response_length": 4}
    return SamplingParams(**{**base, **kw})


def test_top_k_hand_checked():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0], [1.0, 3.0, 3.0, 2.0]])
    out = apply_top_k(logits, 2)
    assert torch.equal(out[0], torch.tensor([NEG_INF, 4.0, NEG_INF, 3.0]))
    assert torch.equal(out[1], torch.tensor([NEG_INF, 3.0, 3.0, NEG_INF]))
    # ties at the k-th value are kept
    assert torch.equal(apply_top_k(logits, 1)[1], torch.tensor([NEG_INF, 3.0, 3.0, NEG_INF]))
    assert (
        apply_top_k(logits, -1) is logits
        and apply_top_k(logits, 0) is logits
        and apply_top_k(logits, 4) is logits
    )


def test_top_p_hand_checked():
    # probabilities 0.1, 0.2, 0.3, 0.4: the mass above token 2 (p=0.3) is 0.4
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    assert torch.equal(torch.isfinite(apply_top_p(logits, 0.45)), torch.tensor([[False, False, True, True]]))
    assert torch.equal(torch.isfinite(apply_top_p(logits, 0.35)), torch.tensor([[False, False, False, True]]))
    assert torch.equal(torch.isfinite(apply_top_p(logits, 0.75)), torch.tensor([[False, True, True, True]]))
    assert apply_top_p(logits, 1.0) is logits
    kept = apply_top_p(logits, 0.45)
    assert torch.equal(kept[0, 2:], logits[0, 2:])  # kept logits are unchanged


def test_counter_uniform_is_pure_and_uniform():
    keys = row_keys(seed=7, step=3, first_row=0, num_rows=100_000)
    assert keys.dtype == torch.int64 and int(keys.min()) >= 0 and int(keys.max()) < 2**32
    assert keys.unique().numel() == keys.numel()  # distinct streams for distinct rows
    u = counter_uniform(keys, 5)
    assert torch.equal(u, counter_uniform(keys.clone(), 5))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # chi-square over 20 equal bins: 19 dof, 99.9% quantile is 43.8
    counts = torch.bincount((u * 20).long(), minlength=20).double()
    chi2 = float(((counts - 5000.0) ** 2 / 5000.0).sum())
    assert chi2 < 43.8, chi2
    # other positions, seeds and steps give (almost) uncorrelated streams
    others = (row_keys(8, 3, 0, 100_000), row_keys(7, 4, 0, 100_000))
    for other in (counter_uniform(keys, 6), *(counter_uniform(k, 5) for k in others)):
        corr = torch.corrcoef(torch.stack([u, other]))[0, 1]
        assert abs(float(corr)) < 0.02
    # a row's key depends only on its own index, not on how many rows the call has or where it starts
    assert torch.equal(row_keys(7, 3, 0, 10), keys[:10])
    assert torch.equal(row_keys(7, 3, 40, 10), keys[40:50])


def test_sampled_frequencies_match_filtered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    rows = 40_000
    params = _params(temperature=0.8, top_k=3)
    tokens, log_probs, _ = sample_next_token(
        logits.expand(rows, -1).clone(), params, row_keys(0, 0, 0, rows), 0
    )
    expected = torch.zeros(5, dtype=torch.float64)
    top = torch.tensor([0, 1, 2])
    expected[top] = torch.softmax(logits[top].double() / 0.8, dim=-1)
    freq = torch.bincount(tokens, minlength=5).double() / rows
    sigma = torch.sqrt(expected * (1 - expected) / rows)
    assert torch.all((freq - expected).abs() <= 4.5 * sigma + 1e-12), (freq, expected)
    assert int(freq[3:].sum()) == 0  # filtered tokens never drawn
    # log-probs are log_softmax(logits / T) before top-k, at the drawn token
    ref = torch.log_softmax(logits / 0.8, dim=-1)[tokens]
    assert torch.allclose(log_probs, ref, atol=1e-6, rtol=0)


def test_top_p_sampling_frequencies():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = 40_000
    tokens, _, _ = sample_next_token(
        torch.log(probs).expand(rows, -1).clone(), _params(top_p=0.45), row_keys(1, 0, 0, rows), 0
    )
    freq = torch.bincount(tokens, minlength=4).double() / rows
    expected = torch.tensor([0.0, 0.0, 3 / 7, 4 / 7], dtype=torch.float64)
    assert torch.all((freq - expected).abs() <= 4.5 * math.sqrt(0.25 / rows)), freq


@pytest.mark.parametrize(
    "kw", [{"do_sample": False, "temperature": 0.7}, {"do_sample": True, "temperature": 0.0}]
)
def test_greedy_is_argmax_with_logprob_temperature(kw):
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    params = _params(**kw)
    tokens, log_probs, _ = sample_next_token(logits, params, row_keys(0, 0, 0, 2), 0)
    assert tokens.tolist() == [1, 0]
    temperature = kw["temperature"] if kw["temperature"] > 0 else 1.0  # T = 0 -> log-probs at T = 1
    ref = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(log_probs, ref, atol=1e-7, rtol=0)
