"""rlflow.models.fused_head: chunked log-probs and entropy from hidden states equal the logits path.

`fused_log_probs` against ``log_softmax`` of the full logits (values and both gradients, fp64 to 1e-10,
fp32 to the scale of the quantity); a tiny Qwen2 with the fused head installed against the same model
without it through `forward_micro_batch` (padded, remove-padding, and FSDP2 + Ulysses SP 2 + gradient
checkpointing on 2 gloo ranks); outside a request the head is the plain linear layer.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlflow.models.forward import forward_micro_batch
from rlflow.models.fused_head import FusedLMHead, fused_head_of, fused_log_probs, install_fused_head
from rlflow.parallel.distributed import spawn_workers
from tests.models.test_forward import RTOL, _assert_grads_close, _batch, _loss, _masked, _models

TOKENS, HIDDEN, VOCAB = 37, 16, 50


def _reference(hidden, weight, labels, temperature):
    logp = torch.log_softmax(hidden @ weight.t() / temperature, dim=-1)
    return logp.gather(-1, labels[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_fused_log_probs_equal_log_softmax_values_and_gradients(dtype, tol):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen, dtype=dtype)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen, dtype=dtype)
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    a = torch.randn(TOKENS, generator=gen, dtype=dtype)  # arbitrary incoming gradients
    b = torch.randn(TOKENS, generator=gen, dtype=dtype)
    results = []
    for fn in (
        lambda h, w: fused_log_probs(h, w, labels, temperature=0.7, chunk_size=8),  # 5 chunks, last of 5
        lambda h, w: _reference(h, w, labels, 0.7),
    ):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = fn(h, w)
        ((lp * a).sum() + (ent * b).sum()).backward()
        results.append((lp.detach().to(dtype), ent.detach().to(dtype), h.grad, w.grad))
    for got, want in zip(*results):
        scale = float(want.abs().max())
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)
    assert results[0][0].max() < 0 and results[0][1].min() > 0  # log-probs below 0, entropies above


def test_fused_log_probs_checks_its_arguments():
    h, w = torch.zeros(4, 3), torch.zeros(5, 3)
    with pytest.raises(ValueError, match="temperature must be positive"):
        fused_log_probs(h, w, torch.zeros(4, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="labels"):
        fused_log_probs(h, w, torch.zeros(3, dtype=torch.long))


def _fused_pair(attn: str | None = None):
    actor, _ = _models() if attn is None else _models(attn=attn)
    fused = install_fused_head(copy.deepcopy(actor))
    return actor, fused


def test_installed_head_keeps_names_and_is_the_plain_head_outside_a_request():
    actor, fused = _fused_pair(attn="sdpa")
    assert isinstance(fused_head_of(fused), FusedLMHead) and fused_head_of(actor) is None
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in actor.named_parameters()]
    ids = _batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, actor(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("rmpad", [False, True])
def test_forward_with_the_fused_head_equals_the_logits_path(rmpad):
    from tests.models.test_forward import _outputs_and_grads

    actor, fused = _fused_pair()
    batch = _batch()
    kw = {"output": "log_probs", "temperature": 0.8, "calculate_entropy": True, "use_remove_padding": rmpad}
    out_ref, grads_ref = _outputs_and_grads(actor, batch, **kw)
    out_fused, grads_fused = _outputs_and_grads(fused, batch, **kw)
    mask = batch["response_mask"]
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(
            _masked(out_fused[key], mask), _masked(out_ref[key], mask), rtol=RTOL, atol=1e-6
        )
    _assert_grads_close(grads_fused, grads_ref)


def _sp_worker(rank: int) -> dict:
    """FSDP2 over 2 ranks, Ulysses SP 2, gradient checkpointing: fused and plain heads."""
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import apply_fsdp
    from rlflow.parallel.sharded import gather_full_grads

    dims = ParallelDims(world_size=2, ulysses_sequence_parallel_size=2).build_meshes("cpu")
    group = dims.ulysses_mesh["sp"].get_group()
    out = {}
    for name, module in zip(("plain", "fused"), _fused_pair()):
        wrapped = apply_fsdp(module.train(), dims, enable_gradient_checkpointing=True)
        assert (fused_head_of(wrapped) is not None) == (name == "fused")
        batch = _batch()
        result = forward_micro_batch(
            wrapped,
            batch,
            output="log_probs",
            use_remove_padding=True,
            sp_group=group,
            temperature=0.8,
            calculate_entropy=True,
        )
        _loss(result, batch["response_mask"]).backward()
        out[name] = ({k: v.detach() for k, v in result.items()}, gather_full_grads(wrapped))
    return out


def test_fused_head_under_fsdp2_ulysses_sp2_and_gradient_checkpointing():
    mask = _batch()["response_mask"]
    for res in spawn_workers(_sp_worker, 2):
        (plain, plain_grads), (fused, fused_grads) = res["plain"], res["fused"]
        for key in ("log_probs", "entropy"):
            torch.testing.assert_close(
                _masked(fused[key], mask), _masked(plain[key], mask), rtol=RTOL, atol=1e-6
            )
        _assert_grads_close(fused_grads, plain_grads)
