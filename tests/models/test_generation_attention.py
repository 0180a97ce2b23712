"""``rlflow_generate``: KV-cached decoding attention without repeated KV heads equals transformers' SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlflow.models.attention import generation_attention_forward

B, HEADS, KV_HEADS, D, KV_LEN = 3, 4, 2, 8, 7


def _inputs(q_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, HEADS, q_len, D, generator=g)
    key = torch.randn(B, KV_HEADS, KV_LEN, D, generator=g)
    value = torch.randn(B, KV_HEADS, KV_LEN, D, generator=g)
    # left padding of 0, 2 and 4 tokens; causal inside the last q_len positions
    valid = torch.ones(B, KV_LEN, dtype=torch.bool)
    valid[1, :2] = False
    valid[2, :4] = False
    q_pos = torch.arange(KV_LEN - q_len, KV_LEN)[:, None]
    causal = torch.arange(KV_LEN)[None, :] <= q_pos
    mask = (valid[:, None, None, :] & causal[None, None]).clone()
    mask[~mask.any(-1, keepdim=True).expand_as(mask)] = True  # a query with no valid key attends to all
    return query, key, value, mask


MODULE = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True, training=False)


@pytest.mark.parametrize("q_len", [1, 5])  # a decoding step and a prefill
def test_matches_transformers_sdpa_with_grouped_kv_heads(q_len):
    query, key, value, mask = _inputs(q_len)
    expected, _ = sdpa_attention_forward(MODULE, query, key, value, mask, scaling=D**-0.5)
    got, weights = generation_attention_forward(MODULE, query, key, value, mask, scaling=D**-0.5)
    assert weights is None and got.shape == (B, q_len, HEADS, D)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_query_heads_use_their_own_kv_head():
    """Heads 0-1 read KV head 0 and heads 2-3 KV head 1 (transformers' repeat_kv order): zeroing the
    values of KV head 1 zeroes exactly the outputs of heads 2 and 3."""
    query, key, value, mask = _inputs(1)
    value[:, 1] = 0.0
    got, _ = generation_attention_forward(MODULE, query, key, value, mask)
    assert got[:, :, 2:].abs().max() == 0.0 and got[:, :, :2].abs().min() > 0.0


def test_causal_prefill_without_a_mask_is_transformers_sdpa():
    query, key, value, _ = _inputs(KV_LEN)
    expected, _ = sdpa_attention_forward(MODULE, query, key, value, None)
    got, _ = generation_attention_forward(MODULE, query, key, value, None)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_step_without_a_mask_folds_the_query_heads(dtype):
    """No left padding (transformers passes no mask): the step still attends over the un-repeated cache,
    and equals transformers' SDPA (in bf16 to bf16's resolution: outputs are convex combinations of values
    of size ~1, so a few units of 2**-8)."""
    query, key, value, _ = (t.to(dtype) for t in _inputs(1))
    expected, _ = sdpa_attention_forward(MODULE, query.float(), key.float(), value.float(), None)
    got, _ = generation_attention_forward(MODULE, query, key, value, None)
    assert got.dtype == dtype and got.shape == (B, 1, HEADS, D)
    tol = 1e-6 if dtype == torch.float32 else 4 * 2**-8
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=tol)
