"""Scoring in worker processes with a per-sample timeout (spawned processes: a few seconds)."""

from __future__ import annotations

import time

import pytest

from rlflow.models.tiny import build_tiny_tokenizer
from rlflow.reward.custom import load_custom_reward_fn
from rlflow.reward.naive import NaiveRewardManager

from .test_naive import make_batch

SLOW = """
import time

def score(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth == "hang":
        time.sleep(60)
    if ground_truth == "boom":
        raise ValueError("scorer exploded")
    return {"score": float(len(solution_str)), "acc": 1.0}
"""


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "slow.py"
    path.write_text(SLOW)
    fn = load_custom_reward_fn(str(path), "score")
    m = NaiveRewardManager(
        build_tiny_tokenizer(), 0, compute_score=fn, num_workers=2, timeout_s=2.0, timeout_score=-1.0
    )
    yield m
    m.close()


def test_timeout_scores_configured_value_and_is_counted(manager):
    start = time.monotonic()
    out = manager(make_batch(ground_truths=("a", "b", "hang", "c")), return_dict=True)
    assert time.monotonic() - start < 40
    # decoded responses: "cccc", "cc", "x" (hangs), "####4"; score = len(response)
    assert out["reward_tensor"][:, -1].tolist() == [4.0, 0.0, 0.0, 5.0]
    assert out["reward_tensor"][1, 2] == 2.0 and out["reward_tensor"][2, 0] == -1.0
    info = out["reward_extra_info"]
    assert info["score"] == [4.0, 2.0, -1.0, 5.0]
    assert info["acc"] == [1.0, 1.0, -1.0, 1.0]
    assert info["reward_timeout"] == [0.0, 0.0, 1.0, 0.0]
    assert manager.num_timeouts == 1
    # the killed worker was replaced: the pool keeps working
    again = manager(make_batch(ground_truths=("a", "b", "c", "d")), return_dict=True)
    assert again["reward_extra_info"]["reward_timeout"] == [0.0] * 4 and manager.num_timeouts == 1


def test_worker_error_names_sample(manager):
    with pytest.raises(RuntimeError, match=r"failed on sample 1 in a scoring process:(.|\n)*scorer exploded"):
        manager(make_batch(ground_truths=("a", "boom", "c", "d")))
