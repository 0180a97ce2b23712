"""rlflow.parallel.weight_buckets: bucketed all-gathers of FSDP2 parameters on 3 gloo ranks.

Three ranks make the uneven ``torch.chunk`` shards the layout has to undo: a 7-row tensor is split
3 + 3 + 1, a 2-row one 1 + 1 + 0 (the last rank holds nothing). Every gathered tensor must equal
``DTensor.full_tensor()`` exactly (a gather moves bits, it adds nothing), the buckets must follow the
byte budget as computed by hand, and each bucket must cost one collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.weight_buckets import iter_full_param_buckets

# name -> shape; fp32, so bytes = 4 * numel: a 84, b 8, c 16, d 20, e 60
SHAPES = {"a": (7, 3), "b": (2,), "c": (1, 4), "d": (5,), "e": (3, 5)}


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        for name, shape in SHAPES.items():
            self.register_parameter(name, nn.Parameter(torch.randn(shape, generator=gen)))


# bucket budget (bytes) -> the buckets by hand: consecutive tensors while the sum stays within the budget
# (a tensor larger than the budget is a bucket of its own)
EXPECTED = {
    1: [["a"], ["b"], ["c"], ["d"], ["e"]],
    90: [["a"], ["b", "c", "d"], ["e"]],  # 84 | 8 + 16 + 20 = 44 (+ 60 > 90) | 60
    104: [["a", "b"], ["c", "d", "e"]],  # 84 + 8 = 92 (+ 16 > 104) | 16 + 20 + 60 = 96
    1 << 20: [["a", "b", "c", "d", "e"]],
}


def _count_gathers() -> list[int]:
    calls = [0]
    original = dist.all_gather_single

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    dist.all_gather_single = counting
    return calls


def _worker(rank: int) -> dict:
    calls = _count_gathers()
    model = Toy()
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    fully_shard(model)
    assert [p.to_local().shape[0] for p in (model.a, model.b)] == [[3, 1], [3, 1], [1, 0]][rank]
    out: dict = {"buckets": {}, "exact": {}, "gathers": {}}
    for budget in EXPECTED:
        before = calls[0]
        buckets = list(iter_full_param_buckets(model, budget))
        out["gathers"][budget] = calls[0] - before
        out["buckets"][budget] = [[name for name, _ in b] for b in buckets]
        out["exact"][budget] = all(
            torch.equal(t, reference[name]) and t.data_ptr() != getattr(model, name).to_local().data_ptr()
            for b in buckets
            for name, t in b
        )

    # A real model: the generation replica synced with buckets equals the one synced tensor by tensor.
    from rlflow.rollout.hf import build_generation_replica, sync_replica_weights

    cfg = TinyModelConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, vocab_size=271)
    lm = build_tiny_model(cfg)
    full = {n: p.detach().clone() for n, p in lm.named_parameters()}
    for layer in lm.model.layers:
        fully_shard(layer)
    fully_shard(lm)
    replica = build_generation_replica(lm)
    before = calls[0]
    sync_replica_weights(lm, replica, bucket_bytes=1 << 30)
    out["replica_gathers"] = calls[0] - before
    out["replica_exact"] = all(torch.equal(p, full[n]) for n, p in replica.named_parameters())
    out["replica_params"] = len(full)
    return out


def test_buckets_follow_the_byte_budget_and_gather_exactly_once_each():
    results = spawn_workers(_worker, 3)
    for out in results:
        assert out["buckets"] == EXPECTED
        assert out["exact"] == dict.fromkeys(EXPECTED, True)
        assert out["gathers"] == {budget: len(buckets) for budget, buckets in EXPECTED.items()}
        # every parameter of the model (embeddings, 2 layers, norm, head) in one all-gather, bit-exact
        assert out["replica_exact"] and out["replica_params"] > 20
        assert out["replica_gathers"] == 1


def _worker_older_torch(rank: int) -> dict:
    """torch < 2.13 has no ``dist.all_gather_single`` (seen on a GPU machine's torch 2.11): the buckets
    must gather through ``all_gather_into_tensor`` there."""
    calls = [0]
    original = dist.all_gather_into_tensor

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    if hasattr(dist, "all_gather_single"):
        del dist.all_gather_single
    dist.all_gather_into_tensor = counting
    model = Toy()
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    fully_shard(model)
    buckets = list(iter_full_param_buckets(model, 90))
    exact = all(torch.equal(t, reference[name]) for b in buckets for name, t in b)
    return {"exact": exact, "gathers": calls[0], "buckets": len(buckets)}


def test_buckets_gather_on_a_torch_without_all_gather_single():
    for out in spawn_workers(_worker_older_torch, 2):
        assert out == {"exact": True, "gathers": 3, "buckets": 3}


def _worker_one_rank(rank: int) -> dict:
    calls = _count_gathers()
    model = Toy()
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    fully_shard(model)
    buckets = list(iter_full_param_buckets(model, 90))
    exact = all(
        torch.equal(t, reference[name]) and t.data_ptr() != getattr(model, name).to_local().data_ptr()
        for b in buckets
        for name, t in b
    )
    return {"exact": exact, "gathers": calls[0], "buckets": [[name for name, _ in b] for b in buckets]}


def test_one_rank_copies_its_shards_without_a_collective():
    """A one-rank mesh (the CPU demo's layout) holds every parameter whole: fresh copies, no all-gather."""
    [out] = spawn_workers(_worker_one_rank, 1)
    assert out == {"exact": True, "gathers": 0, "buckets": EXPECTED[90]}
