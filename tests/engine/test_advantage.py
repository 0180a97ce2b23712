"""Advantages computed once in the critic group, on its shards, equal the whole-batch computation.

7 samples on 2 data-parallel ranks: the dispatch pads to 8 by wrapping sample 0 around, so the padding row
must not count in the whitening statistics or the metrics.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlflow.algos.advantages import advantage_metrics, compute_advantage
from rlflow.algos.stats import explained_variance
from rlflow.parallel.distributed import spawn_workers
from rlflow.protocol import DataProto, pad_dataproto_to_divisor

N, L = 7, 5


def _algo(estimator: str) -> SimpleNamespace:
    return SimpleNamespace(adv_estimator=estimator, gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=True)


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
    )


def _custom(token_level_rewards, response_mask, values, index, config, **kwargs):
    """A batch-level function: centre the scores on the batch mean (needs the whole batch)."""
    scores = (token_level_rewards * response_mask).sum(-1, keepdim=True)
    return (scores - scores.mean()) * response_mask, scores * response_mask


def _rank(rank: int, estimator: str, custom: bool) -> dict:
    from rlflow.engine.advantage import compute_advantage_on_shard, shard_advantage_metrics

    padded, _ = pad_dataproto_to_divisor(_batch(), 2)
    shard = padded.chunk(2)[rank]
    group = torch.distributed.group.WORLD
    adv, ret = compute_advantage_on_shard(
        shard, _algo(estimator), _custom if custom else None, group, rank, N
    )
    shard.batch["advantages"], shard.batch["returns"] = adv, ret
    return {"adv": adv, "ret": ret, "metrics": shard_advantage_metrics(shard, group, rank, N)}


@pytest.mark.parametrize(("estimator", "custom"), [("gae", False), ("grpo", False), ("gae", True)])
def test_shard_advantages_and_metrics_match_the_whole_batch(estimator, custom):
    """GAE runs per shard (whitening by all-reduce), GRPO and a custom function on the gathered batch."""
    batch = _batch()
    want_adv, want_ret = compute_advantage(batch, _algo(estimator), _custom if custom else None)
    out = spawn_workers(_rank, 2, args=(estimator, custom))
    adv = torch.cat([o["adv"] for o in out])  # rows 0..7, the last one the wrapped-around sample 0
    ret = torch.cat([o["ret"] for o in out])
    rows = [i % N for i in range(8)]
    torch.testing.assert_close(adv, want_adv[rows], rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, want_ret[rows], rtol=0, atol=1e-6)
    want = advantage_metrics(batch, want_adv, want_ret)
    want["critic/vf_explained_var"] = explained_variance(
        want_ret, batch.batch["values"], batch.batch["response_mask"]
    )
    for o in out:  # every rank reports the whole batch's numbers
        assert o["metrics"].keys() == want.keys()
        for key, value in want.items():
            assert o["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    # A shard-local computation gives different numbers: the statistics must be the whole batch's.
    local_adv, _ = compute_advantage(batch[:4], _algo(estimator), _custom if custom else None)
    assert not torch.allclose(local_adv, want_adv[:4], atol=1e-3)


def test_whitening_needs_two_valid_tokens():
    from rlflow.engine.advantage import distributed_masked_whiten

    with pytest.raises(ValueError, match="at least 2 valid response tokens"):
        distributed_masked_whiten(torch.ones(1, 3), torch.tensor([[1, 0, 0]]), None)
