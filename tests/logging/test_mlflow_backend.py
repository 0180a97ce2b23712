"""``trainer.logger=[..., mlflow]`` and ``trainer.log_system_metrics``, read back from a real MLflow store.

The store is MLflow's file store in the test's folder (``MLFLOW_TRACKING_URI=file:...``; MLflow 3 asks
for ``MLFLOW_ALLOW_FILE_STORE=true`` to write one), so nothing needs a server or a database.
"""

from __future__ import annotations

import importlib.util
import json

import psutil
import pytest

from rlflow.logging.mlflow_backend import flatten_params, mlflow_metric_name
from rlflow.logging.tracking import Tracking

mlflow = pytest.importorskip("mlflow")

CONFIG = {
    "trainer": {"logger": ["console", "mlflow"], "total_training_steps": 3, "log_dir": None},
    "algorithm": {"adv_estimator": "gae", "kl_ctrl": {"kl_coef": 0.001}},
    "data": {"prompt_key": "prompt", "empty": {}},
}


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    yield mlflow.MlflowClient(tracking_uri=uri)
    while mlflow.active_run() is not None:  # a failed test must not leave a run open for the next one
        mlflow.end_run()


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_names_and_parameters_follow_verls_spelling():
    assert mlflow_metric_name("val-core/arithmetic/acc/mean@4") == "val-core/arithmetic/acc/mean_at_4"
    assert mlflow_metric_name("timing_s/gen: a-b.c d") == "timing_s/gen: a-b.c d"  # all allowed
    assert mlflow_metric_name("timing_s/gen (ms)") == "timing_s/gen _ms_"
    assert mlflow_metric_name("reward[0]|x") == "reward_0__x"
    assert flatten_params(CONFIG) == {
        "trainer/logger": '["console", "mlflow"]',
        "trainer/total_training_steps": "3",
        "trainer/log_dir": "null",
        "algorithm/adv_estimator": "gae",
        "algorithm/kl_ctrl/kl_coef": "0.001",
        "data/prompt_key": "prompt",
        "data/empty": "{}",
    }
    long = flatten_params({"path": "x" * 7000})["path"]
    assert len(long) == 6000 and long.endswith("...")


def test_a_run_gets_the_config_every_steps_metrics_and_the_validation_samples(store, tmp_path):
    tracker = Tracking("my-project", "run-a", ["mlflow"], config=CONFIG, log_dir=str(tmp_path / "logs"))
    run_id = tracker.backends["mlflow"].run_id
    for step, score in enumerate([0.25, 0.5, 0.75], start=1):
        tracker.log({"critic/score/mean": score, "val-core/t/acc@2": 2 * score}, step=step)
    tracker.log_generations([{"prompt": "1+1", "response": "2", "score": 1.0}], step=3)
    tracker.finish()

    run = store.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert store.get_experiment(run.info.experiment_id).name == "my-project"
    assert run.data.params == flatten_params(CONFIG)
    assert _history(store, run_id, "critic/score/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert _history(store, run_id, "val-core/t/acc_at_2") == [(1, 0.5), (2, 1.0), (3, 1.5)]
    samples = json.loads(mlflow.artifacts.load_text(f"{run.info.artifact_uri}/val_generations/step_3.json"))
    assert samples == [{"prompt": "1+1", "response": "2", "score": 1.0}]


def test_inside_a_users_run_the_training_run_is_its_child_and_theirs_stays_open(store, tmp_path):
    with mlflow.start_run(run_name="sweep") as parent:
        tracker = Tracking("p", "child", ["mlflow"], log_dir=str(tmp_path))
        tracker.log({"actor/pg_loss": -0.5}, step=1)
        tracker.finish()
        assert mlflow.active_run().info.run_id == parent.info.run_id
    child = store.get_run(tracker.backends["mlflow"].run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.info.status == "FINISHED"


def test_mlflow_run_id_continues_a_run(store, tmp_path, monkeypatch):
    first = Tracking("p", "e", ["mlflow"], config=CONFIG, log_dir=str(tmp_path))
    first.log({"critic/vf_loss": 1.0}, step=1)
    first.finish()
    run_id = first.backends["mlflow"].run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)  # a resumed training run continues the same MLflow run
    second = Tracking("p", "e", ["mlflow"], config=CONFIG, log_dir=str(tmp_path))
    assert second.backends["mlflow"].run_id == run_id
    second.log({"critic/vf_loss": 0.5}, step=2)
    second.finish()
    assert _history(store, run_id, "critic/vf_loss") == [(1, 1.0), (2, 0.5)]


def test_system_metrics_go_with_every_step_to_every_backend(store, tmp_path):
    tracker = Tracking("p", "e", ["jsonl", "mlflow"], log_dir=str(tmp_path / "logs"), system_metrics=True)
    for step in (1, 2):
        sum(i * i for i in range(200_000))  # some CPU between the samples
        tracker.log({"actor/pg_loss": 0.1}, step=step)
    tracker.finish(plot=False)
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    total_mb = psutil.virtual_memory().total / 2**20
    for row in rows:
        assert 0.0 <= row["system/cpu_utilization_percentage"] <= 100.0
        assert 0.0 < row["system/system_memory_usage_megabytes"] < total_mb
        assert 0.0 < row["system/system_memory_usage_percentage"] < 100.0
        assert 0.0 < row["system/disk_usage_percentage"] <= 100.0
    run_id = tracker.backends["mlflow"].run_id
    logged = _history(store, run_id, "system/system_memory_usage_megabytes")
    assert [step for step, _ in logged] == [1, 2]
    assert [value for _, value in logged] == pytest.approx(
        [r["system/system_memory_usage_megabytes"] for r in rows]
    )


def test_without_a_tracking_uri_the_run_goes_to_the_log_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    log_dir = tmp_path / "logs"
    if importlib.util.find_spec("sqlalchemy") is None:  # mlflow-skinny: no database store to default to
        with pytest.raises(ImportError, match=r"MLFLOW_TRACKING_URI is not set.*pip install mlflow"):
            Tracking("p", "e", ["mlflow"], log_dir=str(log_dir))
        return
    tracker = Tracking("p", "e", ["mlflow"], log_dir=str(log_dir))
    tracker.log({"actor/pg_loss": 0.5}, step=1)
    tracker.finish()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{log_dir / 'mlflow.db'}")
    assert _history(client, tracker.backends["mlflow"].run_id, "actor/pg_loss") == [(1, 0.5)]
