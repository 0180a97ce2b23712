"""``trainer.profile_steps`` in a PPO run on 2 ranks, with verl's per-role keys: the selected ranks of each
role write ``torch.profiler`` traces of the profiled step only, per call or per step as asked."""

from __future__ import annotations

import json

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

from .test_e2e import _overrides

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_profiled_step_writes_the_selected_traces(tmp_path):
    cfg = load_config(
        _overrides(
            tmp_path,
            "trainer.profile_steps=[2]",
            "actor_rollout_ref.actor.profile_ranks=[0]",
            "actor_rollout_ref.actor.profile_discrete=true",
            "actor_rollout_ref.rollout.profile_ranks=[1]",
            "actor_rollout_ref.rollout.profile_discrete=true",
            "critic.profile_ranks_all=true",  # continuous: one trace per rank for the whole step
        ),
        config_name="demo",
    )
    run_ppo(cfg)
    root = tmp_path / "logs" / "profile"
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]
    files = sorted(p.name for p in (root / "step_2").iterdir())
    assert files == [
        "actor_rollout_rank0_compute_log_prob.json",
        "actor_rollout_rank0_update_actor.json",
        "actor_rollout_rank1_generate_sequences.json",
        "critic_rank0.json",
        "critic_rank1.json",
    ]
    update = json.loads((root / "step_2" / "actor_rollout_rank0_update_actor.json").read_text())
    names = {e.get("name", "") for e in update["traceEvents"]}
    assert any("mm" in n for n in names) and any("backward" in n.lower() for n in names)
