"""The wheel ships the Hydra configs: after a non-editable install, ``python -m rlflow.trainer.main_ppo``
finds them from any working directory."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_finds_its_configs(tmp_path):
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(REPO), "--no-deps", "-w", str(wheel_dir)], check=True)
    wheel = glob.glob(str(wheel_dir / "rlflow-*.whl"))[0]
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), wheel], check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = "import rlflow.config.loading as c; print(c.config_dir())"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()).resolve().is_relative_to(target.resolve())
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlflow.trainer.main_ppo",
            "--config-name",
            "demo",
            "--cfg",
            "job",
            "algorithm.adv_estimator=grpo",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stderr[-2000:]
    assert "adv_estimator: grpo" in job.stdout
    assert "ppo_mini_batch_size: 4" in job.stdout  # demo.yaml on top of ppo_trainer.yaml, both in the wheel
