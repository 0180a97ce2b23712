"""Hydra options anywhere on the command line: the entry points move them before the overrides."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlflow.trainer.cli import hydra_options_first, split_config_name


def test_options_move_to_the_front_with_their_values():
    args = ["ray_init.address=a:1", "--config-name", "demo", "trainer.test_freq=-1", "--cfg", "job", "-m"]
    assert hydra_options_first(args) == [
        "--config-name", "demo", "--cfg", "job", "-m", "ray_init.address=a:1", "trainer.test_freq=-1",
    ]  # fmt: skip
    assert hydra_options_first(["x=1", "--config-name=demo", "~y"]) == ["--config-name=demo", "x=1", "~y"]


def test_the_config_name_is_split_off_in_every_spelling():
    assert split_config_name(["a=1", "-cn", "demo", "b=2"]) == ("demo", ["a=1", "b=2"])
    assert split_config_name(["--config-name=demo"]) == ("demo", [])
    assert split_config_name(["a=1"]) == (None, ["a=1"])
    with pytest.raises(ValueError, match="--config-name needs a config name"):
        split_config_name(["a=1", "--config-name"])


@pytest.mark.parametrize("module", ["rlflow.trainer.main_ppo", "rlflow.trainer.main_sft"])
def test_an_option_between_overrides_composes(module):
    """What the Slurm script passes: its own overrides, then the user's, which may hold --config-name."""
    name = ["--config-name", "demo"] if module.endswith("ppo") else []
    args = ["trainer.total_training_steps=7", *name, "--cfg", "job", "trainer.seed=5"]
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "total_training_steps: 7" in proc.stdout and "seed: 5" in proc.stdout
    if name:
        assert "train_batch_size: 16" in proc.stdout  # demo.yaml's value, not verl's 1024
