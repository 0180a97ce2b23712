"""Advantages computed on the batch gathered over DP ranks equal the single-process computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlflow.algos.compute_advantage import compute_advantage
from rlflow.parallel.distributed import spawn_workers
from rlflow.protocol import DataProto, pad_dataproto_to_divisor

N, L = 7, 5  # 7 samples on 2 ranks: the dispatch pads to 8 by wrapping sample 0 around


def _batch() -> DataProto:
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5, 3])
    mask = (torch.arange(L)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(N, L)
    rewards[torch.arange(N), lengths - 1] = torch.randn(N, generator=g)
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "values": torch.randn(N, L, generator=g) * mask,
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b", "b", "c", "d"], dtype=object)},
        meta_info={"global_batch_size": N},
    )


def _rank(rank: int, estimator: str) -> dict:
    from rlflow.workers.role_setup import gathered_advantages

    padded, _ = pad_dataproto_to_divisor(_batch(), 2)
    shard = padded.chunk(2)[rank]
    shard.meta_info["global_batch_size"] = N
    algo = {"adv_estimator": estimator, "gamma": 0.9, "lam": 0.8, "norm_adv_by_std_in_grpo": True}
    g = gathered_advantages(
        shard, torch.distributed.group.WORLD, rank, lambda full: compute_advantage(full, algo)
    )
    return {"adv": g.advantages, "ret": g.returns, "full": len(g.full)}


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_gathered_advantages_match_whole_batch(estimator):
    algo = {"adv_estimator": estimator, "gamma": 0.9, "lam": 0.8, "norm_adv_by_std_in_grpo": True}
    want_adv, want_ret = compute_advantage(_batch(), algo)
    out = spawn_workers(_rank, 2, args=(estimator,))
    assert [o["full"] for o in out] == [N, N]  # padding stripped before the estimator runs
    adv = torch.cat([o["adv"] for o in out])  # rows 0..7, the last one the wrapped-around sample 0
    ret = torch.cat([o["ret"] for o in out])
    rows = [i % N for i in range(8)]
    torch.testing.assert_close(adv, want_adv[rows], rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, want_ret[rows], rtol=0, atol=1e-6)
    # Whitening (GAE) / group statistics (GRPO) use the whole batch, not a shard: a shard-local
    # computation gives different numbers.
    local_adv, _ = compute_advantage(_batch()[:4], algo)
    assert not torch.allclose(local_adv, want_adv[:4], atol=1e-3)
