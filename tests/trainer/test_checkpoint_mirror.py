"""``trainer.default_hdfs_dir``: every complete checkpoint copied to a second root with its own pointer.

The end-to-end PPO run that saves through the copy and resumes from it is
``tests/trainer/test_e2e.py::test_exact_resume_at_epoch_boundary``; the SFT one is in
``tests/trainer/test_sft_trainer.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rlflow.config import load_config
from rlflow.config.validate import validate_config
from rlflow.utils.checkpoint_files import CheckpointMirror, check_mirror_destination

# An `hdfs` command for the test: `dfs -mkdir -p URL` and `dfs -put -f SRC URL` on a local directory that
# stands for the cluster (hdfs://nn/<path> -> $FAKE_HDFS_ROOT/<path>); each call appended to a log.
FAKE_HDFS = """#!/usr/bin/env bash
set -euo pipefail
echo "$*" >> "$FAKE_HDFS_ROOT/calls.log"
local_of() { echo "$FAKE_HDFS_ROOT/${1#hdfs://nn/}"; }
[ "$1" = dfs ] || exit 2
case "$2" in
  -mkdir) mkdir -p "$(local_of "$4")" ;;
  -put) dst="$(local_of "$5")"; if [ -d "$dst" ]; then cp -r "$4" "$dst/"; else cp -r "$4" "$dst"; fi ;;
  *) exit 2 ;;
esac
"""


def _step_dir(root: Path, step: int) -> Path:
    step_dir = root / f"global_step_{step}"
    (step_dir / "actor").mkdir(parents=True)
    (step_dir / "actor" / "model_rank0.pt").write_bytes(bytes(range(256)) * step)
    (step_dir / "trainer_state.pt").write_bytes(b"state %d" % step)
    return step_dir


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_local_copy_is_byte_identical_keeps_every_step_and_points_at_the_latest(tmp_path):
    local, dest = tmp_path / "ckpt", tmp_path / "copy"
    mirror = CheckpointMirror(f"file://{dest}")
    assert mirror.copy(_step_dir(local, 2), 2) == str(dest / "global_step_2")
    assert (dest / "latest_checkpointed_iteration.txt").read_text() == "2"
    mirror.copy(_step_dir(local, 4), 4)
    assert (dest / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert _files(dest / "global_step_2") == _files(local / "global_step_2")
    assert _files(dest / "global_step_4") == _files(local / "global_step_4")
    # A re-save of the same step (a resumed run) overwrites the copy's files.
    (local / "global_step_4" / "trainer_state.pt").write_bytes(b"again")
    mirror.copy(local / "global_step_4", 4)
    assert (dest / "global_step_4" / "trainer_state.pt").read_bytes() == b"again"


def test_an_hdfs_copy_runs_hdfs_dfs_put_then_the_pointer(tmp_path, monkeypatch):
    bin_dir, cluster = tmp_path / "bin", tmp_path / "cluster"
    bin_dir.mkdir()
    cluster.mkdir()
    hdfs = bin_dir / "hdfs"
    hdfs.write_text(FAKE_HDFS)
    hdfs.chmod(hdfs.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_HDFS_ROOT", str(cluster))
    check_mirror_destination("hdfs://nn/runs/ckpt", str(tmp_path / "ckpt"))  # the command is found

    step_dir = _step_dir(tmp_path / "ckpt", 3)
    assert CheckpointMirror("hdfs://nn/runs/ckpt/").copy(step_dir, 3) == "hdfs://nn/runs/ckpt/global_step_3"
    calls = (cluster / "calls.log").read_text().splitlines()
    assert calls[0] == "dfs -mkdir -p hdfs://nn/runs/ckpt"
    assert calls[1] == f"dfs -put -f {step_dir} hdfs://nn/runs/ckpt"
    assert calls[2].startswith("dfs -put -f ") and calls[2].endswith(
        " hdfs://nn/runs/ckpt/latest_checkpointed_iteration.txt"
    )
    assert len(calls) == 3
    assert _files(cluster / "runs" / "ckpt" / "global_step_3") == _files(step_dir)
    assert (cluster / "runs" / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"

    # A failing command stops the run with its output (the local checkpoint is complete by then).
    monkeypatch.setenv("FAKE_HDFS_ROOT", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match=r"hdfs dfs -mkdir -p hdfs://nn/runs/ckpt` failed"):
        CheckpointMirror("hdfs://nn/runs/ckpt").copy(step_dir, 3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", r"trainer\.default_hdfs_dir='': give a directory"),
        ("s3://bucket/ckpt", r"trainer\.default_hdfs_dir='s3://bucket/ckpt': copies go to a local"),
        ("hdfs://nn/ckpt", r"there is no hdfs command on PATH"),
        ("{local}", r"is trainer\.default_local_dir itself"),
    ],
)
def test_destinations_the_copy_cannot_use_are_refused_before_ray(tmp_path, monkeypatch, value, message):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    local = tmp_path / "ckpt"
    cfg = load_config(
        [f"trainer.default_local_dir={local}", f"trainer.default_hdfs_dir='{value.format(local=local)}'"],
        config_name="demo_two_ranks",
    )
    with pytest.raises(ValueError, match=message):
        validate_config(cfg)
