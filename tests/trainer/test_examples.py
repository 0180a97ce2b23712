"""The library-use example under examples/ runs as written (slow: a real 2-step PPO run)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ppo_in_python.py"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_ppo_in_python_example(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(EXAMPLE), run_name="__main__")
    history = namespace["result"]["history"]
    assert [row["step"] for row in history] == [0, 1, 2]  # validation before training, then 2 steps
    assert "critic/vf_loss" in history[-1]
    assert (tmp_path / "outputs" / "notebook" / "metrics.jsonl").is_file()
    assert "validation score:" in capsys.readouterr().out
