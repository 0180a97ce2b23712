"""``scripts/gpu_check.py``'s self-check: what it does without a GPU, on a machine without Ray or Hydra.

On a GPU machine the script is the check; here it must (1) parse its arguments and SKIP every check when
no CUDA device is visible, (2) run the checks that do not need CUDA on the CPU and pass them — with Ray,
Hydra and OmegaConf made unimportable in every process it starts, as they may be on the GPU machine — and
(3) build the same typed config as the Hydra composition does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_check  # noqa: E402

BLOCKER = """
import importlib.abc, sys

class _Unavailable(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "hydra", "omegaconf"):
            raise ImportError(f"{name} is not installed on this (simulated GPU) machine")
        return None

sys.meta_path.insert(0, _Unavailable())
"""


def _run(tmp_path: Path, *args: str, block: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if block:  # sitecustomize runs at start-up in this process and in every process it spawns
        (tmp_path / "sitecustomize.py").write_text(BLOCKER)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, json.loads(out.read_text()) if out.exists() else {}


def test_without_cuda_every_check_is_skipped(tmp_path: Path):
    proc, report = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r[0] for r in report["rows"]] == list(gpu_check.CHECKS)
    assert {(r[1], r[2]) for r in report["rows"]} == {("SKIP", "no CUDA device visible to torch")}
    assert "| update_bf16_rmpad | SKIP |" in proc.stdout


def test_unknown_check_is_refused():
    with pytest.raises(SystemExit) as exc:
        gpu_check.parse_args(["--only", "nope"])
    assert exc.value.code == 2
    assert gpu_check.parse_args(["--device", "cpu", "--only", "vllm"]).only == ["vllm"]


@pytest.mark.timeout(600)
def test_checks_run_on_cpu_without_ray_hydra_or_omegaconf(tmp_path: Path):
    proc, report = _run(tmp_path, "--device", "cpu", block=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r[0]: (r[1], r[2]) for r in report["rows"]}
    cuda_only = {"flash_attn_varlen", "cpu_offload", "vllm_rollout"}
    assert {name for name, (status, _) in rows.items() if status == "SKIP"} == cuda_only
    assert {status for name, (status, _) in rows.items() if name not in cuda_only} == {"PASS"}
    assert set(rows) == cuda_only | {
        "update_bf16_rmpad",
        "logprob_vs_rollout_bf16",
        "logprob_vs_rollout_fp32",
        "hf_rollout",
        "reward_model",
        "gradient_checkpointing",
    }
    assert report["environment"]["device"] == "cpu"


def _override(key: str, value: object) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


@pytest.mark.parametrize(
    "overrides",
    [
        gpu_check.check_overrides(),
        gpu_check.check_overrides(**gpu_check.bf16(gpu_check.ACTOR, gpu_check.CRITIC)),
        gpu_check.check_overrides(**{"actor_rollout_ref.model.enable_gradient_checkpointing": True}),
        gpu_check.check_overrides(**{"reward_model.enable": True, "reward_model.model.path": "/rm"}),
    ],
    ids=["defaults", "bf16", "gc", "rm"],
)
def test_plain_config_equals_the_hydra_composition(overrides):
    from rlflow.config import load_config, to_typed

    composed = to_typed(load_config([_override(k, v) for k, v in overrides.items()]))
    assert dataclasses.asdict(gpu_check.plain_config(overrides)) == dataclasses.asdict(composed)


def test_plain_config_refuses_unknown_keys():
    with pytest.raises(AttributeError, match=r"critic\.nope is not a config key"):
        gpu_check.plain_config({"critic.nope": 1})
