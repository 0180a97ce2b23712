"""Training curves from a ``metrics.jsonl`` file as one PNG: score, losses, KL, response length.

Drawn with matplotlib's object-oriented API on an Agg canvas (no display, no pyplot global state, so it
works on a headless node and does not change the backend of a notebook that calls it).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["PANELS", "plot_training_curves", "read_jsonl_metrics"]

Series = dict[str, tuple[list[int], list[float]]]

# (title, metric names); ``val-`` metrics are added to the score panel.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("score", ("critic/score/mean",)),
    ("losses", ("actor/pg_loss", "critic/vf_loss")),
    ("KL", ("actor/ppo_kl", "actor/kl_loss", "critic/kl", "actor/reward_kl_penalty")),
    (
        "clipping and value fit",
        ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac", "critic/vf_explained_var"),
    ),
    ("entropy", ("actor/entropy",)),
    ("response length", ("response_length/mean",)),
)
"""The PPO figure: one panel per (title, metrics); the score panel adds the validation curves."""

SFT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("train/loss", "val/loss")),
    ("gradient norm", ("train/grad_norm",)),
    ("learning rate", ("train/lr",)),
    ("throughput (tokens/s)", ("perf/throughput",)),
)
"""The SFT figure (chosen when the metrics have ``train/loss``)."""
_MAX_VAL_SERIES = 8


def read_jsonl_metrics(jsonl_path: str | os.PathLike) -> Series:
    """Read one JSON object per line (each with ``step``) into ``metric -> (steps, values)``.

    Steps are sorted; lines of the same step are merged, and when a metric is logged more than once for
    a step (a resumed run appends to the same file) the last value wins. ``null``, non-finite and
    non-numeric values are skipped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not a JSON object with an integer ``step`` (the line number is named).
    """
    by_step: dict[int, dict[str, float]] = {}
    with open(jsonl_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{jsonl_path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError(f"{jsonl_path}:{lineno}: expected a JSON object with an integer 'step'")
            values = by_step.setdefault(row["step"], {})
            for key, value in row.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    values[key] = float(value)
    series: Series = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            if math.isfinite(value):
                steps, vals = series.setdefault(key, ([], []))
                steps.append(step)
                vals.append(value)
    return series


def _val_keys(series: Series) -> list[str]:
    core = sorted(k for k in series if k.startswith("val-core/"))
    keys = core or sorted(k for k in series if k.startswith("val-"))
    return keys[:_MAX_VAL_SERIES]


def _draw_panel(ax: Any, title: str, keys: Sequence[str], series: Series) -> int:
    """Draw the present ``keys`` on ``ax``; return how many were drawn."""
    drawn = 0
    for key in keys:
        if key not in series:
            continue
        steps, values = series[key]
        marker = "o" if len(steps) < 30 else None
        ax.plot(steps, values, label=key, marker=marker, markersize=3, linewidth=1.2)
        drawn += 1
    if title == "response length" and {"response_length/min", "response_length/max"} <= series.keys():
        (lo_steps, lo), (hi_steps, hi) = series["response_length/min"], series["response_length/max"]
        if lo_steps == hi_steps:
            ax.fill_between(lo_steps, lo, hi, alpha=0.2, label="min–max")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    return drawn


def plot_training_curves(
    jsonl_path: str | os.PathLike, out_png: str | os.PathLike, title: str | None = None
) -> str:
    """Write a PNG of training curves read from ``jsonl_path``.

    A PPO run gets 2x3 panels (1400x700 px, `PANELS`): score (``critic/score/mean`` and the
    ``val-core/*`` validation metrics, else any ``val-*``, at most 8), losses, KL (``actor/ppo_kl``, the
    KL loss or penalty), clip fractions with ``critic/vf_explained_var``, entropy, response length (with
    its min–max band). An SFT run (metrics with ``train/loss``) gets 2x2 (`SFT_PANELS`): train and
    validation loss, gradient norm, learning rate, throughput. Missing series are skipped; a panel with
    none says "no data".

    Args:
        jsonl_path: metrics file written by the ``jsonl`` tracking backend (one object per step).
        out_png: output path; its folder is created.
        title: figure title (default: the name of the folder holding ``jsonl_path``).

    Returns:
        ``out_png`` as a string.

    Raises:
        ValueError: the file has no numeric metric at all.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = read_jsonl_metrics(jsonl_path)
    if not series:
        raise ValueError(f"plot_training_curves: {jsonl_path} holds no numeric metric")
    panels = SFT_PANELS if "train/loss" in series else PANELS
    fig = Figure(figsize=(10 if len(panels) <= 4 else 14, 7), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, (len(panels) + 1) // 2).flatten()
    for ax, (panel_title, keys) in zip(axes, panels):
        extra = _val_keys(series) if panel_title == "score" else []
        _draw_panel(ax, panel_title, [*keys, *extra], series)
    fig.suptitle(title or os.path.basename(os.path.dirname(os.path.abspath(jsonl_path))))
    fig.tight_layout()
    out = os.fspath(out_png)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png")
    return out
