"""What a person sees during and after a run: metric backends, a progress bar and a summary table.

``trainer.logger`` picks the backends of :class:`Tracking`:

* ``console``: one compact line per step with the key metrics (written through ``tqdm.write`` so it
  does not break a progress bar), and the summary table at :meth:`Tracking.finish`;
* ``jsonl``: one JSON object per step (``{"step": N, "<metric>": value, ...}``) appended to
  ``<log_dir>/metrics.jsonl``; non-finite values are written as ``null``. A resumed run appends to the
  same file (readers keep the last line of a step, see :func:`rlflow.logging.plot.read_jsonl_metrics`);
  at :meth:`Tracking.finish` the curves are drawn to ``<log_dir>/training_curves.png``;
* ``tensorboard``: scalars into ``<log_dir>/tensorboard`` (``torch.utils.tensorboard.SummaryWriter``);
* ``wandb``: a Weights & Biases run; offline (files under ``<log_dir>/wandb``, no network) unless
  ``WANDB_MODE`` is set or an API key is available (``WANDB_API_KEY`` or a ``~/.netrc`` login);
* ``mlflow``: an MLflow run (``MLFLOW_TRACKING_URI``, else ``<log_dir>/mlflow.db``;
  `rlflow.logging.mlflow_backend`).

With ``system_metrics=True`` (``trainer.log_system_metrics``) each step also carries the driver node's
CPU, memory, disk and GPU use (`rlflow.logging.system_metrics`).

Typical use in a training loop::

    tracker = Tracking(project, experiment, ["console", "jsonl"], config=cfg, log_dir=log_dir)
    with ProgressBar(total=total_steps) as bar:
        for step in range(1, total_steps + 1):
            metrics = train_step()
            tracker.log(metrics, step=step)
            bar.update(metrics)
    tracker.finish()  # summary table (console) and training_curves.png (jsonl)
"""

from __future__ import annotations

import json
import math
import netrc
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from tqdm.auto import tqdm

__all__ = [
    "CONSOLE_KEYS",
    "POSTFIX_KEYS",
    "SUPPORTED_BACKENDS",
    "ProgressBar",
    "Tracking",
    "format_console_line",
    "format_postfix",
    "run_log_dir",
    "summary_table",
    "wandb_mode",
]

SUPPORTED_BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")

# Metric -> short label shown on the console line (in this order), when present.
CONSOLE_KEYS: dict[str, str] = {
    "critic/score/mean": "score",
    "critic/rewards/mean": "reward",
    "actor/pg_loss": "pg_loss",
    "critic/vf_loss": "vf_loss",
    "critic/vf_explained_var": "ev",
    "actor/ppo_kl": "ppo_kl",
    "actor/kl_loss": "kl_loss",
    "actor/reward_kl_penalty": "kl_pen",
    "actor/entropy": "entropy",
    "response_length/mean": "resp_len",
    "response_length/clip_ratio": "clip",
    "perf/throughput": "tok/s",
    "timing_s/step": "step_s",
    # SFT
    "train/loss": "loss",
    "val/loss": "val_loss",
    "train/grad_norm": "grad_norm",
    "train/lr": "lr",
}

# Metric -> label in the progress bar postfix.
POSTFIX_KEYS: dict[str, str] = {
    "train/loss": "loss",
    "critic/score/mean": "score",
    "actor/pg_loss": "pg_loss",
    "critic/vf_loss": "vf_loss",
    "response_length/mean": "resp_len",
}

# Summary table rows: metric -> which direction is better (None: no "best").
_SUMMARY_KEYS: dict[str, str | None] = {
    "critic/score/mean": "max",
    "critic/rewards/mean": "max",
    "actor/pg_loss": None,  # the policy loss has no "better" direction across steps
    "critic/vf_loss": "min",
    "critic/vf_explained_var": "max",
    "actor/ppo_kl": None,
    "actor/kl_loss": None,
    "actor/entropy": None,
    "response_length/mean": None,
    "perf/throughput": "max",
    "timing_s/step": "min",
    "train/loss": "min",
    "val/loss": "min",
}


def run_log_dir(log_dir: str | None, project: str, experiment: str) -> str:
    """``trainer.log_dir``, or ``outputs/<project>/<experiment>`` when it is null."""
    return log_dir or os.path.join("outputs", str(project), str(experiment))


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _to_float(key: str, value: Any) -> float:
    """A logged value as a float: Python/numpy numbers, bools and one-element tensors or arrays."""
    if hasattr(value, "numel") and hasattr(value, "item"):  # torch.Tensor
        if value.numel() != 1:
            raise ValueError(
                f"tracking: metric {key!r} is a tensor of shape {tuple(value.shape)}, not a scalar"
            )
        return float(value.item())
    if hasattr(value, "size") and hasattr(value, "item"):  # numpy scalar or array
        if value.size != 1:
            raise ValueError(f"tracking: metric {key!r} is an array of size {value.size}, not a scalar")
        return float(value.item())
    if isinstance(value, bool | int | float):
        return float(value)
    raise ValueError(f"tracking: metric {key!r} has a non-numeric value of type {type(value).__name__}")


def format_console_line(data: Mapping[str, float], step: int) -> str:
    """``step N | score 0.5 | pg_loss -0.01 | ...``: the key metrics present, then ``val-core/*``.

    When none of :data:`CONSOLE_KEYS` nor a validation metric is present, every metric is shown.
    """
    parts = [f"{label} {_fmt(data[key])}" for key, label in CONSOLE_KEYS.items() if key in data]
    parts += [f"{key} {_fmt(data[key])}" for key in sorted(data) if key.startswith("val-core/")]
    if not parts:
        parts = [f"{key} {_fmt(value)}" for key, value in sorted(data.items())]
    return " | ".join([f"step {step}", *parts])


def format_postfix(data: Mapping[str, float]) -> dict[str, str]:
    """The progress bar postfix: :data:`POSTFIX_KEYS` present in ``data``, formatted to 4 digits."""
    return {label: _fmt(data[key]) for key, label in POSTFIX_KEYS.items() if key in data}


def summary_table(history: Sequence[Mapping[str, float]]) -> str:
    """A text table of the key metrics over a run: first, last and best (with its step).

    Args:
        history: one mapping per logged step, each with ``step`` (as :attr:`Tracking.history`).

    Returns:
        One row per key metric present (and per ``val-core/*`` metric): its first and last logged
        values, and for metrics with a better direction (higher score / reward / explained variance /
        throughput / validation, lower value loss / step time) the best value and its step; ``-``
        otherwise. ``"no metrics logged"`` for an empty history.
    """
    keys = dict(_SUMMARY_KEYS)
    for row in history:
        keys.update({k: "max" for k in row if k.startswith("val-core/") and k not in keys})
    rows = [("metric", "first", "last", "best (step)")]
    for key, direction in keys.items():
        points = [
            (int(r["step"]), float(r[key])) for r in history if key in r and math.isfinite(float(r[key]))
        ]
        if not points:
            continue
        best = "-"
        if direction is not None:
            pick = max if direction == "max" else min
            best_step, best_value = pick(points, key=lambda p: p[1])
            best = f"{_fmt(best_value)} ({best_step})"
        rows.append((key, _fmt(points[0][1]), _fmt(points[-1][1]), best))
    if len(rows) == 1:
        return "no metrics logged"
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class ProgressBar:
    """A tqdm bar over training steps whose postfix shows score, losses and response length.

    Args:
        total: number of steps.
        initial: steps already done (a resumed run).
        desc: label on the left of the bar.
        file: stream to draw on (default stderr).
        disable: turn the bar off (None: off when ``file`` is not a terminal, tqdm's rule).
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        desc: str = "training",
        file: TextIO | None = None,
        disable: bool | None = False,
    ) -> None:
        self.bar = tqdm(
            total=total, initial=initial, desc=desc, file=file, disable=disable, dynamic_ncols=True
        )

    def update(self, metrics: Mapping[str, float], n: int = 1) -> None:
        """Advance ``n`` steps and show ``metrics``' key values."""
        postfix = format_postfix(metrics)
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Console:
    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def log(self, data: Mapping[str, float], step: int) -> None:
        tqdm.write(format_console_line(data, step), file=self.stream or sys.stdout)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        lines = [f"validation generations at step {step}:"]
        for s in samples:
            lines.append(
                f"  [score {_fmt(float(s['score']))}] {s['prompt']!r:.160} -> {s['response']!r:.160}"
            )
        tqdm.write("\n".join(lines), file=self.stream or sys.stdout)

    def finish(self, history: Sequence[Mapping[str, float]]) -> None:
        if history:
            tqdm.write("\n" + summary_table(history), file=self.stream or sys.stdout)


class _Jsonl:
    def __init__(self, log_dir: str) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)

    def log(self, data: Mapping[str, float], step: int) -> None:
        row = {"step": int(step), **{k: (v if math.isfinite(v) else None) for k, v in data.items()}}
        self.file.write(json.dumps(row, allow_nan=False) + "\n")
        self.file.flush()

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        from rlflow.logging.rollout_viewer import dump_generations

        path = os.path.join(os.path.dirname(self.path), "val_generations.jsonl")
        extra = {k: [s[k] for s in samples] for k in samples[0] if k not in ("prompt", "response", "score")}
        dump_generations(
            path,
            step,
            [s["prompt"] for s in samples],
            [s["response"] for s in samples],
            [float(s["score"]) for s in samples],
            extra,
        )

    def finish(self, history: Sequence[Mapping[str, float]]) -> None:
        self.file.close()


class _TensorBoard:
    def __init__(self, log_dir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "trainer.logger contains 'tensorboard' but tensorboard is not installed: "
                "pip install tensorboard  (or pip install 'rlflow[logging]')"
            ) from e
        self.writer = SummaryWriter(log_dir=os.path.join(log_dir, "tensorboard"))

    def log(self, data: Mapping[str, float], step: int) -> None:
        for key, value in data.items():
            self.writer.add_scalar(key, value, global_step=step)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        rows = [f"| {float(s['score']):.4g} | {s['prompt']!r} | {s['response']!r} |" for s in samples]
        table = "| score | prompt | response |\n|---|---|---|\n" + "\n".join(rows)
        self.writer.add_text("val/generations", table, global_step=step)

    def finish(self, history: Sequence[Mapping[str, float]]) -> None:
        self.writer.flush()
        self.writer.close()


def _has_wandb_login(environ: Mapping[str, str]) -> bool:
    """An API key in the environment or a ``machine api.wandb.ai`` entry in the netrc file."""
    if environ.get("WANDB_API_KEY"):
        return True
    path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(environ: Mapping[str, str]) -> str | None:
    """``None`` (let wandb decide: ``WANDB_MODE`` or online) when ``WANDB_MODE`` is set or a login is
    available, else ``"offline"``: a run without credentials never tries the network."""
    if environ.get("WANDB_MODE") or _has_wandb_login(environ):
        return None
    return "offline"


class _Wandb:
    def __init__(self, project: str, experiment: str, config: dict | None, log_dir: str) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "trainer.logger contains 'wandb' but wandb is not installed: "
                "pip install wandb  (or pip install 'rlflow[logging]')"
            ) from e
        kwargs: dict[str, Any] = {"project": project, "name": experiment, "config": config, "dir": log_dir}
        mode = wandb_mode(os.environ)
        if mode is not None:
            kwargs["mode"] = mode
        os.makedirs(log_dir, exist_ok=True)
        self.run = wandb.init(**kwargs)

    def log(self, data: Mapping[str, float], step: int) -> None:
        self.run.log(dict(data), step=step)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        import wandb

        columns = list(samples[0])
        table = wandb.Table(columns=columns, data=[[s[c] for c in columns] for s in samples])
        self.run.log({"val/generations": table}, step=step)

    def finish(self, history: Sequence[Mapping[str, float]]) -> None:
        self.run.finish()


def _plain_config(config: Any) -> dict | None:
    """An OmegaConf / dataclass / mapping config as a plain dict (for wandb)."""
    if config is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:
        pass
    if hasattr(config, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(config)
    return dict(config)


class Tracking:
    """Send each step's metrics to the backends listed in ``trainer.logger``.

    Args:
        project_name: ``trainer.project_name``.
        experiment_name: ``trainer.experiment_name``.
        default_backend: ``trainer.logger``: a list of ``console``, ``jsonl``, ``tensorboard``, ``wandb``,
            ``mlflow`` (a single string is accepted).
        config: the run's config, recorded by wandb and mlflow.
        log_dir: folder of ``metrics.jsonl``, ``tensorboard/``, ``wandb/`` and the PNG; default
            ``outputs/<project_name>/<experiment_name>``.
        stream: where the console backend writes (default stdout).
        system_metrics: add the driver node's ``system/*`` use to every step (``trainer.log_system_metrics``).

    Raises:
        ValueError: an unknown backend name (the message names ``trainer.logger``).
        ImportError: tensorboard, wandb or mlflow requested but not installed (with the install command).
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | Sequence[str],
        config: Any = None,
        log_dir: str | None = None,
        stream: TextIO | None = None,
        system_metrics: bool = False,
    ) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(
                f"trainer.logger: unknown backend(s) {unknown}; supported: {list(SUPPORTED_BACKENDS)}"
            )
        self.log_dir = log_dir or os.path.join("outputs", project_name, experiment_name)
        self.history: list[dict[str, float]] = []
        self.plot_path: str | None = None
        self._finished = False
        self.backends: dict[str, Any] = {}
        self.system_metrics = None
        if system_metrics:
            from rlflow.logging.system_metrics import SystemMetrics

            self.system_metrics = SystemMetrics(self.log_dir)
        try:
            for name in dict.fromkeys(backends):  # de-duplicated, in order
                self.backends[name] = self._make_backend(name, project_name, experiment_name, config, stream)
        except Exception:
            for backend in self.backends.values():  # do not leave files open behind the error
                backend.finish(self.history)
            raise

    def _make_backend(
        self, name: str, project_name: str, experiment_name: str, config: Any, stream: TextIO | None
    ) -> Any:
        if name == "console":
            return _Console(stream)
        if name == "jsonl":
            return _Jsonl(self.log_dir)
        if name == "tensorboard":
            return _TensorBoard(self.log_dir)
        if name == "mlflow":
            from rlflow.logging.mlflow_backend import MLflowBackend

            return MLflowBackend(project_name, experiment_name, _plain_config(config), self.log_dir)
        return _Wandb(project_name, experiment_name, _plain_config(config), self.log_dir)

    @property
    def jsonl_path(self) -> str | None:
        """Path of ``metrics.jsonl`` when the jsonl backend is on."""
        backend = self.backends.get("jsonl")
        return backend.path if backend is not None else None

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Record ``data`` (metric name → scalar) as step ``step`` in every backend.

        Raises:
            ValueError: a value is not a scalar number, or ``data`` has a ``step`` key (reserved).
        """
        if "step" in data:
            raise ValueError("tracking: 'step' is reserved for the step number; rename the metric")
        row = {key: _to_float(key, value) for key, value in data.items()}
        if self.system_metrics is not None:
            row.update(self.system_metrics.sample())
        self.history.append({"step": int(step), **row})
        for backend in self.backends.values():
            backend.log(row, int(step))

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Record validation samples (``trainer.log_val_generations``): the console prints them,
        jsonl appends them to ``<log_dir>/val_generations.jsonl`` (``python scripts/view_rollouts.py``
        renders it), tensorboard adds a text table, wandb a ``val/generations`` table and mlflow the
        artifact ``val_generations/step_<N>.json``.

        Args:
            samples: dicts with ``prompt``, ``response``, ``score`` and optionally other fields (the same
                keys in every sample).
            step: training step of the validation.
        """
        if not samples:
            return
        for backend in self.backends.values():
            backend.log_generations(samples, int(step))

    def finish(self, plot: bool = True) -> None:
        """Close every backend; print the summary table (console) and draw the curves PNG (jsonl).

        Args:
            plot: draw ``<log_dir>/training_curves.png`` from ``metrics.jsonl`` (jsonl backend only).
                A plotting failure is reported as a warning, so it never fails a finished run.
        """
        if self._finished:
            return
        self._finished = True
        for backend in self.backends.values():
            backend.finish(self.history)
        if plot and self.jsonl_path is not None and self.history:
            from rlflow.logging.plot import plot_training_curves

            try:
                out = os.path.join(self.log_dir, "training_curves.png")
                self.plot_path = plot_training_curves(self.jsonl_path, out)
            except Exception as e:  # a figure must not fail a finished run; say why it is missing
                warnings.warn(f"tracking: could not draw the training curves: {e!r}", stacklevel=2)

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
