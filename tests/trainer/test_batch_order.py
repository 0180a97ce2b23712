"""The driver's order of a step's samples (`rlflow.trainer.batch_order`): with
``trainer.balance_keep_minibatch`` every actor rank's mini-batch ``k`` holds its share of the rows of the
batch's mini-batch ``k``, balanced among the ranks."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rlflow.config import load_config, validate_config
from rlflow.engine.seqlen_balancing import balance_mini_batches_across_dp
from rlflow.protocol import DataProto
from rlflow.trainer.batch_order import balance_order
from tests.config.keys import HEADS


def _batch(lengths: list[int], n: int) -> DataProto:
    mask = torch.zeros(len(lengths), 40, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    uid = np.array([f"p{i // n}" for i in range(len(lengths))], dtype=object)
    return DataProto.from_dict({"attention_mask": mask}, non_tensors={"uid": uid})


def test_each_mini_batch_keeps_its_rows_and_is_balanced_on_its_own():
    lengths = [30, 2, 3, 29, 10, 11, 12, 13, 1, 1, 1, 1, 40, 40, 20, 20]
    order = balance_mini_batches_across_dp(lengths, world_size=2, mini_batch_rows=4)
    per_rank = len(lengths) // 2
    for rank in range(2):
        chunk = order[rank * per_rank : (rank + 1) * per_rank].tolist()
        for k in range(4):  # the rank's k-th mini-batch (2 rows) comes from rows 4k..4k+3
            assert all(4 * k <= i < 4 * k + 4 for i in chunk[2 * k : 2 * k + 2])
    assert sorted(order.tolist()) == list(range(16))
    # mini-batch 0 = rows 0..3 (30, 2, 3, 29): balanced as {30, 2} and {3, 29}, not {30, 29} and {2, 3}
    first = {frozenset(order[r * per_rank : r * per_rank + 2].tolist()) for r in range(2)}
    assert first == {frozenset({0, 1}), frozenset({2, 3})}
    with pytest.raises(ValueError, match="must divide the batch"):
        balance_mini_batches_across_dp(lengths, world_size=2, mini_batch_rows=6)


@pytest.mark.parametrize("keep_minibatch", [False, True])
def test_balance_order_from_the_config(keep_minibatch: bool):
    """4 prompts x 2 samples, mini-batches of 2 prompts on 2 ranks (one prompt per rank and mini-batch): a
    prompt's samples stay together; with keep_minibatch the first mini-batch trains prompts 0 and 1."""
    cfg = load_config(
        [
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            f"trainer.balance_keep_minibatch={keep_minibatch}",
        ],
        config_name="demo_two_ranks",
    )
    lengths = [40, 40, 1, 1, 39, 39, 2, 2]  # prompt token counts 80, 2, 78, 4: mini-batches {0, 1}, {2, 3}
    order = balance_order(_batch(lengths, 2), cfg, dp_size=2)
    assert all(order[i] // 2 == order[i + 1] // 2 for i in range(0, 8, 2))  # a prompt's samples side by side
    prompts = [order[i] // 2 for i in range(0, 8, 2)]  # rank 0: prompts[0:2], rank 1: prompts[2:4]
    first_update = {prompts[0], prompts[2]}  # each rank's first mini-batch is its first prompt
    if keep_minibatch:  # 80 | 2 and 78 | 4 tokens per update
        assert first_update == {0, 1} and {prompts[1], prompts[3]} == {2, 3}
    else:  # the whole batch balanced (82 tokens per rank): the first update trains prompts 0 and 2
        assert prompts == [0, 1, 2, 3] and first_update == {0, 2}
    assert balance_order(_batch(lengths, 2), load_config(["trainer.balance_batch=false"]), 2) is None


def test_keep_minibatch_needs_a_balanced_batch():
    cfg = load_config(
        ["trainer.balance_batch=false", "trainer.balance_keep_minibatch=true"], config_name="demo_two_ranks"
    )
    with pytest.raises(ValueError, match=re.escape("trainer.balance_keep_minibatch=true orders the rows")):
        validate_config(cfg, **HEADS)
