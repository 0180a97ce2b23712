"""PF-PPO (``algorithm.use_pf_ppo``) in the trainer: the redrawn batch, the critic's future redrawn with
the same rows, and runs with and without a critic on a real local Ray."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlflow.algos.pf_ppo import pf_ppo_indices
from rlflow.config import load_config
from rlflow.config.schema import PFPPOConfig
from rlflow.protocol import DataProto, pad_dataproto_to_divisor
from rlflow.single_controller.decorator import _chunk_future, future_from_refs
from rlflow.trainer.main_ppo import run_ppo
from rlflow.trainer.pf_ppo import redraw_batch
from tests.trainer.test_e2e import _comparable, _overrides

pytestmark = pytest.mark.usefixtures("ray_session")


def _scored_batch(n: int) -> DataProto:
    scores = torch.zeros(n, 3)
    scores[:, -1] = torch.linspace(-1.0, 2.0, n)
    return DataProto.from_dict(
        {"row_id": torch.arange(n), "token_level_scores": scores, "attention_mask": torch.ones(n, 5)},
        non_tensors={"uid": np.array([f"u{i // 2}" for i in range(n)], dtype=object)},
    )


@pytest.mark.parametrize("order", [None, "reverse"])
def test_the_critics_future_is_redrawn_with_the_batchs_rows(order):
    """10 responses; the critic's output in 3 shards of 4 (2 rows of dispatch padding), as a
    data-parallel call returns it. After the redraw, each of 2 update ranks resolves exactly the
    advantages of the responses its chunk of the redrawn batch holds."""
    import ray

    n = 10
    batch = _scored_batch(n)
    critic_rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1])  # padding wraps to the first rows
    shards = [
        DataProto.from_dict({"advantages": critic_rows[i : i + 4, None].float().expand(4, 3).contiguous()})
        for i in (0, 4, 8)
    ]
    future = future_from_refs([ray.put(s) for s in shards], [4, 4, 4], pad_size=2)
    balance = (lambda b: list(range(len(b)))[::-1]) if order else (lambda b: None)

    drawn, adv, metrics = redraw_batch(
        batch, future, PFPPOConfig("pow", 1.0), seed=7, step=3, balance_order=balance
    )

    rows = pf_ppo_indices(batch.batch["token_level_scores"].sum(-1).numpy(), "pow", 1.0, 7, 3)
    if order:
        rows = rows[::-1]
    assert drawn.batch["row_id"].tolist() == rows.tolist() and len(adv) == n
    assert drawn.non_tensor_batch["uid"].tolist() == [f"u{i // 2}" for i in rows]
    assert metrics["pf_ppo/unique_fraction"] == len(set(rows.tolist())) / n
    assert metrics["pf_ppo/max_repeats"] == max(np.bincount(rows))
    # the scores are -1 .. 2 in steps of 1/3 (float32): the mean of the drawn rows' scores
    assert metrics["pf_ppo/score/mean"] == pytest.approx(float(np.mean(-1.0 + rows / 3.0)), abs=1e-6)

    padded, _ = pad_dataproto_to_divisor(drawn, 4)  # 4 update ranks: dispatch pads 10 rows to 12
    chunks, _ = _chunk_future(adv, 4)
    for data, part in zip(padded.chunk(4), chunks):
        got = part.resolve().batch["advantages"][:, 0].long()
        assert got.tolist() == data.batch["row_id"].tolist()
    # redrawing a redrawn future composes the rows; chunk() follows them too
    again = adv.take([9, 0, 0])
    assert again.get().batch["advantages"][:, 0].long().tolist() == [rows[9], rows[0], rows[0]]
    halves = adv.chunk(2)
    assert [h.get().batch["advantages"][:, 0].long().tolist() for h in halves] == [
        rows[:5].tolist(),
        rows[5:].tolist(),
    ]


def _pf_overrides(tmp_path: Path, *extra: str) -> list[str]:
    return _overrides(tmp_path, "algorithm.use_pf_ppo=true", *extra)  # test_e2e's, 2 steps unless extra says


@pytest.mark.slow
def test_pf_ppo_with_a_critic_trains_and_resumes_exactly(tmp_path):
    """GAE with a critic on 2 ranks, the updates overlapped (the values beside the reference, KL in the
    reward): max_min keeps only the best- and worst-scored responses; a run resumed after step 1 redraws
    the same rows at step 2."""
    common = [
        "algorithm.pf_ppo.reweight_method=max_min",
        "trainer.overlap_updates=true",
        "algorithm.use_kl_in_reward=true",
        "trainer.save_freq=1",
    ]
    full = run_ppo(
        load_config(
            _pf_overrides(tmp_path / "full", *common, "trainer.total_training_steps=2"), "demo_two_ranks"
        )
    )
    steps = {h["step"]: h for h in full["history"] if h["step"] > 0}
    assert sorted(steps) == [1, 2]
    for h in steps.values():
        for key in ("critic/vf_loss", "actor/pg_loss", "critic/advantages/mean"):
            assert math.isfinite(h[key]), key
        # the redrawn rows are the extremes only: their mean score lies between them, and fewer than
        # all 8 responses remain unless every score is an extreme
        lo, hi = h["critic/score/min"], h["critic/score/max"]
        assert lo - 1e-9 <= h["pf_ppo/score/mean"] <= hi + 1e-9
        if hi - lo > 1e-6:  # 8 rows, each the best or the worst: the mean is (k hi + (8 - k) lo) / 8
            k = 8 * (h["pf_ppo/score/mean"] - lo) / (hi - lo)
            assert abs(k - round(k)) < 1e-4, k
        assert 0 < h["pf_ppo/unique_fraction"] <= 1 and h["pf_ppo/max_repeats"] >= 1

    part = tmp_path / "part"
    run_ppo(load_config(_pf_overrides(part, *common, "trainer.total_training_steps=1"), "demo_two_ranks"))
    resumed = run_ppo(
        load_config(_pf_overrides(part, *common, "trainer.total_training_steps=2"), "demo_two_ranks")
    )
    got = {h["step"]: _comparable(h) for h in resumed["history"] if h["step"] > 0}
    want = _comparable(steps[2])
    assert sorted(got) == [2] and got[2].keys() == want.keys()
    for key, value in want.items():
        assert got[2][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


@pytest.mark.slow
def test_pf_ppo_without_a_critic(tmp_path):
    """GRPO, 4 responses per prompt sharing their prompt's forward: the driver redraws the batch with
    its advantages."""
    result = run_ppo(
        load_config(
            _pf_overrides(
                tmp_path,
                "trainer.total_training_steps=1",
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.rollout.n=4",
                "data.train_batch_size=4",
                "algorithm.pf_ppo.weight_pow=1.0",
            ),
            "demo_two_ranks",
        )
    )
    (h,) = [h for h in result["history"] if h["step"] == 1]
    assert math.isfinite(h["actor/pg_loss"]) and 0 < h["pf_ppo/unique_fraction"] <= 1
    assert h["critic/score/min"] - 1e-9 <= h["pf_ppo/score/mean"] <= h["critic/score/max"] + 1e-9
