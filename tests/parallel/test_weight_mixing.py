"""rlflow.parallel.weight_mixing: ``ref <- alpha * actor + (1 - alpha) * ref`` shard by shard (FSDP2, 2 gloo
ranks), checked against the same blend of the full tensors."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import fully_shard

from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.sharded import gather_full_params
from rlflow.parallel.weight_mixing import local_shards, mix_local_shards_

CFG = TinyModelConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, vocab_size=271)
ALPHA = 0.25


def _sharded(seed: int) -> torch.nn.Module:
    model = build_tiny_model(CFG, seed=seed)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _worker(rank: int) -> dict:
    actor, ref = _sharded(0), _sharded(1)
    shards = local_shards(actor)
    assert all(t.device.type == "cpu" for t in shards.values())
    mix_local_shards_(ref, shards, ALPHA)
    errors = []
    plain = build_tiny_model(CFG, seed=1)  # not sharded: every local shape differs
    try:
        mix_local_shards_(plain, shards, ALPHA)
    except ValueError as exc:
        errors.append(str(exc))
    return {"ref": gather_full_params(ref), "errors": errors}


def test_reference_moves_toward_the_actor_by_alpha_on_every_shard():
    actor = dict(build_tiny_model(CFG, seed=0).named_parameters())
    ref = dict(build_tiny_model(CFG, seed=1).named_parameters())
    for out in spawn_workers(_worker, 2):
        assert out["ref"].keys() == ref.keys()
        for name, got in out["ref"].items():
            want = ALPHA * actor[name].detach() + (1 - ALPHA) * ref[name].detach()
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7 * float(want.abs().max()))
        assert "sharded the same way" in out["errors"][0]


def test_alpha_outside_the_unit_interval_is_refused():
    model = build_tiny_model(CFG, seed=0)
    with pytest.raises(ValueError, match=r"alpha=0.0 must be in \(0, 1\]"):
        mix_local_shards_(model, local_shards(model), 0.0)
