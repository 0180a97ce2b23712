"""PPO / GRPO step benchmark: where a training step's time goes, against the CPU roofline and TRL.

Each run is ``python -m rlflow.trainer.main_ppo`` in a fresh process on a tiny Qwen2 model built here
(sizes below), the embedded chat-formatted arithmetic prompts, validation and checkpoints off. The first
``--warmup`` steps are dropped; the table gives the median of the timed steps, per phase
(``timing_s/<phase>``), with

* the model FLOPs of each phase (``2 N`` per token forward, ``6 N`` forward + backward, plus causal
  attention; `rlflow.logging.flops.FlopsCounter`), generation counted as one forward over the final
  sequences (what a KV cache computes), every sample over its whole sequence (shared-prompt packing and
  the shared prefill skip the repeated prompts of GRPO's samples, so they do fewer FLOPs than counted:
  the count is the work of the step, as in MFU, not the arithmetic run);
* the roofline: step FLOPs / the measured fp32 GEMM rate of the machine with all its cores
  (`rlflow.logging.flops.measure_peak_flops`), i.e. the step time of a perfect implementation; the
  achieved fraction is roofline time / measured step time. The rate is read at the start, and again
  just before every run: the machines are shared, and their GEMM rate moves by 10-15 % within an hour.
  The column ``roofline, GEMM read per run`` sets each run's step time against the reading taken just
  before it (median over the variant's runs);
* tokens/s (valid prompt + response tokens of the step's batch) and the peak RSS of every role's
  processes (sampled from ``/proc`` while the run lasts).

Benches (the step geometry of docs/benchmarks.md, one optimizer step per rollout batch as TRL does):

* ``ppo-1m``: GAE with a critic, reference policy (KL in the reward) and a reward-model group; 1.0M
  parameters, 16 prompts, 32 response tokens.
* ``ppo-13m``: the same roles, 13.4M parameters (hidden 384, 6 layers), 16 prompts, 128 response tokens.
* ``grpo-1m``: GRPO, 16 prompts x 4 responses, 32 response tokens, no reference.

Layouts (`LAYOUTS`, each described there): ``default`` (the shipped demo layout: one rank per role with every
core, token-budget micro-batches; with the library's ``trainer.cpu_linear_kernel: auto``, where the demo pins
``aten``) and variants of it, alternated A B C, C B A, ... for ``--rounds`` rounds.
``--vs-trl`` adds TRL's ``GRPOTrainer`` with the same model, prompts, reward and geometry, and ``PPOTrainer`` (policy, reference, value model from the policy's
weights with a fresh head, the bench's reward model) for the PPO benches from the TRL release at
``--trl-ppo-path`` (TRL 1.x removed ``PPOTrainer``; 0.29.1 has it as ``trl.experimental.ppo``), each in its
own process with both cores, alternated with the rlflow runs, in fp32 (``bf16=False``) and in TRL's default precision
(bf16 autocast), with its other defaults (gradient checkpointing on), and prints the ratios.

Variants that compute in bf16 get their roofline against the measured bf16 GEMM rate (on CPUs with native
bf16 dot products, AVX512-BF16 or AMX, about twice the fp32 rate); the fp32 column stays for comparison.
The column ``roofline vs oneDNN fp32`` puts the roofline at the faster of torch's two fp32 GEMM kernels,
``matmul`` (MKL on x86) and oneDNN's (``measure_peak_flops(kernel="onednn")``), which the rollout's decoding steps use for
their large projections.

    python scripts/bench/bench_ppo_step.py                                   # every bench, both layouts
    python scripts/bench/bench_ppo_step.py --bench grpo-1m --vs-trl --rounds 3
    python scripts/bench/bench_ppo_step.py --bench ppo-13m --layouts 2rank -- actor_rollout_ref.actor.use_dynamic_bsz=true
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_runners import TRL_PPO_RUNNER, TRL_RUNNER, trl_available, trl_env  # scripts/bench/, beside this file

ROOT = Path(__file__).resolve().parents[2]

SIZES: dict[str, dict[str, int]] = {
    "1m": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4},
    "13m": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6},
}
"""Tiny Qwen2 shapes (4 heads, 2 KV heads, vocab 272): 1.02M and 13.4M parameters."""


@dataclass(frozen=True)
class Bench:
    size: str
    prompts: int
    n: int
    response_length: int
    estimator: str
    critic_ref_rm: bool


BENCHES: dict[str, Bench] = {
    "ppo-1m": Bench("1m", 16, 1, 32, "gae", True),
    "ppo-13m": Bench("13m", 16, 1, 128, "gae", True),
    "grpo-1m": Bench("1m", 16, 4, 32, "grpo", False),
}

CORES = os.cpu_count() or 1
BIG_BUDGET = 16384  # tokens per micro-batch: every bench's whole batch in one forward
LAYOUTS: dict[str, list[str]] = {
    "default": [],
    "2rank": ["trainer.n_gpus_per_node=2", "trainer.cpus_per_worker=1"],
    "2rank-fixed": [  # config/demo_two_ranks.yaml: the demo's layout before 2026-12-04
        "trainer.n_gpus_per_node=2",
        "trainer.cpus_per_worker=1",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
    ],
    "fast": [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={BIG_BUDGET}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={BIG_BUDGET}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={BIG_BUDGET}",
        f"critic.ppo_max_token_len_per_gpu={BIG_BUDGET}",
        "reward_model.micro_batch_size_per_gpu=64",
    ],
}
# compute in bf16 (fp32 master weights and reductions): verl's and TRL's default precision
LAYOUTS["bf16"] = [
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
    "critic.fsdp_config.mixed_precision.param_dtype=bf16",
]
LAYOUTS["unshared"] = ["actor_rollout_ref.model.use_shared_prompts=false"]
LAYOUTS["sequential"] = ["trainer.overlap_updates=false"]
LAYOUTS["aten"] = ["trainer.cpu_linear_kernel=aten"]
LAYOUTS["no-ahead"] = ["trainer.forward_ahead=false"]  # the updates run their own forwards
LAYOUTS["bypass"] = [
    *LAYOUTS["fast"],
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.bypass_mode=true",
]
"""``default``: the shipped demo layout (one rank per role with every core: ``cpus_per_worker: null``), with
``trainer.cpu_linear_kernel: auto``.
``2rank``: two single-thread ranks per role. ``2rank-fixed``: also fixed micro-batches (the demo's layout
before 2026-12-04). ``fast``: micro-batches as large as the batch. ``unshared``: no shared-prompt packing.
``sequential``: the critic's and the actor's updates one after the other (``trainer.overlap_updates=false``).
``bypass``: ``fast`` with the rollout's log-probs as the old policy's (no ``compute_log_prob`` pass).
``bf16``: computing in bf16 (fp32 master weights, gradients reduced in fp32), verl's and TRL's default.
``aten``: the linear layers through torch's ``F.linear`` (``trainer.cpu_linear_kernel=aten``), whatever
``auto`` picks for the default. ``no-ahead``: the updates run their own forwards
(``trainer.forward_ahead=false``)."""

PHASES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "forward_ahead",
    "adv",
    "update_critic",
    "update_actor",
    "update",
)
"""``timing_s/<phase>`` columns; ``update`` is the phase of the overlapped updates (``trainer.overlap_updates``),
whose ``update_critic`` and ``update_actor`` then overlap."""
ROLE_PROCESSES = {
    "actor": "ray::ActorRolloutWorker",
    "ref": "ray::RefWorker",
    "critic": "ray::CriticWorker",
    "reward_model": "ray::RewardModelWorker",
}
PROMPT_LENGTH = 80


# ---------------------------------------------------------------------------------------------- models


def build_models(size: str, out: Path) -> tuple[Path, Path]:
    """The policy (causal LM) and a reward model (sequence classification, same trunk) of ``size``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlflow.models.loader import load_tokenizer
    from rlflow.models.tiny import TinyModelConfig, save_tiny_model

    policy = out / f"policy-{size}"
    if not (policy / "config.json").is_file():
        save_tiny_model(policy, TinyModelConfig(**SIZES[size]))
    reward = out / f"reward-{size}"
    if not (reward / "config.json").is_file():
        import torch

        config = AutoConfig.from_pretrained(policy)
        config.num_labels = 1
        torch.manual_seed(0)
        AutoModelForSequenceClassification.from_config(config).save_pretrained(reward)
        load_tokenizer(str(policy)).save_pretrained(reward)
    return policy, reward


def bench_overrides(bench: Bench, policy: Path, reward: Path, steps: int, run_dir: Path) -> list[str]:
    """``main_ppo`` overrides of one bench (geometry, roles, logging) before the layout's."""
    batch = bench.prompts
    out = [
        "--config-name=demo",  # the demo's layout and optimizer; the geometry follows
        "trainer.cpu_linear_kernel=auto",  # the library's default (the demo pins aten for its curve)
        "data.task=arithmetic",
        f"data.max_prompt_length={PROMPT_LENGTH}",
        f"data.max_response_length={bench.response_length}",
        f"data.train_batch_size={batch}",
        f"actor_rollout_ref.model.path={policy}",
        f"actor_rollout_ref.rollout.n={bench.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"algorithm.adv_estimator={bench.estimator}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.log_dir={run_dir / 'logs'}",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        "trainer.resume_mode=disable",
        f"hydra.run.dir={run_dir}",
    ]
    if bench.critic_ref_rm:
        out += [
            f"critic.ppo_mini_batch_size={batch}",
            "algorithm.use_kl_in_reward=true",
            "reward_model.enable=true",
            f"reward_model.model.path={reward}",
        ]
    return out


# ------------------------------------------------------------------------------------------ rlflow runs


class RssSampler:
    """Peak RSS (MiB) of each role's Ray worker processes, sampled every ``period_s`` from /proc."""

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(self.period_s):
            for proc in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                for role, prefix in ROLE_PROCESSES.items():
                    if cmd.startswith(prefix) and proc.info["memory_info"] is not None:
                        mib = proc.info["memory_info"].rss / 2**20
                        self.peak[role] = max(self.peak.get(role, 0.0), mib)


@dataclass
class RunResult:
    steps: list[dict[str, float]]
    rss_mib: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    gemm: float = float("nan")  # the fp32 GEMM rate (FLOP/s) read just before the run

    @property
    def step_s(self) -> float:
        """The run's median step time (its timed steps)."""
        return _median([r["timing_s/step"] for r in self.steps])


def run_rlflow(overrides: list[str], run_dir: Path, warmup: int, log: Path) -> RunResult:
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    start = time.perf_counter()
    with RssSampler() as rss, open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "rlflow.trainer.main_ppo", *overrides],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        raise SystemExit(f"main_ppo failed (exit {proc.returncode}); see {log}")
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return RunResult(rows[warmup:], dict(rss.peak), time.perf_counter() - start)


# --------------------------------------------------------------------------------------------- TRL runs


def run_trl(
    bench: Bench,
    models: tuple[Path, Path],
    steps: int,
    warmup: int,
    out_dir: Path,
    log: Path,
    bf16: bool,
    ppo_path: str | None = None,
) -> RunResult:
    """One TRL run of ``bench`` (GRPOTrainer, or PPOTrainer for the PPO benches with ``ppo_path``'s TRL)."""
    policy, reward = models
    spec = {
        "bf16": bf16,
        "model": str(policy),
        "reward": str(reward),
        "prompts": bench.prompts,
        "n": bench.n,
        "response_length": bench.response_length,
        "max_prompt_length": PROMPT_LENGTH,
        "steps": steps,
        "threads": CORES,
        "out": str(out_dir),
    }
    ppo = bench.critic_ref_rm
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-c", TRL_PPO_RUNNER if ppo else TRL_RUNNER, json.dumps(spec)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            env=trl_env(ppo_path if ppo else None),
        )
    if proc.returncode != 0:
        raise SystemExit(f"TRL run failed (exit {proc.returncode}); see {log}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TRL_STEP_TIMES "))
    times = json.loads(line.split(" ", 1)[1])[warmup:]
    return RunResult([{"timing_s/step": t} for t in times], {}, time.perf_counter() - start)


# ------------------------------------------------------------------------------------------- reporting


def phase_flops(bench: Bench, policy: Path, row: dict[str, float]) -> dict[str, float]:
    """Model FLOPs of each phase a step needs, from the step's mean prompt and response lengths.

    The old-log-prob forward is counted only when the update is off-policy (several mini-batches or
    epochs): on-policy, the update's forward gives the same numbers, so a perfect implementation skips it.
    """
    from transformers import AutoConfig

    from rlflow.logging.flops import FlopsCounter

    counter = FlopsCounter(AutoConfig.from_pretrained(policy))
    samples = bench.prompts * bench.n
    total = row.get("perf/total_num_tokens", 0.0)
    seqlen = total / samples if total else PROMPT_LENGTH / 2 + bench.response_length
    lengths = [round(seqlen)] * samples
    forward = counter.estimate_flops(lengths, backward=False)
    flops = {"gen": forward, "update_actor": 3 * forward}
    if bench.critic_ref_rm:
        flops.update(ref=forward, values=forward, reward=forward, update_critic=3 * forward)
    return flops


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(
    name: str,
    bench: Bench,
    policy: Path,
    results: dict[str, list[RunResult]],
    peaks: dict[str, float],
) -> list[str]:
    """The bench's table; ``peaks``: the measured GEMM rate (FLOP/s) per compute precision (fp32, bf16)."""
    peak = peaks["fp32"]
    lines = [f"### {name}: {bench.prompts} prompts x {bench.n}, {bench.response_length} response tokens"]
    first = next(iter(results.values()))[0]
    flops = (
        phase_flops(bench, policy, first.steps[0])
        if first.steps and "perf/total_num_tokens" in first.steps[0]
        else {}
    )
    step_flops = sum(flops.values())
    header = [
        "variant",
        "s/step",
        "tokens/s",
        "roofline",
        "roofline, own precision",
        "roofline vs oneDNN fp32",
        "roofline, GEMM read per run",
        *[f"{p} s" for p in PHASES],
        "peak RSS MiB per role",
    ]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant, runs in results.items():
        rows = [r for run in runs for r in run.steps]
        step = _median([r["timing_s/step"] for r in rows])
        tokens = _median([r.get("perf/total_num_tokens", float("nan")) for r in rows])
        roofline = step_flops / peak / step if step_flops else float("nan")
        own = roofline * peak / peaks["bf16" if variant.endswith("bf16") else "fp32"]
        onednn_peak = peaks.get("fp32 oneDNN", float("nan"))  # NaN without oneDNN: the column shows "-"
        onednn = roofline * peak / max(peak, onednn_peak) if onednn_peak == onednn_peak else float("nan")
        per_run = _median([step_flops / run.gemm / run.step_s for run in runs if run.steps and step_flops])
        phases = []
        for p in PHASES:
            vals = [r[f"timing_s/{p}"] for r in rows if f"timing_s/{p}" in r]
            phases.append(f"{_median(vals):.3f}" if vals else "-")
        rss = {}
        for run in runs:
            for role, mib in run.rss_mib.items():
                rss[role] = max(rss.get(role, 0.0), mib)
        rss_text = ", ".join(f"{k} {v:.0f}" for k, v in rss.items()) or "-"
        tokens_text = f"{tokens / step:.0f}" if tokens == tokens else "-"  # TRL logs no token count
        lines.append(
            f"| {variant} | {step:.3f} | {tokens_text} | {100 * roofline:.0f} % | {100 * own:.0f} % | "
            + (f"{100 * onednn:.0f} % | " if onednn == onednn else "- | ")
            + (f"{100 * per_run:.0f} % | " if per_run == per_run else "- | ")
            + " | ".join(phases)
            + f" | {rss_text} |"
        )
    if flops:
        lines += [
            "",
            "FLOPs per step (G): "
            + ", ".join(f"{p} {flops[p] / 1e9:.2f}" for p in PHASES if p in flops)
            + f"; total {step_flops / 1e9:.2f} G; roofline step time {step_flops / peak:.3f} s at "
            f"{peak / 1e9:.0f} GFLOP/s (fp32), {step_flops / peaks['bf16']:.3f} s at {peaks['bf16'] / 1e9:.0f} "
            "GFLOP/s (bf16)",
        ]
        readings = sorted(run.gemm / 1e9 for runs in results.values() for run in runs)
        lines.append(
            f"fp32 GEMM read before each run: {readings[0]:.0f}..{readings[-1]:.0f} GFLOP/s, median "
            f"{_median(readings):.0f}; 'roofline, GEMM read per run' is the median over a variant's runs of "
            "(roofline step time at the run's reading) / (the run's median step time)"
        )
    variants = list(results)
    pairs = [(variants[0], other) for other in variants[1:] if not other.startswith("TRL")]
    pairs += [(trl, other) for trl in variants if trl.startswith("TRL") for other in variants if other != trl]
    for num, den in pairs:
        ratios = [a.step_s / b.step_s for a, b in zip(results[num], results[den])]
        lines.append(
            f"- {num} / {den} step time: {_median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})"
        )
    return lines


# ------------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default=",".join(BENCHES), help=f"comma list of {list(BENCHES)}")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma list of {list(LAYOUTS)}")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of every run")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds of every variant")
    parser.add_argument(
        "--vs-trl", action="store_true", help="add TRL's GRPOTrainer / PPOTrainer, fp32 and bf16"
    )
    parser.add_argument(
        "--trl-ppo-path",
        default=None,
        help="a directory holding a TRL release with PPOTrainer, put first on PYTHONPATH for the TRL PPO "
        "runs (TRL 1.x has none: pip install --no-deps --target DIR trl==0.29.1)",
    )
    parser.add_argument("--work-dir", default=None, help="models, runs and logs (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra main_ppo overrides for every rlflow run")
    args = parser.parse_args()

    from rlflow.logging.flops import measure_peak_flops

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_ppo_step_"))
    work.mkdir(parents=True, exist_ok=True)
    cores = CORES
    import torch

    peaks = {
        "fp32": measure_peak_flops("cpu", num_threads=cores),
        "bf16": measure_peak_flops("cpu", dtype=torch.bfloat16, num_threads=cores),
        "fp32 oneDNN": measure_peak_flops("cpu", num_threads=cores, min_time_s=0.5, kernel="onednn"),
    }
    print(
        f"machine: {platform.machine()}, {cores} cores, load average {os.getloadavg()[0]:.1f}; "
        f"GEMM {peaks['fp32'] / 1e9:.0f} GFLOP/s fp32, {peaks['bf16'] / 1e9:.0f} GFLOP/s bf16 with {cores} "
        f"threads (oneDNN's fp32 kernel: {peaks['fp32 oneDNN'] / 1e9:.0f} GFLOP/s); "
        f"python {platform.python_version()}; "
        f"work dir {work}\n"
    )
    for name in args.bench.split(","):
        bench = BENCHES[name]
        policy, reward = build_models(bench.size, work / "models")
        variants = [f"rlflow {layout}" for layout in args.layouts.split(",")]
        if args.vs_trl:
            trainer = "PPOTrainer" if bench.critic_ref_rm else "GRPOTrainer"
            if trl_available(bench.critic_ref_rm, args.trl_ppo_path):
                variants += [f"TRL {trainer}", f"TRL {trainer} bf16"]
            elif bench.critic_ref_rm:
                print(f"  {name}: no TRL with PPOTrainer (TRL 1.x has none): see --trl-ppo-path; no TRL run")
            else:
                raise SystemExit("--vs-trl needs TRL: pip install trl")
        results: dict[str, list[RunResult]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else variants[::-1]
            for variant in order:
                run_dir = work / "runs" / f"{name}-{variant.replace(' ', '_')}-{round_}"
                log = work / "runs" / f"{run_dir.name}.log"
                shutil.rmtree(run_dir, ignore_errors=True)  # the jsonl logger appends to an old run's file
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                total = args.warmup + args.steps
                gemm = measure_peak_flops("cpu", num_threads=cores, fresh=True)  # the machine, now
                if variant.startswith("TRL"):
                    bf16 = variant.endswith("bf16")
                    models = (policy, reward)
                    result = run_trl(bench, models, total, args.warmup, run_dir, log, bf16, args.trl_ppo_path)
                else:
                    layout = LAYOUTS[variant.split(" ", 1)[1]]
                    overrides = (
                        bench_overrides(bench, policy, reward, total, run_dir) + layout + args.overrides
                    )
                    result = run_rlflow(overrides, run_dir, args.warmup, log)
                result.gemm = gemm
                results[variant].append(result)
                step = result.step_s
                print(
                    f"  {name} round {round_} {variant}: {step:.3f} s/step ({result.wall_s:.0f} s wall; "
                    f"GEMM before it {gemm / 1e9:.0f} GFLOP/s)"
                )
        print("\n".join(["", *report(name, bench, policy, results, peaks), ""]))


if __name__ == "__main__":
    main()
