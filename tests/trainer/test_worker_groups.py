"""The order in which the roles build their models (`init_batches`) and the threads of overlapped updates
(`overlap_threads`), `rlflow.trainer.worker_groups`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlflow.config import load_config, to_typed, validate_config
from rlflow.single_controller import RayResourcePool
from rlflow.trainer.worker_groups import WorkerGroups, init_batches, overlap_threads


def test_a_vllm_actor_builds_alone_first_everything_else_together():
    roles = ["actor", "ref", "critic"]  # init_batches only orders the groups
    assert init_batches(roles, "vllm") == [["actor"], ["ref", "critic"]]
    assert init_batches(roles, "hf") == [roles]
    assert init_batches(["actor"], "vllm") == [["actor"]]


def _typed(*overrides: str):
    return to_typed(load_config(["trainer.device=cpu", *overrides], config_name="demo"))


def _groups(cpus: float, actor_ranks: int = 1, critic_ranks: int | None = 1):
    pool = RayResourcePool([actor_ranks], cpus_per_bundle=cpus, max_colocate_count=2)  # no Ray call here
    critic = None if critic_ranks is None else SimpleNamespace(world_size=critic_ranks)
    return WorkerGroups(pool=pool, actor=SimpleNamespace(world_size=actor_ranks), critic=critic)


def test_overlapped_updates_split_the_threads_of_a_bundle_where_that_helps(monkeypatch):
    """``trainer.overlap_updates``: null = on for CPU runs with a critic on the actor's ranks and at least
    2 threads per rank (the default CPU layout), the threads split ceil / floor; true = on for every CPU run
    with a critic; false = off; never on a GPU."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    auto, on, off = _typed(), _typed("trainer.overlap_updates=true"), _typed("trainer.overlap_updates=false")
    assert overlap_threads(auto, _groups(2.0)) == (1, 1)
    assert overlap_threads(auto, _groups(3.0)) == (2, 1)
    assert overlap_threads(auto, _groups(1.0)) is None  # single-thread ranks: nothing to split
    assert overlap_threads(on, _groups(1.0)) == (1, 1)
    assert (
        overlap_threads(auto, _groups(2.0, actor_ranks=2, critic_ranks=1)) is None
    )  # a bundle without critic
    assert overlap_threads(on, _groups(2.0, actor_ranks=2, critic_ranks=1)) == (1, 1)
    assert overlap_threads(off, _groups(2.0)) is None
    assert overlap_threads(auto, _groups(2.0, critic_ranks=None)) is None  # GRPO: one update
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the driver's explicit thread count wins (cpu_threads)
    assert overlap_threads(auto, _groups(2.0)) == (2, 2)
    gpu = _typed("trainer.device=cuda")
    assert overlap_threads(gpu, _groups(2.0)) is None
    gpu.trainer.overlap_updates = True  # trainer.device=auto that found a GPU: refused at start
    with pytest.raises(ValueError, match=r"trainer.overlap_updates=true .* computes on the GPU"):
        overlap_threads(gpu, _groups(2.0))
    with pytest.raises(ValueError, match=r"trainer.overlap_updates=true .* trainer.device=cuda"):
        validate_config(
            load_config(["trainer.device=cuda", "trainer.overlap_updates=true"], config_name="demo")
        )
