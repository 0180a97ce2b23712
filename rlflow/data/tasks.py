"""Synthetic tasks with rule-checkable answers, written as parquet in verl's schema.

Each row::

    {"data_source": "rlflow/repeat",
     "prompt": [{"role": "user", "content": "repeat c x4"}],
     "ability": "copy",
     "reward_model": {"style": "rule", "ground_truth": "cccc"},
     "extra_info": {"split": "train", "index": 0, ...task fields...}}

Tasks (scorers in :mod:`rlflow.reward.synthetic`):

* ``repeat`` (easy; ``data_source="rlflow/repeat"``): "repeat {letter} x{count}" with a letter from a small
  alphabet ("abcde") and a count in 2..5; the answer is the letter repeated (``"cccc"``). Partial credit:
  the fraction of the first ``len(target)`` response characters that match, scaled down by 25% per extra
  character. Meant for ``data.max_response_length=8``: the longest answer (5 letters) plus eos fits. A
  policy that only learns "emit letters of the alphabet" scores about 0.2; one that reads the prompt
  reaches 1.0. Only 20 distinct prompts exist, so train and validation share prompts (the point is to learn
  the rule fast, not to generalise).
* ``arithmetic`` (harder; ``data_source="rlflow/arithmetic"``): "What is 347 + 58? ..." with operands of
  1..3 digits and ``+``/``-``/``*``; the answer (``"405"``) is read after ``####`` (else the last number).

Splits are drawn from independent seeded streams (``numpy.random.default_rng([seed, split_id])``), so the
same seed always gives the same files. :func:`ensure_task_files` writes them once into the cache directory
(``$RLFLOW_CACHE_DIR/data/<task>-<hash>``), atomically, and reuses them afterwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlflow.data.io import write_parquet
from rlflow.models.tiny import atomic_build_dir, cache_root

__all__ = [
    "ARITHMETIC_DATA_SOURCE",
    "EASY_TASK",
    "REPEAT_DATA_SOURCE",
    "TASKS",
    "ArithmeticTask",
    "RepeatTask",
    "SyntheticTask",
    "ensure_task_files",
    "make_rows",
    "write_task_files",
]

REPEAT_DATA_SOURCE = "rlflow/repeat"
ARITHMETIC_DATA_SOURCE = "rlflow/arithmetic"
EASY_TASK = "repeat"
TASK_FORMAT_VERSION = 1
"""Bump when the row format of any task changes, so cached files are rebuilt."""

ARITHMETIC_INSTRUCTION = 'Output the final answer after "####".'

_SPLIT_IDS = {"train": 0, "val": 1}


@dataclass(frozen=True)
class RepeatTask:
    """The easy task: "repeat c x4" -> "cccc".

    Attributes:
        alphabet: letters to repeat.
        min_count: shortest answer.
        max_count: longest answer (keep ``max_count + 1 <= max_response_length``).
        train_size: rows in the train split.
        val_size: rows in the validation split.
        response_length: the response budget (tokens) this task is designed for.
    """

    alphabet: str = "abcde"
    min_count: int = 2
    max_count: int = 5
    train_size: int = 4096
    val_size: int = 256
    response_length: int = 8

    data_source = REPEAT_DATA_SOURCE
    ability = "copy"

    def make_row(self, rng: np.random.Generator) -> tuple[str, str, dict[str, Any]]:
        """Draw one (prompt text, ground truth, task fields)."""
        letter = self.alphabet[int(rng.integers(len(self.alphabet)))]
        count = int(rng.integers(self.min_count, self.max_count + 1))
        return f"repeat {letter} x{count}", letter * count, {"letter": letter, "count": count}


@dataclass(frozen=True)
class ArithmeticTask:
    """The harder task: "What is 347 + 58? ..." -> "405".

    Attributes:
        max_digits: operands have 1..``max_digits`` digits.
        ops: operators to draw from (subset of ``"+-*"``).
        train_size: rows in the train split.
        val_size: rows in the validation split.
        response_length: the response budget (tokens) this task is designed for.
    """

    max_digits: int = 3
    ops: str = "+-*"
    train_size: int = 8192
    val_size: int = 512
    response_length: int = 32

    data_source = ARITHMETIC_DATA_SOURCE
    ability = "arithmetic"

    def make_row(self, rng: np.random.Generator) -> tuple[str, str, dict[str, Any]]:
        """Draw one (prompt text, ground truth, task fields)."""
        a, b = (int(rng.integers(0, 10 ** int(rng.integers(1, self.max_digits + 1)))) for _ in range(2))
        op = self.ops[int(rng.integers(len(self.ops)))]
        result = {"+": a + b, "-": a - b, "*": a * b}[op]
        return f"What is {a} {op} {b}? {ARITHMETIC_INSTRUCTION}", str(result), {"a": a, "b": b, "op": op}


SyntheticTask = RepeatTask | ArithmeticTask
TASKS: dict[str, Callable[..., SyntheticTask]] = {"repeat": RepeatTask, "arithmetic": ArithmeticTask}
"""Task name -> task class (keyword arguments are its fields)."""


def get_task(task: str | SyntheticTask, **overrides: Any) -> SyntheticTask:
    """A task object from its name (with field overrides) or an instance."""
    if not isinstance(task, str):
        return dataclasses.replace(task, **overrides) if overrides else task
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; known tasks: {sorted(TASKS)}")
    return TASKS[task](**overrides)


def make_rows(
    task: str | SyntheticTask, split: str, n: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """Rows of one split, deterministic for ``(task, split, seed)``.

    Args:
        task: task name or instance.
        split: ``"train"`` or ``"val"``.
        n: number of rows; the task's ``train_size`` / ``val_size`` when None.
        seed: base seed; each split draws from ``default_rng([seed, split_id])``.

    Returns:
        Rows in verl's schema (see the module docstring).
    """
    task = get_task(task)
    if split not in _SPLIT_IDS:
        raise ValueError(f"split={split!r} must be one of {sorted(_SPLIT_IDS)}")
    n = n if n is not None else (task.train_size if split == "train" else task.val_size)
    rng = np.random.default_rng([seed, _SPLIT_IDS[split]])
    rows = []
    for index in range(n):
        text, answer, fields = task.make_row(rng)
        rows.append(
            {
                "data_source": task.data_source,
                "prompt": [{"role": "user", "content": text}],
                "ability": task.ability,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, **fields},
            }
        )
    return rows


def write_task_files(task: str | SyntheticTask, out_dir: str | os.PathLike, seed: int = 0) -> tuple[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` of ``task`` into ``out_dir`` (overwriting).

    Args:
        task: task name or instance.
        out_dir: output directory (created if missing).
        seed: split seed.

    Returns:
        ``(train_path, val_path)``.
    """
    out = Path(out_dir)
    return (
        write_parquet(make_rows(task, "train", seed=seed), out / "train.parquet"),
        write_parquet(make_rows(task, "val", seed=seed), out / "val.parquet"),
    )


def _task_hash(task: SyntheticTask, seed: int) -> str:
    payload = {"task": type(task).__name__, "fields": dataclasses.asdict(task), "seed": seed}
    payload["format"] = TASK_FORMAT_VERSION
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def ensure_task_files(
    task: str | SyntheticTask, out_dir: str | os.PathLike | None = None, seed: int = 0, **overrides: Any
) -> tuple[str, str]:
    """Paths of the task's train/val parquet files, written on first use and reused afterwards.

    The files are built in a temporary directory and renamed into place, so concurrent callers never see
    a half-written split.

    Args:
        task: task name (``"repeat"``, ``"arithmetic"``) or instance.
        out_dir: directory holding ``train.parquet`` / ``val.parquet``; default
            ``$RLFLOW_CACHE_DIR/data/<task>-<hash of fields and seed>``. An existing directory is reused
            as is, so pass a fresh one when changing the task.
        seed: split seed.
        **overrides: task fields (e.g. ``train_size=512``).

    Returns:
        ``(train_path, val_path)``.
    """
    task_obj = get_task(task, **overrides)
    name = next(k for k, cls in TASKS.items() if isinstance(task_obj, cls))
    target = (
        Path(out_dir)
        if out_dir is not None
        else cache_root() / "data" / f"{name}-{_task_hash(task_obj, seed)}"
    )
    train, val = target / "train.parquet", target / "val.parquet"
    if train.is_file() and val.is_file():
        return str(train), str(val)
    if target.is_dir() and any(target.iterdir()):
        raise ValueError(
            f"{str(target)!r} exists but lacks train.parquet / val.parquet; remove it or pick another"
        )
    if target.is_dir():
        target.rmdir()
    atomic_build_dir(target, lambda tmp: write_task_files(task_obj, tmp, seed))
    return str(train), str(val)
