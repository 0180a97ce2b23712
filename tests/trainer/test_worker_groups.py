"""The order in which the roles build their models (`rlflow.trainer.worker_groups.init_batches`)."""

from __future__ import annotations

from rlflow.trainer.worker_groups import init_batches


def test_a_vllm_actor_builds_alone_first_everything_else_together():
    roles = ["actor", "ref", "critic"]  # init_batches only orders the groups
    assert init_batches(roles, "vllm") == [["actor"], ["ref", "critic"]]
    assert init_batches(roles, "hf") == [roles]
    assert init_batches(["actor"], "vllm") == [["actor"]]
