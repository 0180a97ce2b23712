"""Learning benchmark: the default PPO and GRPO runs from a warm start, for a fixed budget of steps.

Each run is ``python -m rlflow.trainer.main_ppo`` in a fresh process (start-up and, on first use, the
warm-start build included in its wall time), with the default hyper-parameters plus only what the task
needs. The script prints each run's greedy validation curve, its final and best score, the first step at
which it reached ``--target``, and where the wall time went (start-up, steps, validation).

    python scripts/bench/bench_learning.py                         # repeat: PPO and GRPO, 60 steps
    python scripts/bench/bench_learning.py --task arithmetic --steps 150
    python scripts/bench/bench_learning.py --task reverse          # the held-out task (below)
    python scripts/bench/bench_learning.py --runs ppo -- actor_rollout_ref.actor.optim.lr=2e-4

Tasks:

* ``repeat``, ``arithmetic``: the embedded tasks and their warm starts (``rlflow://tiny-sft/<task>``).
* ``reverse``: a task rlflow's defaults were never tuned on, built here the way a user would bring their
  own — "reverse bca" → "acb" over three letters of "abcdef", written as parquet in verl's schema, a
  reward file of its own (a length-gated per-position match, not rlflow's scorers) and the tiny model
  supervised on it with ``main_sft`` to partial competence. PPO then runs with the defaults, only the
  paths and the reward file set.

Results of the latest run are in docs/baselines.md. TRL is not installed on the build machines, so no peer
comparison runs here; ``--json`` writes the curves for one made elsewhere.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RUNS: dict[str, list[str]] = {
    "ppo": [],
    "grpo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"],
    # the first defaults (tuned for the random-init model): one optimizer step per rollout at lr 1e-3
    "ppo_first_defaults": [
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    ],
}
"""Each run's overrides on top of the defaults (``--runs`` picks; default: ppo and grpo)."""

TASK_OVERRIDES: dict[str, list[str]] = {
    "repeat": [],
    "arithmetic": ["data.task=arithmetic", "data.max_prompt_length=80", "data.val_batch_size=128"],
}

REVERSE_ALPHABET = "abcdef"
REVERSE_SFT_STEPS = 200
"""SFT steps of the held-out task's warm start (partial competence: see docs/baselines.md)."""

REVERSE_REWARD = '''"""Reward of the held-out ``reverse`` task (bench_learning.py): per-position match, length-gated."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    response = solution_str.strip()
    matches = sum(a == b for a, b in zip(response, ground_truth)) / len(ground_truth)
    return matches if len(response) == len(ground_truth) else 0.5 * matches
'''


def write_reverse_task(out: Path) -> tuple[str, str, str]:
    """The held-out task's train and validation parquet files and its reward file."""
    from rlflow.data.io import write_parquet

    words = ["".join(p) for p in itertools.permutations(REVERSE_ALPHABET, 3)]  # 120 distinct prompts
    rng = np.random.default_rng(7)
    val_words = set(rng.choice(words, size=24, replace=False).tolist())

    def row(word: str, split: str, index: int) -> dict[str, Any]:
        return {
            "data_source": "bench/reverse",
            "prompt": [{"role": "user", "content": f"reverse {word}"}],
            "ability": "copy",
            "reward_model": {"style": "rule", "ground_truth": word[::-1]},
            "extra_info": {"split": split, "index": index},
        }

    train_words = [w for w in words if w not in val_words]
    train = [row(w, "train", i) for i, w in enumerate(train_words * 4)]
    val = [row(w, "val", i) for i, w in enumerate(sorted(val_words))]
    out.mkdir(parents=True, exist_ok=True)
    reward = out / "reverse_reward.py"
    reward.write_text(REVERSE_REWARD)
    return (
        write_parquet(train, out / "reverse_train.parquet"),
        write_parquet(val, out / "reverse_val.parquet"),
        str(reward),
    )


def build_reverse_warm_start(out: Path, train: str, val: str) -> str:
    """``main_sft`` on the held-out task; returns the HF directory (reused when already built)."""
    hf = out / "reverse_sft" / f"global_step_{REVERSE_SFT_STEPS}" / "huggingface"
    if hf.is_dir():
        return str(hf)
    cmd = [
        sys.executable,
        "-m",
        "rlflow.trainer.main_sft",
        f"hydra.run.dir={out / 'hydra_sft'}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=32",
        "optim.lr=1e-3",
        "optim.lr_scheduler=constant",
        "optim.warmup_steps_ratio=0",
        f"trainer.total_training_steps={REVERSE_SFT_STEPS}",
        f"trainer.default_local_dir={out / 'reverse_sft'}",
        "trainer.logger=[]",
    ]
    with open(out / "reverse_sft.log", "w") as log:
        subprocess.run(cmd, check=True, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    return str(hf)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def run_one(name: str, overrides: list[str], out: Path) -> dict[str, Any]:
    """One ``main_ppo`` process; its validation curve and timings from ``metrics.jsonl``."""
    log_dir = out / "logs" / name
    cmd = [
        sys.executable,
        "-m",
        "rlflow.trainer.main_ppo",
        "--config-name=demo",
        f"hydra.run.dir={out / 'hydra' / name}",
        "trainer.project_name=bench_learning",
        f"trainer.experiment_name={name}",
        f"trainer.log_dir={log_dir}",
        "trainer.logger=[console,jsonl]",
        *overrides,
    ]
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env())
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{name}: main_ppo exited with {proc.returncode}; see {out / (name + '.log')}")
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    curve = [
        (int(r["step"]), float(v))
        for r in rows
        for k, v in r.items()
        if k.startswith("val-core/") and k.endswith("/mean@1")
    ]
    steps_s = sum(float(r.get("timing_s/step", 0.0)) for r in rows)
    testing_s = sum(float(r.get("timing_s/testing", 0.0)) for r in rows)
    return {"name": name, "curve": curve, "wall_s": wall, "steps_s": steps_s, "testing_s": testing_s}


def summarise(result: dict[str, Any], target: float) -> str:
    curve = result["curve"]
    reached = next((step for step, v in curve if v >= target), None)
    best = max(v for _, v in curve)
    points = " ".join(f"{s}:{v:.3f}" for s, v in curve)
    other = result["wall_s"] - result["steps_s"]
    return (
        f"{result['name']:>14} | start {curve[0][1]:.3f} final {curve[-1][1]:.3f} best {best:.3f} | "
        f"reached {target} at step {reached if reached is not None else '-'} | wall {result['wall_s']:.0f} s "
        f"(steps {result['steps_s']:.0f} s incl. validation {result['testing_s']:.0f} s; start-up and "
        f"shut-down {other:.0f} s)\n{'':>14}   curve {points}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="repeat", choices=[*TASK_OVERRIDES, "reverse"])
    parser.add_argument("--runs", nargs="+", default=["ppo", "grpo"], choices=list(RUNS))
    parser.add_argument("--steps", type=int, default=60, help="trainer.total_training_steps of each run")
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.9, help="report the first step at this score")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_learning"))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="extra main_ppo overrides for every run (after --)")
    args = parser.parse_args()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    task = list(TASK_OVERRIDES.get(args.task, []))
    if args.task == "reverse":
        train, val, reward = write_reverse_task(out / "reverse")
        model = build_reverse_warm_start(out / "reverse", train, val)
        task = [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"custom_reward_function.path={reward}",
        ]
    common = [f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.test_freq}", *task]
    results = []
    for name in args.runs:
        result = run_one(f"{args.task}_{name}", [*common, *RUNS[name], *args.overrides], out)
        print(summarise(result, args.target), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps({"task": args.task, "steps": args.steps, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
