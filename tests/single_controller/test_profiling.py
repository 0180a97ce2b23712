"""Step profiling on a worker (`rlflow.single_controller.profiling`): which ranks record, one trace per
step or per call, and which settings cover which method; every registered call passes the profiler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlflow.single_controller import Dispatch, Worker, register
from rlflow.single_controller.profiling import ProfileSelection


class _Worker(Worker):
    def __init__(self, selections: list[ProfileSelection]) -> None:
        super().__init__()
        self._selections = selections

    def profile_selections(self) -> list[ProfileSelection]:
        return self._selections

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def generate_sequences(self) -> float:
        a = torch.randn(64, 64)
        return float((a @ a).sum())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_actor(self) -> float:
        a = torch.randn(32, 32)
        return float((a @ a.T).trace())


def _events(path: str) -> list[str]:
    trace = json.loads(Path(path).read_text())
    return [e.get("name", "") for e in trace["traceEvents"]]


def _actor_rollout(rollout: ProfileSelection, actor: ProfileSelection) -> _Worker:
    """The actor-rollout worker's settings: the rollout's for generate_sequences, the actor's for the rest."""
    return _Worker(
        [ProfileSelection(**{**rollout.__dict__, "methods": frozenset({"generate_sequences"})}), actor]
    )


def test_discrete_traces_one_file_per_call_routed_by_method(tmp_path):
    worker = _actor_rollout(
        ProfileSelection(ranks=(0,), discrete=True), ProfileSelection(ranks=(0,), discrete=True)
    )
    assert worker.start_profile(3, str(tmp_path), "actor_rollout") is True
    worker.generate_sequences()
    worker.update_actor()
    worker.update_actor()
    files = worker.stop_profile()
    names = sorted(Path(f).name for f in files)
    assert names == [
        "actor_rollout_rank0_generate_sequences.json",
        "actor_rollout_rank0_update_actor.json",
        "actor_rollout_rank0_update_actor_2.json",
    ]
    assert all(Path(f).parent == tmp_path / "step_3" for f in files)
    assert any("mm" in name for name in _events(files[0]))  # the matmul of the call is in its trace
    # outside a profiled step nothing is written
    worker.update_actor()
    assert worker.stop_profile() == []
    assert len(list((tmp_path / "step_3").iterdir())) == 3


def test_continuous_trace_covers_the_whole_step(tmp_path):
    worker = _Worker([ProfileSelection(all_ranks=True, discrete=False)])
    worker.start_profile(1, str(tmp_path), "critic")
    worker.generate_sequences()
    worker.update_actor()
    (path,) = worker.stop_profile()
    assert Path(path) == tmp_path / "step_1" / "critic_rank0.json"
    assert sum("mm" in name for name in _events(path)) >= 2  # both calls' matmuls


def test_only_selected_ranks_and_methods_record(tmp_path):
    # rank 0 is in the actor's ranks only: its generate_sequences follows the rollout's settings (rank 1)
    worker = _actor_rollout(
        ProfileSelection(ranks=(1,), discrete=True), ProfileSelection(ranks=(0,), discrete=True)
    )
    worker.start_profile(2, str(tmp_path), "actor_rollout")
    worker.generate_sequences()
    worker.update_actor()
    assert [Path(f).name for f in worker.stop_profile()] == ["actor_rollout_rank0_update_actor.json"]
    nobody = _Worker([ProfileSelection(ranks=(1, 2))])
    assert nobody.start_profile(2, str(tmp_path / "none"), "ref") is False
    nobody.update_actor()
    assert nobody.stop_profile() == [] and not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.profile_steps=[0]"], "trainer.profile_steps: 0 must be >= 1"),
        (["trainer.profile_steps=[1]"], "trainer.profile_steps=[1] but no role selects a rank"),
        (["critic.profile_ranks=[2]"], "critic.profile_ranks: 2 must be in [0, 2)"),
    ],
)
def test_profile_keys_are_checked(overrides, message):
    from rlflow.config import load_config, validate_config

    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        validate_config(load_config(overrides, config_name="demo_two_ranks"))
