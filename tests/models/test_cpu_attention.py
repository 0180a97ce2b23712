"""rlflow.models.cpu_attention: packed causal attention through oneDNN's GEMM.

The output and the three gradients against fp64 per-sequence SDPA (fp32 rounding is about 1e-7 of the
values' scale; the bar is 1e-5 of it), with and without grouped-query heads, causal or not, over rows
holding several sequences; which calls take the path; a tiny Qwen2 whose layers `install_onednn_linear`
routed gives, packed, the logits and gradients of the same model run padded through transformers' SDPA.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

from rlflow.models import attention as packed_attention
from rlflow.models.attention import set_packed_attention
from rlflow.models.cpu_attention import (
    MAX_LENGTH,
    MIN_MACS_PER_THREAD,
    ONEDNN_ATTENTION_ATTR,
    onednn_attention_applies,
    packed_onednn_attention,
)
from rlflow.models.cpu_linear import install_onednn_linear
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.utils.onednn import onednn_linear_available

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _reference(q, k, v, lengths, causal):
    """fp64 SDPA per sequence; k/v heads repeated to the query heads."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    rows = []
    for b, row in enumerate(lengths):
        parts = zip(*(t[b : b + 1].split(row, dim=2) for t in (q, k, v)))
        rows.append(torch.cat([F.scaled_dot_product_attention(*p, is_causal=causal) for p in parts], dim=2))
    return torch.cat(rows)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2)], ids=["gqa", "mha"])
def test_output_and_gradients_match_fp64_sdpa(heads, kv_heads, causal):
    gen = torch.Generator().manual_seed(0)
    lengths = [[37, 5, 70], [1, 88, 23]]  # two packed rows of 112 tokens, a 1-token sequence among them
    dim = 64
    # q, k, v as transformers' attention produces them: (b, h, s, d) views of (b, s, h, d) tensors
    q, k, v = (
        torch.randn(2, 112, h, dim, generator=gen, dtype=torch.float64).transpose(1, 2)
        for h in (heads, kv_heads, kv_heads)
    )
    upstream = torch.randn(2, heads, 112, dim, generator=gen, dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = _reference(*ref, lengths, causal)
    (want * upstream).sum().backward()

    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out = packed_onednn_attention(*leaves, lengths, None, causal)
    assert out.shape == (2, heads, 112, dim) and out.transpose(1, 2).is_contiguous()
    (out * upstream.float()).sum().backward()
    _close(out.detach(), want.detach())
    for got, expected in zip(leaves, ref):
        _close(got.grad, expected.grad)

    with torch.no_grad():  # the forward alone, as the reference's and reward model's forwards run it
        _close(packed_onednn_attention(*(t.float() for t in (q, k, v)), lengths, None, causal), want.detach())


def test_which_calls_take_the_path():
    module, other = torch.nn.Module(), torch.nn.Module()
    setattr(module, ONEDNN_ATTENTION_ATTR, True)
    length = 200  # 200**2 * 2 * 64 = 5.1M multiply-adds per sequence and KV head: above the 1-thread bar
    assert 2 * 64 * length**2 >= MIN_MACS_PER_THREAD > 2 * 64 * length**2 / 2
    q, k = torch.empty(1, 4, 2 * length, 64), torch.empty(1, 2, 2 * length, 64)
    lengths = [[length, length]]
    with _threads(1):
        assert onednn_attention_applies(module, q, k, 0.0, lengths)
        assert not onednn_attention_applies(other, q, k, 0.0, lengths)  # not marked
        assert not onednn_attention_applies(module, q, k, 0.1, lengths)  # dropout
        assert not onednn_attention_applies(module, q.bfloat16(), k.bfloat16(), 0.0, lengths)
        assert not onednn_attention_applies(module, q[..., :32], k[..., :32], 0.0, lengths)  # thin heads
        assert not onednn_attention_applies(module, q, k, 0.0, [[length // 2] * 4])  # short sequences
        long = torch.empty(1, 4, MAX_LENGTH + 1, 64), torch.empty(1, 2, MAX_LENGTH + 1, 64)
        assert not onednn_attention_applies(module, *long, 0.0, [[MAX_LENGTH + 1]])  # P would be too large
    with _threads(2):  # the bar grows with the threads that split each small product
        assert not onednn_attention_applies(module, q, k, 0.0, lengths)


def test_a_tiny_qwen2_packed_through_onednn_matches_the_padded_sdpa_model(monkeypatch):
    """The path inside a model: `install_onednn_linear` marks the attention modules; packed rows give the
    logits and parameter gradients of the padded batch through transformers' own SDPA attention."""
    config = TinyModelConfig(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2
    )
    padded = build_tiny_model(config, seed=0)
    packed = set_packed_attention(copy.deepcopy(padded))
    install_onednn_linear(packed)
    calls = []
    kernel = packed_attention.packed_onednn_attention
    monkeypatch.setattr(
        packed_attention, "packed_onednn_attention", lambda *a: calls.append(a[3]) or kernel(*a)
    )

    lengths = [190, 230, 205]
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(3, 259, (n,), generator=gen) for n in lengths]
    width = max(lengths)
    batch = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):  # right padding: each row's positions start at 0
        batch[i, : len(row)], mask[i, : len(row)] = row, 1
    upstream = torch.randn(sum(lengths), 272, generator=gen)

    with _threads(1):
        logits_p = padded(input_ids=batch, attention_mask=mask, use_cache=False).logits[mask.bool()]
        (logits_p * upstream).sum().backward()
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        logits_o = packed(input_ids=torch.cat(ids)[None], position_ids=positions, use_cache=False).logits[0]
        (logits_o * upstream).sum().backward()
    assert calls == [[lengths]] * 2  # both layers, one call each
    torch.testing.assert_close(logits_o, logits_p, rtol=0, atol=1e-5 * float(logits_p.detach().abs().max()))
    grads = dict(packed.named_parameters())
    for name, param in padded.named_parameters():
        scale = float(param.grad.abs().max())
        torch.testing.assert_close(grads[name].grad, param.grad, rtol=0, atol=1e-4 * scale, msg=name)
