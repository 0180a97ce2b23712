"""``use_torch_compile``: the compiled block kernels of log-probs and entropy give the eager numbers.

Compared against the float64 log-softmax reference, forward and backward, on the inputs the trainer
feeds them: padded ``(bs, seq, vocab)`` slices (not viewable as 2-D), packed ``(nnz, vocab)`` logits,
banned (``-inf``) tokens, and blocks of varying row counts (the row dimension is dynamic: one
compilation serves every micro-batch length).
"""

from __future__ import annotations

import math

import pytest
import torch

import rlflow.utils.torch_functional as tf
from rlflow.utils.logit_blocks import kernels
from rlflow.utils.torch_functional import entropy_from_logits, logprobs_from_logits

# float32 results of O(1..10) nats; the fused kernels sum in another order than ATen's (~1e-7)
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _reference(logits: torch.Tensor, labels: torch.Tensor, upstream: torch.Tensor):
    """float64 log-probs and entropies and their gradients (the dot with ``upstream``) w.r.t. the logits."""
    # a banned token as -1e4: exp underflows to exactly 0 in float64, and no inf * 0 in the gradient
    x = logits.detach().double().nan_to_num(neginf=-1e4).requires_grad_(True)
    logp = torch.log_softmax(x, dim=-1)
    lp = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    (lp_grad,) = torch.autograd.grad((lp * upstream).sum(), x, retain_graph=True)
    (ent_grad,) = torch.autograd.grad((ent * upstream).sum(), x)
    return lp.float(), lp_grad.float(), ent.float(), ent_grad.float()


def _ours(logits, labels, upstream, compiled: bool, sliced: bool):
    leaf = logits.detach().clone().requires_grad_(True)
    view = leaf[:, :-1] if sliced else leaf
    lp = logprobs_from_logits(view, labels, compiled=compiled)
    (lp_grad,) = torch.autograd.grad((lp * upstream).sum(), leaf)
    leaf2 = logits.detach().clone().requires_grad_(True)
    view2 = leaf2[:, :-1] if sliced else leaf2
    ent = entropy_from_logits(view2, compiled=compiled)
    (ent_grad,) = torch.autograd.grad((ent * upstream).sum(), leaf2)
    if sliced:
        lp_grad, ent_grad = lp_grad[:, :-1], ent_grad[:, :-1]
    return lp.detach(), lp_grad, ent.detach(), ent_grad


@pytest.mark.parametrize("chunk_elems", [1 << 24, 60])  # one block; blocks of 3 rows and a shorter last one
def test_compiled_kernels_match_eager_and_float64(monkeypatch, chunk_elems):
    monkeypatch.setattr(tf, "_CHUNK_ELEMS", chunk_elems)
    g = torch.Generator().manual_seed(0)
    vocab = 19
    padded = torch.randn(3, 7, vocab, generator=g) * 4
    padded[0, 2, 5] = float("-inf")  # a banned token
    padded_labels = torch.randint(0, vocab, (3, 6), generator=g)
    packed = torch.randn(11, vocab, generator=g) * 4
    packed_labels = torch.randint(0, vocab, (11,), generator=g)
    for logits, labels, sliced in ((padded, padded_labels, True), (packed, packed_labels, False)):
        upstream = torch.randn(labels.shape, generator=g)
        ref_view = logits[:, :-1] if sliced else logits
        want = _reference(ref_view, labels, upstream)
        eager = _ours(logits, labels, upstream, compiled=False, sliced=sliced)
        compiled = _ours(logits, labels, upstream, compiled=True, sliced=sliced)
        for name, w, e, c in zip(("log_probs", "lp_grad", "entropy", "entropy_grad"), want, eager, compiled):
            torch.testing.assert_close(e, w, **TOL, msg=f"eager {name}")
            torch.testing.assert_close(c, w, **TOL, msg=f"compiled {name}")
        if sliced:  # the banned token: zero probability, a finite entropy with zero gradient on it
            assert compiled[3][0, 2, 5] == 0.0 and math.isfinite(float(compiled[2][0, 2]))


def test_kernels_are_built_once_and_eager_by_default():
    assert kernels() is kernels(False)
    assert kernels(True) is kernels(True) and kernels(True) is not kernels(False)
