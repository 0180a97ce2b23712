"""The warm-started embedded models: the tiny model after a short SFT on an embedded task.

RL starts from a supervised model in practice (verl's quick start from an instruct model, TRL's from an
SFT checkpoint); so does rlflow's default run. ``actor_rollout_ref.model.path: null`` means
``rlflow://tiny-sft/<data.task>``: the random-init tiny model (``rlflow://tiny``) fine-tuned by
`rlflow.trainer.main_sft` for a few steps on that task's training split — long enough to learn the answer
format and part of the rule, short of mastering it (the greedy validation score starts well below 0.5 on
``repeat``), so the RL run has something visible to learn. ``docs/baselines.md`` records the recipes and
the numbers they give.

The model is built once per recipe into ``$RLFLOW_CACHE_DIR/tiny-sft-<task>-<hash>`` (atomically; the
hash covers the recipe, the tiny model and the task files), in a fresh single-threaded process so the
weights do not depend on the machine's thread count, and reused afterwards. Building takes about 15 s on
a CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

from rlflow.models.tiny import atomic_build_dir, cache_root

__all__ = [
    "WARM_START_PREFIX",
    "WARM_START_RECIPES",
    "ensure_warm_start",
    "resolve_warm_start",
    "warm_start_task",
]

logger = logging.getLogger(__name__)

WARM_START_PREFIX = "rlflow://tiny-sft"
"""``rlflow://tiny-sft/<task>`` (or ``rlflow://tiny-sft``: the run's ``data.task``)."""

WARM_START_VERSION = 1
"""Bump when the build (not the recipe) changes, so cached models are rebuilt."""

WARM_START_RECIPES: dict[str, tuple[str, ...]] = {
    # 24 steps of 32 samples at a constant 1e-3: the letter and the answer format are learnt, the
    # count only partly (greedy validation score 0.46 with the repeat scorer, exact match 0.16).
    "repeat": (
        "data.task=repeat",
        "data.train_batch_size=32",
        "optim.lr=1e-3",
        "optim.lr_scheduler=constant",
        "optim.warmup_steps_ratio=0",
        "trainer.total_training_steps=24",
    ),
    # arithmetic: 200 steps learn the answer format (digits, a sign) but hardly any sums: greedy exact
    # match 0.012 on 256 validation rows (0.0 at 100 steps, 0.008 at 300 and 400; docs/baselines.md).
    # The prompts take up to 75 tokens with the chat template, the answers up to 6 and eos.
    "arithmetic": (
        "data.task=arithmetic",
        "data.max_length=96",
        "data.train_batch_size=32",
        "optim.lr=1e-3",
        "optim.lr_scheduler=constant",
        "optim.warmup_steps_ratio=0",
        "trainer.total_training_steps=200",
    ),
}
"""SFT overrides (``main_sft`` syntax) of each embedded task's warm start."""


def _recipe(task: str) -> tuple[str, ...]:
    if task not in WARM_START_RECIPES:
        raise ValueError(
            f"{WARM_START_PREFIX}/{task}: no warm-start recipe for task {task!r} (have: "
            f"{sorted(WARM_START_RECIPES)}); set actor_rollout_ref.model.path to a model, or rlflow://tiny "
            "for the random-init one"
        )
    return WARM_START_RECIPES[task]


def _build_rank(rank: int, overrides: tuple[str, ...], out_dir: str) -> dict:
    from rlflow.config.loading import load_sft_config
    from rlflow.trainer.main_sft import run_sft

    return run_sft(load_sft_config([*overrides, f"trainer.default_local_dir={out_dir}", "trainer.logger=[]"]))


def ensure_warm_start(task: str) -> str:
    """The warm-started tiny model of ``task``: built on first use (see the module docstring).

    Returns:
        The HF model directory.
    """
    from rlflow.data.tasks import ensure_task_files
    from rlflow.models.tiny import get_tiny_model_path
    from rlflow.parallel.distributed import spawn_workers

    overrides = _recipe(task)
    base, (train, _) = get_tiny_model_path(), ensure_task_files(task)
    key = json.dumps(
        {
            "recipe": overrides,
            "base": Path(base).name,
            "train": Path(train).parent.name,
            "v": WARM_START_VERSION,
        }
    )
    target = cache_root() / f"tiny-sft-{task}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def build(tmp: Path) -> None:
        start = time.perf_counter()
        logger.info("rlflow: building the warm-started tiny model for %r (once) into %s", task, target)
        result = spawn_workers(_build_rank, 1, args=(overrides, str(tmp / "run")))[0]
        for item in Path(result["hf_dir"]).iterdir():
            shutil.move(str(item), tmp / item.name)
        shutil.rmtree(tmp / "run")
        meta = {
            "task": task,
            "recipe": list(overrides),
            "final_train_loss": result["final"].get("train/loss"),
            "final_val_loss": result["final"].get("val/loss"),
            "build_s": round(time.perf_counter() - start, 1),
        }
        (tmp / "rlflow_warm_start.json").write_text(json.dumps(meta, indent=2))

    return atomic_build_dir(target, build)


def warm_start_task(path: str | None, task: str) -> str | None:
    """The task whose warm start ``path`` names (``None`` and ``rlflow://tiny-sft`` → ``task``,
    ``rlflow://tiny-sft/<name>`` → ``name``), or ``None`` when ``path`` is not a warm start.

    Raises:
        ValueError: the named task has no recipe (before anything is built).
    """
    if path is None or path == WARM_START_PREFIX:
        name = task
    elif path.startswith(WARM_START_PREFIX + "/"):
        name = path[len(WARM_START_PREFIX) + 1 :]
    else:
        return None
    _recipe(name)
    return name


def resolve_warm_start(path: str | None, task: str) -> str | None:
    """``None`` or ``rlflow://tiny-sft[/<task>]`` → the warm-started model directory (built if needed);
    any other path unchanged."""
    name = warm_start_task(path, task)
    return path if name is None else ensure_warm_start(name)
