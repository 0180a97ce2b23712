"""``ray_init.runtime_env`` (verl's ``ray_kwargs.ray_init.runtime_env``): its ``env_vars`` reach every
worker process, also when Ray was started before the trainer (here: the test session's Ray)."""

from __future__ import annotations

import os

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import build_trainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_runtime_env_vars_reach_every_role(tmp_path):
    cfg = load_config(
        [
            "+ray_kwargs.ray_init.runtime_env.env_vars.RLFLOW_TEST_MARK=from-the-command-line",
            "+ray_kwargs.ray_init.runtime_env.env_vars.TEST_NUMBER=7",
            "ray_kwargs.ray_init.runtime_env.py_executable=null",  # verl's generated default: dropped
            "algorithm.use_kl_in_reward=true",  # a reference group too
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path / 'logs'}",
        ],
        config_name="demo_two_ranks",
    )
    trainer = build_trainer(cfg)
    try:
        trainer.init_workers()
        seen = {
            name: group.execute_fn(
                lambda _w: (os.environ.get("RLFLOW_TEST_MARK"), os.environ.get("TEST_NUMBER"))
            )
            for name, group in (
                ("actor", trainer.groups.actor),
                ("critic", trainer.groups.critic),
                ("ref", trainer.groups.ref),
            )
        }
    finally:
        trainer.shutdown()
    for name, values in seen.items():
        assert values == [("from-the-command-line", "7")] * 2, name
