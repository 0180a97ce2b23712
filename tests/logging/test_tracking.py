"""Tracking backends, progress bar, summary table (rlflow.logging.tracking) and curves PNG (rlflow.logging.plot)."""

from __future__ import annotations

import glob
import io
import json
import math
import os
import struct
import sys
import types

import numpy as np
import pytest
import torch

from rlflow.logging.plot import plot_training_curves, read_jsonl_metrics
from rlflow.logging.tracking import (
    ProgressBar,
    Tracking,
    format_console_line,
    format_postfix,
    summary_table,
    wandb_mode,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

STEPS = [
    {"critic/score/mean": 0.1, "actor/pg_loss": 0.5, "critic/vf_loss": 2.0, "response_length/mean": 30.0},
    {"critic/score/mean": 0.9, "actor/pg_loss": -0.2, "critic/vf_loss": 1.0, "response_length/mean": 20.0},
    {"critic/score/mean": 0.7, "actor/pg_loss": 0.3, "critic/vf_loss": 1.5, "response_length/mean": 25.0},
]


def _png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


# ---- backends ----------------------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
    tracker = Tracking("p", "e", ["jsonl"], log_dir=str(tmp_path))
    tracker.log(
        {"critic/score/mean": 0.25, "perf/throughput": np.float32(12.5), "n": torch.tensor(3)}, step=1
    )
    tracker.log({"critic/score/mean": 0.75, "bad": float("nan")}, step=2)
    tracker.finish(plot=False)
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [
        {"step": 1, "critic/score/mean": 0.25, "perf/throughput": 12.5, "n": 3.0},
        {"step": 2, "critic/score/mean": 0.75, "bad": None},  # non-finite -> null (strict JSON)
    ]
    assert tracker.history[1]["step"] == 2 and math.isnan(tracker.history[1]["bad"])


def test_log_rejects_non_scalars_and_reserved_step(tmp_path):
    tracker = Tracking("p", "e", [], log_dir=str(tmp_path))
    with pytest.raises(ValueError, match="'vec'"):
        tracker.log({"vec": torch.ones(3)}, step=1)
    with pytest.raises(ValueError, match="'name'"):
        tracker.log({"name": "abc"}, step=1)
    with pytest.raises(ValueError, match="reserved"):
        tracker.log({"step": 3}, step=1)


def test_console_line_and_summary_at_finish(tmp_path):
    out = io.StringIO()
    tracker = Tracking("p", "e", ["console"], log_dir=str(tmp_path), stream=out)
    tracker.log({**STEPS[0], "val-core/easy/reward/mean@1": 0.125, "other/x": 9.0}, step=7)
    line = out.getvalue().strip()
    assert line == (
        "step 7 | score 0.1 | pg_loss 0.5 | vf_loss 2 | resp_len 30 | val-core/easy/reward/mean@1 0.125"
    )
    tracker.finish()
    printed = out.getvalue()
    assert printed.endswith(summary_table(tracker.history) + "\n")  # the table follows the step line
    assert "critic/score/mean" in summary_table(tracker.history)
    assert not os.path.exists(tmp_path / "metrics.jsonl")


def test_console_shows_everything_when_no_key_metric():
    assert (
        format_console_line({"custom/a": 1.5, "custom/b": 2.0}, step=3)
        == "step 3 | custom/a 1.5 | custom/b 2"
    )


def test_tensorboard_writes_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking("p", "e", ["tensorboard"], log_dir=str(tmp_path))
    for step, metrics in enumerate(STEPS, start=1):
        tracker.log(metrics, step=step)
    tracker.finish()
    files = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
    assert len(files) == 1 and os.path.getsize(files[0]) > 0
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("critic/score/mean")
    assert [e.step for e in events] == [1, 2, 3]
    assert [e.value for e in events] == pytest.approx([0.1, 0.9, 0.7], abs=1e-7)  # stored as fp32


def test_unknown_backend_names_the_config_key(tmp_path):
    with pytest.raises(ValueError, match=r"trainer\.logger.*clearml"):
        Tracking("p", "e", ["console", "clearml"], log_dir=str(tmp_path))


def test_missing_optional_backends_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r"trainer\.logger.*pip install tensorboard"):
        Tracking("p", "e", ["jsonl", "tensorboard"], log_dir=str(tmp_path))
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"trainer\.logger.*pip install wandb"):
        Tracking("p", "e", ["wandb"], log_dir=str(tmp_path))
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"trainer\.logger.*pip install mlflow"):
        Tracking("p", "e", ["mlflow"], log_dir=str(tmp_path))


class _FakeRun:
    def __init__(self, **kwargs):
        self.kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_wandb_offline_without_credentials(tmp_path, monkeypatch):
    runs = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    tracker = Tracking("proj", "exp", ["wandb"], config={"a": {"b": 1}}, log_dir=str(tmp_path))
    tracker.log({"critic/score/mean": 0.5}, step=4)
    tracker.finish()
    (run,) = runs
    assert run.kwargs == {
        "project": "proj",
        "name": "exp",
        "config": {"a": {"b": 1}},
        "dir": str(tmp_path),
        "mode": "offline",
    }
    assert run.logged == [(4, {"critic/score/mean": 0.5})] and run.finished


def test_wandb_mode_rules(tmp_path):
    no_netrc = str(tmp_path / "absent")
    assert wandb_mode({"NETRC": no_netrc}) == "offline"
    assert wandb_mode({"NETRC": no_netrc, "WANDB_MODE": "online"}) is None  # wandb reads it itself
    assert wandb_mode({"NETRC": no_netrc, "WANDB_API_KEY": "x" * 40}) is None
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    os.chmod(netrc_file, 0o600)
    assert wandb_mode({"NETRC": str(netrc_file)}) is None


# ---- progress bar and summary --------------------------------------------------------------------------------


def test_progress_bar_postfix():
    assert format_postfix({**STEPS[1], "x": 1.0}) == {
        "score": "0.9",
        "pg_loss": "-0.2",
        "vf_loss": "1",
        "resp_len": "20",
    }
    out = io.StringIO()
    with ProgressBar(total=3, file=out) as bar:
        bar.update(STEPS[0])
        bar.update(STEPS[1])
    text = out.getvalue()
    assert "2/3" in text and "score=0.9" in text and "resp_len=20" in text


def test_summary_table_first_last_best():
    history = [{"step": s, **m} for s, m in enumerate(STEPS, start=1)]
    history.append({"step": 4, "val-core/easy/reward/mean@1": 0.6})
    table = summary_table(history)
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:]}
    assert table.splitlines()[0].split() == ["metric", "first", "last", "best", "(step)"]
    assert rows["critic/score/mean"] == ["0.1", "0.7", "0.9", "(2)"]  # higher is better
    assert rows["critic/vf_loss"] == ["2", "1.5", "1", "(2)"]  # lower is better
    assert rows["actor/pg_loss"] == ["0.5", "0.3", "-"]  # no better direction
    assert rows["response_length/mean"] == ["30", "25", "-"]
    assert rows["val-core/easy/reward/mean@1"] == ["0.6", "0.6", "0.6", "(4)"]
    assert summary_table([]) == "no metrics logged"


# ---- curves PNG ------------------------------------------------------------------------------------------------


def _write_jsonl(path, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_plot_training_curves_writes_png(tmp_path):
    rows = [{"step": s, **m, "actor/ppo_kl": 0.01 * s} for s, m in enumerate(STEPS, start=1)]
    rows.insert(0, {"step": 0, "val-core/easy/reward/mean@1": 0.05})
    rows.append({"step": 3, "val-core/easy/reward/mean@1": 0.8})
    path = tmp_path / "metrics.jsonl"
    _write_jsonl(path, rows)
    out = plot_training_curves(path, tmp_path / "plots" / "curves.png")
    assert out == str(tmp_path / "plots" / "curves.png")
    assert os.path.getsize(out) > 0
    assert _png_size(out) == (1400, 700)  # 2 x 3 panels


def test_plot_skips_missing_series(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_jsonl(path, [{"step": 1, "critic/score/mean": 0.2}, {"step": 2, "critic/score/mean": 0.4}])
    out = plot_training_curves(path, tmp_path / "only_score.png")  # no loss, KL or length series
    assert _png_size(out) == (1400, 700)
    _write_jsonl(path, [{"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.5, "val/loss": 1.6}])
    assert _png_size(plot_training_curves(path, tmp_path / "sft.png")) == (1000, 700)  # the SFT figure: 2 x 2
    _write_jsonl(path, [{"step": 1, "note": "text only"}])
    with pytest.raises(ValueError, match="no numeric metric"):
        plot_training_curves(path, tmp_path / "empty.png")


def test_read_jsonl_last_line_of_a_step_wins(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "a": 1.0},
        {"step": 2, "a": 2.0},
        {"step": 2, "a": 5.0, "b": None},
        {"step": 3, "a": 3.0},
    ]
    _write_jsonl(path, rows)  # a resumed run re-logged step 2
    assert read_jsonl_metrics(path) == {"a": ([1, 2, 3], [1.0, 5.0, 3.0])}
    path.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        read_jsonl_metrics(path)


def test_finish_draws_curves_next_to_the_logs(tmp_path):
    tracker = Tracking("p", "e", ["jsonl"], log_dir=str(tmp_path / "run"))
    for step, metrics in enumerate(STEPS, start=1):
        tracker.log(metrics, step=step)
    tracker.finish()
    assert tracker.plot_path == str(tmp_path / "run" / "training_curves.png")
    assert _png_size(tracker.plot_path) == (1400, 700)
