"""The ``mlflow`` backend of `rlflow.logging.tracking.Tracking` (``trainer.logger=[..., mlflow]``).

As in verl: the MLflow experiment is ``trainer.project_name``, the run is named
``trainer.experiment_name``, the whole config is logged as the run's parameters (nested keys joined
with ``/``) and every step's metrics with ``step=N``, ``@`` in a metric name written ``_at_`` (MLflow
names take letters, digits, ``_ - . / : `` and spaces; any other character becomes ``_``).

Where the run goes: ``MLFLOW_TRACKING_URI`` when it is set (a tracking server ``http://...``, a database,
...), else an SQLite store ``<log_dir>/mlflow.db`` with artifacts under ``<log_dir>/mlartifacts``
(``mlflow ui --backend-store-uri sqlite:///<log_dir>/mlflow.db`` shows it), which needs the full
``mlflow`` package; ``mlflow-skinny`` can log to a server. As with ``mlflow.start_run``,
``MLFLOW_RUN_ID`` continues an existing run (a resumed training run: the parameters it has stay), and
inside an active MLflow run of the same store (a notebook's ``with mlflow.start_run():``) the training
run is its nested child; MLflow's global state (active run, tracking URI) is left as it was. Validation
samples (``trainer.log_val_generations``) become the artifact ``val_generations/step_<N>.json``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MLflowBackend", "flatten_params", "mlflow_metric_name"]

logger = logging.getLogger(__name__)

_BAD_CHARS = re.compile(r"[^/\w.\- :]")
_PARAM_CHUNK, _METRIC_CHUNK, _PARAM_MAX_CHARS = 100, 1000, 6000  # MLflow's limits per call / per value


def mlflow_metric_name(name: str) -> str:
    """``name`` as MLflow accepts it: ``@`` → ``_at_`` (verl's spelling), other bad characters → ``_``."""
    return _BAD_CHARS.sub("_", name.replace("@", "_at_"))


def flatten_params(config: Mapping[str, Any] | None, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow parameters: ``{"trainer/logger": '["console", "mlflow"]', ...}``.

    Nested mappings are joined with ``/``; lists and other values are written as JSON (strings as they
    are); a value longer than MLflow's 6000 characters is cut there, ending in ``...``.
    """
    out: dict[str, str] = {}
    for key, value in (config or {}).items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, path))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > _PARAM_MAX_CHARS:
            text = text[: _PARAM_MAX_CHARS - 3] + "..."
        out[mlflow_metric_name(path)] = text
    return out


def _default_tracking_uri(log_dir: str) -> str:
    if importlib.util.find_spec("sqlalchemy") is None:
        raise ImportError(
            "trainer.logger contains 'mlflow' and MLFLOW_TRACKING_URI is not set: the default store "
            f"sqlite:///{os.path.abspath(log_dir)}/mlflow.db needs the full package (pip install mlflow); "
            "with mlflow-skinny set MLFLOW_TRACKING_URI to a tracking server"
        )
    return f"sqlite:///{os.path.abspath(os.path.join(log_dir, 'mlflow.db'))}"


def _run_tags(mlflow: Any, uri: str) -> dict[str, str]:
    """The tags ``mlflow.start_run`` would set (source, user, git commit), and the active run of the same
    store as the parent: the training run is created through the client, leaving MLflow's global state
    (active run, tracking URI) as the user set it."""
    tags: dict[str, str] = {}
    parent = mlflow.active_run()
    if parent is not None and mlflow.get_tracking_uri() == uri:
        tags["mlflow.parentRunId"] = parent.info.run_id
    try:
        from mlflow.tracking.context.registry import resolve_tags

        return resolve_tags(tags)
    except ImportError:  # the context registry moved: the run goes without MLflow's context tags
        return tags


class MLflowBackend:
    """One MLflow run for a training run (see the module docstring for where it goes).

    Args:
        project: experiment name (``trainer.project_name``).
        experiment: run name (``trainer.experiment_name``).
        config: the run's config as a plain nested dict (logged as parameters), or None.
        log_dir: the run's log folder (the default store's place).

    Raises:
        ImportError: mlflow is not installed, or the default store needs what mlflow-skinny lacks.
    """

    def __init__(self, project: str, experiment: str, config: Mapping[str, Any] | None, log_dir: str) -> None:
        try:
            import mlflow
        except ImportError as e:
            raise ImportError(
                "trainer.logger contains 'mlflow' but mlflow is not installed: pip install mlflow "
                "(or mlflow-skinny to log to a tracking server)"
            ) from e
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        own_store = not uri
        if own_store:
            os.makedirs(log_dir, exist_ok=True)
            uri = _default_tracking_uri(log_dir)
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(project)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            artifacts = Path(os.path.abspath(log_dir), "mlartifacts").as_uri() if own_store else None
            experiment_id = self.client.create_experiment(project, artifact_location=artifacts)
        continued = os.environ.get("MLFLOW_RUN_ID")
        if continued:  # as mlflow.start_run: continue that run; it keeps the parameters it has
            self.run_id = continued
            self.client.update_run(continued, status="RUNNING")
            logged = self.client.get_run(continued).data.params
        else:
            self.run_id = self.client.create_run(
                experiment_id, run_name=experiment, tags=_run_tags(mlflow, uri)
            ).info.run_id
            logged = {}
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten_params(config).items() if k not in logged]
        for i in range(0, len(params), _PARAM_CHUNK):
            self.client.log_batch(self.run_id, params=params[i : i + _PARAM_CHUNK])
        logger.info("mlflow: run %s of experiment %r at %s", self.run_id, project, uri)

    def log(self, data: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_metric_name(k), float(v), now, int(step)) for k, v in data.items()]
        for i in range(0, len(metrics), _METRIC_CHUNK):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _METRIC_CHUNK])

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        text = json.dumps([dict(s) for s in samples], indent=1, default=str)
        self.client.log_text(self.run_id, text, f"val_generations/step_{int(step)}.json")

    def finish(self, history: Sequence[Mapping[str, float]]) -> None:
        self.client.set_terminated(self.run_id)
