"""Masked statistics, response masks, padding, log-probs and entropy vs hand values / naive references."""

from __future__ import annotations

import math

import pytest
import torch

import rlflow.utils.torch_functional as tf
from rlflow.utils.torch_functional import (
    clip_by_value,
    entropy_from_logits,
    get_response_mask,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    pad_2d_list_to_length,
    pad_sequence_to_length,
)

TOL = {"rtol": 1e-6, "atol": 1e-6}


def _close(actual, expected, **tol):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, **(tol or TOL))


# ---------------------------------------------------------------------------------------------- masked


VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]])


def test_masked_sum_and_mean_by_hand():
    _close(masked_sum(VALUES, MASK), 1 + 2 + 5 + 7 + 8)  # 23, exact
    _close(masked_sum(VALUES, MASK, axis=-1), [3.0, 20.0, 0.0])
    _close(masked_mean(VALUES, MASK), 23 / 5)
    # the fully masked row gives 0, not NaN
    _close(masked_mean(VALUES, MASK, axis=-1), [1.5, 20 / 3, 0.0])
    _close(masked_mean(VALUES, MASK, axis=0), [3.0, 2.0, 7.0, 8.0])


def test_masked_sum_ignores_non_finite_masked_entries_in_value_and_gradient():
    values = torch.tensor([[1.0, float("nan"), float("inf")]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    out = masked_mean(values, mask) + masked_sum(values, mask)
    _close(out, 2.0)
    out.backward()
    _close(values.grad, [[2.0, 0.0, 0.0]])


def test_masked_var_biased_unbiased_and_errors():
    # valid values 1, 2, 5, 7, 8: mean 4.6, squared deviations 12.96 6.76 0.16 5.76 11.56 = 37.2
    _close(masked_var(VALUES, MASK), 37.2 / 4)
    _close(masked_var(VALUES, MASK, unbiased=False), 37.2 / 5)
    with pytest.raises(ValueError, match="selects no element"):
        masked_var(VALUES, torch.zeros_like(MASK))
    one = torch.zeros_like(MASK)
    one[0, 0] = 1
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(VALUES, one)
    _close(masked_var(VALUES, one, unbiased=False), 0.0)


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # valid 1, 3, 5: mean 3, unbiased var (4 + 0 + 4) / 2 = 4
    std = math.sqrt(4 + 1e-8)
    expected = [[-2 / std, 0.0, 97 / std], [2 / std, -3 / std, -3 / std]]
    _close(masked_whiten(x, m), expected)
    _close(masked_whiten(x, m, shift_mean=False), [[v + 3.0 for v in row] for row in expected])


def test_clip_by_value_tensor_and_float_bounds():
    x = torch.tensor([-2.0, 0.5, 3.0])
    _close(clip_by_value(x, -1.0, 1.0), [-1.0, 0.5, 1.0])
    _close(clip_by_value(x, torch.tensor([-3.0, 1.0, 0.0]), torch.tensor([-2.5, 2.0, 2.0])), [-2.5, 1.0, 2.0])


# -------------------------------------------------------------------------------------- masks, padding


def test_get_response_mask_keeps_first_eos_only():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 2, 2, 2], [3, 8, 2, 4]])
    mask = get_response_mask(ids, eos_token=2)
    assert mask.dtype == torch.int64
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    mask = get_response_mask(ids, eos_token=[2, 8], dtype=torch.float32)
    assert mask.dtype == torch.float32
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    with pytest.raises(ValueError, match="eos_token"):
        get_response_mask(ids, eos_token=[])


def test_pad_2d_list_to_length():
    assert pad_2d_list_to_length([[1, 2], [3]], pad_token_id=0).tolist() == [[1, 2], [3, 0]]
    out = pad_2d_list_to_length([[1, 2], [3]], pad_token_id=9, max_length=4)
    assert out.dtype == torch.int64 and out.tolist() == [[1, 2, 9, 9], [3, 9, 9, 9]]
    # a max_length below the longest row never cuts it (as verl)
    assert pad_2d_list_to_length([[1, 2, 3], [4]], 0, max_length=1).tolist() == [[1, 2, 3], [4, 0, 0]]
    with pytest.raises(ValueError, match="empty"):
        pad_2d_list_to_length([], 0)


def test_pad_sequence_to_length():
    x = torch.tensor([[1, 2], [3, 4]])
    assert pad_sequence_to_length(x, 4, 0).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert pad_sequence_to_length(x, 3, 7, left_pad=True).tolist() == [[7, 1, 2], [7, 3, 4]]
    assert pad_sequence_to_length(x, 2, 0) is x
    assert pad_sequence_to_length(x, 1, 0) is x
    f = pad_sequence_to_length(torch.ones(1, 1), 2, 0.5)
    assert f.dtype == torch.float32 and f.tolist() == [[1.0, 0.5]]


# ------------------------------------------------------------------------------------------- log-probs


def _upcast(logits):
    return logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32, fp64 stays


def _naive_logprobs(logits, labels):
    return torch.log_softmax(_upcast(logits), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _naive_entropy(logits):
    logp = torch.log_softmax(_upcast(logits), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _grads(fn, logits, upstream):
    leaf = logits.detach().clone().requires_grad_(True)
    out = fn(leaf)
    out.backward(upstream)
    return out.detach(), leaf.grad


@pytest.mark.parametrize("chunk_elems", [1 << 24, 16])  # one block, and one row per block
def test_logprobs_and_entropy_match_naive_reference(monkeypatch, chunk_elems):
    monkeypatch.setattr(tf, "_CHUNK_ELEMS", chunk_elems)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    labels = torch.randint(0, 11, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g)

    out, grad = _grads(lambda x: logprobs_from_logits(x, labels), logits, upstream)
    ref_out, ref_grad = _grads(lambda x: _naive_logprobs(x, labels), logits, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)

    out, grad = _grads(entropy_from_logits, logits, upstream)
    ref_out, ref_grad = _grads(_naive_entropy, logits, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)


@pytest.mark.parametrize("chunk_elems", [1 << 24, 22])
def test_non_contiguous_slice_and_packed_input(monkeypatch, chunk_elems):
    monkeypatch.setattr(tf, "_CHUNK_ELEMS", chunk_elems)
    g = torch.Generator().manual_seed(1)
    full = torch.randn(2, 6, 7, generator=g, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5), generator=g)
    out = logprobs_from_logits(full[:, :-1], labels)  # the usual shift: not viewable as (-1, vocab)
    (out * torch.arange(10.0).view(2, 5)).sum().backward()
    ref_full = full.detach().clone().requires_grad_(True)
    ref = _naive_logprobs(ref_full[:, :-1], labels)
    (ref * torch.arange(10.0).view(2, 5)).sum().backward()
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(full.grad, ref_full.grad, **TOL)
    _close(full.grad[:, -1], torch.zeros(2, 7))  # the sliced-off position gets no gradient

    packed = torch.randn(9, 7, generator=g)  # (total_nnz, vocab) of remove-padding
    packed_labels = torch.randint(0, 7, (9,), generator=g)
    torch.testing.assert_close(
        logprobs_from_logits(packed, packed_labels), _naive_logprobs(packed, packed_labels), **TOL
    )
    torch.testing.assert_close(entropy_from_logits(packed), _naive_entropy(packed), **TOL)


def test_hand_values_uniform_and_two_token():
    uniform = torch.zeros(1, 4)
    _close(logprobs_from_logits(uniform, torch.tensor([2])), [-math.log(4)])
    _close(entropy_from_logits(uniform), [math.log(4)])
    # logits (0, ln 3): p = (1/4, 3/4); H = -(0.25 ln 0.25 + 0.75 ln 0.75)
    two = torch.tensor([[0.0, math.log(3.0)]])
    _close(logprobs_from_logits(two, torch.tensor([1])), [math.log(0.75)])
    _close(entropy_from_logits(two), [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])


def test_entropy_of_peaked_distributions_matches_float64():
    # large logits: H is small and lse - E[x] of unshifted logits would lose ~1e-5 to cancellation
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, 17, generator=g) * 10 + 50
    truth = _naive_entropy(logits.double()).float()
    torch.testing.assert_close(entropy_from_logits(logits), truth, rtol=0, atol=1e-6)


def test_entropy_with_banned_tokens_is_finite_with_zero_gradient_on_them():
    logits = torch.tensor([[0.0, float("-inf"), math.log(3.0)]], requires_grad=True)
    h = entropy_from_logits(logits)
    _close(h.detach(), [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])
    h.sum().backward()
    # dH/dx_j = p_j (E_p[x] - x_j); E_p[x] = 0.75 ln 3
    e = 0.75 * math.log(3.0)
    _close(logits.grad, [[0.25 * e, 0.0, 0.75 * (e - math.log(3.0))]])


def test_half_precision_logits_give_float32_results():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 3, 13, generator=g) * 2).to(torch.bfloat16)
    labels = torch.randint(0, 13, (2, 3), generator=g)
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _naive_logprobs(logits, labels), **TOL)
    ent = entropy_from_logits(logits)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent, _naive_entropy(logits), **TOL)
    leaf = logits.detach().requires_grad_(True)
    logprobs_from_logits(leaf, labels).sum().backward()
    assert leaf.grad.dtype == torch.bfloat16


def test_logprobs_label_shape_error():
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
