"""Ulysses helpers: pad-and-slice, the all-to-all pair and the gather's gradient convention (2 gloo ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.ulysses import (
    gather_heads_scatter_seq,
    gather_outputs_and_unpad,
    gather_seq_scatter_heads,
    get_ulysses_sequence_parallel_group,
    get_ulysses_sequence_parallel_rank,
    get_ulysses_sequence_parallel_world_size,
    ulysses_group,
    ulysses_pad_and_slice_inputs,
)


def test_pad_and_slice_hand_computed() -> None:
    ids = torch.tensor([[11, 12, 13, 14, 15]])
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    slices = [ulysses_pad_and_slice_inputs(ids, pos, sp_size=2, sp_rank=r) for r in range(2)]
    assert slices[0][0].tolist() == [[11, 12, 13]] and slices[0][1].tolist() == [[0, 1, 2]]
    assert slices[1][0].tolist() == [[14, 15, 0]] and slices[1][1].tolist() == [
        [0, 1, 0]
    ]  # pad: own sequence
    assert slices[0][2] == slices[1][2] == 1
    ids_1, pos_1, pad_1 = ulysses_pad_and_slice_inputs(ids, None, sp_size=1, sp_rank=0)
    assert torch.equal(ids_1, ids) and pos_1 is None and pad_1 == 0
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size"):
        ulysses_pad_and_slice_inputs(ids, pos, sp_size=0, sp_rank=0)
    with pytest.raises(ValueError, match="sp_rank=2"):
        ulysses_pad_and_slice_inputs(ids, pos, sp_size=2, sp_rank=2)


def test_registry_defaults_without_group() -> None:
    assert get_ulysses_sequence_parallel_group() is None
    assert get_ulysses_sequence_parallel_world_size() == 1 and get_ulysses_sequence_parallel_rank() == 0
    x = torch.randn(1, 4, 3, 2)
    assert gather_seq_scatter_heads(x, seq_dim=2, head_dim=1) is x
    assert gather_outputs_and_unpad(x, gather_dim=2, unpad_dim=2, padding_size=1).shape == (1, 4, 2, 2)


def _worker(rank: int) -> dict:
    world = dist.group.WORLD
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(1, 4, 6, 2, generator=gen)  # (b, heads, seq, d), identical on both ranks
    weight = torch.randn(1, 4, 6, 2, generator=gen)
    out: dict = {}
    with ulysses_group(world):
        out["registry"] = (get_ulysses_sequence_parallel_world_size(), get_ulysses_sequence_parallel_rank())
        x = full[:, :, 3 * rank : 3 * rank + 3].clone().requires_grad_(True)
        y = gather_seq_scatter_heads(x, seq_dim=2, head_dim=1)
        out["a2a"] = torch.equal(y, full[:, 2 * rank : 2 * rank + 2])
        out["a2a_inverse"] = torch.equal(gather_heads_scatter_seq(y, head_dim=1, seq_dim=2), x)
        (weight[:, 2 * rank : 2 * rank + 2] * y).sum().backward()
        out["a2a_grad"] = torch.equal(x.grad, weight[:, :, 3 * rank : 3 * rank + 3])

        tokens = torch.arange(5.0)[None]  # 5 tokens, padded to 6 over 2 ranks
        coef = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
        local, _, pad = ulysses_pad_and_slice_inputs(tokens, None, sp_size=2)
        for scale in (True, False):
            leaf = local.clone().requires_grad_(True)
            gathered = gather_outputs_and_unpad(
                leaf * 2.0, gather_dim=1, unpad_dim=1, padding_size=pad, grad_scale=scale
            )
            (coef * gathered).sum().backward()  # the same full-sequence loss on both ranks
            out[f"gathered_{scale}"] = gathered.detach()
            out[f"grad_{scale}"] = leaf.grad
    out["restored"] = get_ulysses_sequence_parallel_group() is None
    return out


def test_all_to_all_and_gather_on_two_ranks() -> None:
    results = spawn_workers(_worker, 2)
    for rank, res in enumerate(results):
        assert res["registry"] == (2, rank) and res["restored"]
        assert res["a2a"] and res["a2a_inverse"] and res["a2a_grad"]
        assert res["gathered_True"].tolist() == [[0.0, 2.0, 4.0, 6.0, 8.0]]
    # d(loss)/d(leaf) = 2 * coef; rank 0 keeps tokens 0..2, rank 1 tokens 3, 4 and the pad (grad 0)
    assert results[0]["grad_False"].tolist() == [[2.0, 4.0, 6.0]]
    assert results[1]["grad_False"].tolist() == [[8.0, 10.0, 0.0]]
    # grad_scale=True multiplies the kept slice by sp=2 (tests/models/test_forward.py checks the FSDP mean)
    assert results[0]["grad_True"].tolist() == [[4.0, 8.0, 12.0]]
    assert results[1]["grad_True"].tolist() == [[16.0, 20.0, 0.0]]
