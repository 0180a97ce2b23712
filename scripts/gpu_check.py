"""The GPU check: rlflow's workers driven directly on one GPU, one table of PASS / FAIL / SKIP.

    python scripts/gpu_check.py                 # CUDA if torch sees a GPU, else every check is SKIP
    python scripts/gpu_check.py --device cpu    # the same checks on the CPU (the script's own test)
    python scripts/gpu_check.py --only update_bf16_rmpad hf_rollout --json /tmp/gpu_check.json

Needs torch, transformers, tensordict and rlflow (an editable checkout on ``PYTHONPATH`` is enough); it
does not need Ray, Hydra or OmegaConf (they may be missing on the GPU machine): the typed config is built
from the schema's defaults (`plain_config`), the role workers are constructed and called in one process
joined to a one-rank process group (NCCL for CUDA tensors) exactly as their Ray actors call them, and the
models are the embedded tiny ones, built locally (no network). Each check runs in that process and
catches its own failure; the run exits non-zero when any check FAILs. About a minute on a GPU (vLLM's
start-up adds about a minute when installed); the checks that need CUDA or an optional package say SKIP
with the reason.

The table goes into docs/gpu.md with the date, GPU model and torch version.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e`

from gpu_check_config import plain_config  # beside this file in scripts/

from rlflow.config.schema import PPOTrainerConfig
from rlflow.protocol import DataProto

ROWS, PROMPT_LEN, RESPONSE_LEN = 8, 24, 16
ACTOR, CRITIC, ROLLOUT = "actor_rollout_ref.actor", "critic", "actor_rollout_ref.rollout"


def check_overrides(**extra: Any) -> dict[str, Any]:
    """The layout every check starts from: FSDP2, remove-padding, 8 prompts × 16 response tokens, one
    mini-batch in micro-batches of 4, rollout log-probs on, no gradient checkpointing (the ``gc`` check
    turns it on)."""
    base = {
        "data.max_prompt_length": PROMPT_LEN,
        "data.max_response_length": RESPONSE_LEN,
        "data.train_batch_size": ROWS,
        f"{ACTOR}.strategy": "fsdp2",
        f"{ACTOR}.ppo_mini_batch_size": ROWS,
        f"{ACTOR}.ppo_micro_batch_size_per_gpu": 4,
        f"{CRITIC}.strategy": "fsdp2",
        f"{CRITIC}.ppo_micro_batch_size_per_gpu": 4,
        f"{ROLLOUT}.calculate_log_probs": True,
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        f"{CRITIC}.model.enable_gradient_checkpointing": False,
    }
    return {**base, **extra}


def bf16(*prefixes: str) -> dict[str, str]:
    return {f"{p}.fsdp_config.mixed_precision.param_dtype": "bf16" for p in prefixes}


# --------------------------------------------------------------------------- data and helpers


def prompts_batch(
    config: PPOTrainerConfig, seed: int = 0, validate: bool = False, min_len: int = 6
) -> DataProto:
    """Left-padded prompts of ``min_len``..PROMPT_LEN tokens, as the dataset gives them (CPU tensors, as
    from Ray); ``validate``: greedy decoding."""
    from rlflow.models.loader import load_tokenizer
    from rlflow.workers.role_setup import tokenizer_path

    tok = load_tokenizer(tokenizer_path(config.actor_rollout_ref.model))
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, PROMPT_LEN + 1, (ROWS,), generator=g)
    ids = torch.full((ROWS, PROMPT_LEN), int(tok.pad_token_id), dtype=torch.int64)
    mask = torch.zeros((ROWS, PROMPT_LEN), dtype=torch.int64)
    for i, n in enumerate(lengths.tolist()):
        ids[i, PROMPT_LEN - n :] = torch.randint(3, len(tok) - 1, (n,), generator=g)
        mask[i, PROMPT_LEN - n :] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    meta = {"eos_token_id": [int(tok.eos_token_id)], "pad_token_id": int(tok.pad_token_id), "global_steps": 1}
    if validate:
        meta["validate"] = True
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}, meta_info=meta
    )


def training_batch(gen: DataProto, seed: int = 0) -> DataProto:
    """The rollout's output as the driver hands it on: meta of the step, a reward at each last token."""
    keys = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
    batch = DataProto.from_dict(
        tensors={k: gen.batch[k] for k in keys},
        meta_info={"global_steps": 1, "global_batch_size": len(gen)},
    )
    mask = batch.batch["response_mask"]
    last = (mask.sum(-1) - 1).clamp(min=0)
    rewards = torch.zeros(mask.shape)
    g = torch.Generator().manual_seed(seed)
    rewards[torch.arange(len(mask)), last] = torch.rand(len(mask), generator=g)
    batch.batch["token_level_rewards"] = rewards * mask
    return batch


def on_cpu(data: DataProto) -> bool:
    return all(t.device.type == "cpu" for t in data.batch.values())


def params_on(module: torch.nn.Module, device_type: str) -> bool:
    return all(getattr(p, "_local_tensor", p).device.type == device_type for p in module.parameters())


def masked_abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(max, mean) of ``|a - b|`` over ``mask``."""
    d = (a.float() - b.float()).abs()[mask.bool()]
    return float(d.max()), float(d.mean())


class Fail(Exception):
    """A check's verdict: the numbers were out of bounds."""


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise Fail(message)


def build(cls: type, config: PPOTrainerConfig) -> Any:
    worker = cls(config, 4)
    worker.init_model()
    return worker


def free(*workers: Any) -> None:
    for w in workers:
        for name in ("rollout", "actor", "critic", "module", "optimizer"):
            if hasattr(w, name):
                setattr(w, name, None)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ppo_step(config: PPOTrainerConfig) -> dict[str, Any]:
    """One PPO step through the real workers: generate, old log-probs, values, GAE, critic and actor
    updates, then the log-probs again. Returns the numbers the checks judge."""
    from rlflow.workers import ActorRolloutWorker, CriticWorker

    actor, critic = build(ActorRolloutWorker, config), build(CriticWorker, config)
    device = actor.device.type
    gen = actor.generate_sequences(prompts_batch(config))
    batch = training_batch(gen)
    old = actor.compute_log_prob(batch)
    batch.batch["old_log_probs"] = old.batch["old_log_probs"]
    values = critic.compute_values(batch)
    adv = critic.compute_advantage(batch, values)
    critic_metrics = critic.update_critic(batch, adv).meta_info["metrics"]
    actor_metrics = actor.update_actor(batch, adv).meta_info["metrics"]
    after = actor.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"]
    out = {
        "device": device,
        "outputs_on_cpu": all(on_cpu(d) for d in (gen, old, values, adv)),
        "params_on_device": params_on(actor.module, device) and params_on(critic.module, device),
        "replica_dtype": actor.rollout._replica_dtype() if hasattr(actor.rollout, "_replica_dtype") else None,
        "rollout_diff": masked_abs_diff(old.batch["old_log_probs"], gen.batch["rollout_log_probs"], mask),
        "update_diff": masked_abs_diff(after, old.batch["old_log_probs"], mask),
        "metrics": {**critic_metrics, **actor_metrics},
        "actor": actor,
    }
    free(critic)
    return out


def losses_finite(metrics: Mapping[str, float]) -> str:
    keys = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")
    bad = [k for k in keys if not torch.isfinite(torch.tensor(float(metrics[k])))]
    expect(not bad, f"not finite: {bad}")
    expect(metrics["actor/grad_norm"] > 0 and metrics["critic/grad_norm"] > 0, "a zero gradient norm")
    return " ".join(f"{k.split('/')[0][0]}.{k.split('/')[1]}={metrics[k]:.4g}" for k in keys)


# --------------------------------------------------------------------------- the checks

Row = tuple[str, str, str]  # (check, status, numbers)


def check_update_bf16_rmpad(device: str) -> list[Row]:
    """FSDP2 actor + critic update in bf16 mixed precision with remove-padding; log-prob agreement."""
    cfg = plain_config(check_overrides(**bf16(ACTOR, CRITIC)))
    out = ppo_step(cfg)
    free(out.pop("actor"))
    expect(out["outputs_on_cpu"], "a worker returned device tensors")
    expect(out["params_on_device"], f"parameters not on {device}")
    expect(out["replica_dtype"] == torch.bfloat16, f"generation replica in {out['replica_dtype']}, not bf16")
    numbers = losses_finite(out["metrics"])
    moved, _ = out["update_diff"]
    expect(moved > 0, "the update left the log-probs unchanged")
    rows = [("update_bf16_rmpad", "PASS", f"{numbers} max abs Δlogp after update={moved:.3g}")]
    mx, mean = out["rollout_diff"]
    ok = mx < 0.25 and mean < 0.02
    rows.append(
        (
            "logprob_vs_rollout_bf16",
            "PASS" if ok else "FAIL",
            f"max={mx:.3g} mean={mean:.3g} (bound 0.25 / 0.02)",
        )
    )
    return rows


def check_logprob_fp32(device: str) -> list[Row]:
    """compute_log_prob (packed, FSDP2) against the rollout's KV-cache log-probs, fp32."""
    from rlflow.workers import ActorRolloutWorker

    cfg = plain_config(check_overrides())
    actor = build(ActorRolloutWorker, cfg)
    gen = actor.generate_sequences(prompts_batch(cfg))
    old = actor.compute_log_prob(training_batch(gen))
    mx, mean = masked_abs_diff(
        old.batch["old_log_probs"], gen.batch["rollout_log_probs"], gen.batch["response_mask"]
    )
    free(actor)
    ok = mx < 2e-3
    return [
        ("logprob_vs_rollout_fp32", "PASS" if ok else "FAIL", f"max={mx:.3g} mean={mean:.3g} (bound 2e-3)")
    ]


def check_hf_rollout(device: str) -> list[Row]:
    """Greedy HF rollout on the device, against a teacher-forced forward of the same weights on the CPU."""
    from rlflow.models.loader import load_causal_lm
    from rlflow.workers import ActorRolloutWorker
    from rlflow.workers.role_setup import model_path

    cfg = plain_config(check_overrides())
    actor = build(ActorRolloutWorker, cfg)
    prompts = prompts_batch(cfg, seed=1, validate=True)
    first, second = actor.generate_sequences(prompts), actor.generate_sequences(prompts)
    expect(on_cpu(first), "generate_sequences returned device tensors")
    expect(
        torch.equal(first.batch["responses"], second.batch["responses"]), "greedy decoding is not repeatable"
    )
    free(actor)
    reference = load_causal_lm(model_path(cfg.actor_rollout_ref.model)).eval()  # the actor before any update
    ids, mask = first.batch["input_ids"], first.batch["attention_mask"]
    with torch.no_grad():
        logits = reference(
            input_ids=ids, attention_mask=mask, position_ids=first.batch["position_ids"]
        ).logits
    logits = logits[:, PROMPT_LEN - 1 : -1].float()
    resp, rmask = first.batch["responses"], first.batch["response_mask"].bool()
    top2 = logits.topk(2, dim=-1).values
    tie = (top2[..., 0] - top2[..., 1]) < 1e-3
    wrong = ((logits.argmax(-1) != resp) & rmask & ~tie).sum().item()
    ref_lp = torch.log_softmax(logits, -1).gather(-1, resp[..., None])[..., 0]
    mx, _ = masked_abs_diff(first.batch["rollout_log_probs"], ref_lp, rmask)
    ok = wrong == 0 and mx < 2e-3
    numbers = (
        f"{int(rmask.sum())} tokens, {wrong} not the reference argmax, max abs Δlogp={mx:.3g} (bound 2e-3)"
    )
    return [("hf_rollout", "PASS" if ok else "FAIL", numbers)]


def check_reward_model(device: str) -> list[Row]:
    """The reward model on the device in the actor's compute dtype, against an fp32 CPU forward."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlflow.models.loader import load_tokenizer
    from rlflow.models.tiny import get_tiny_model_path
    from rlflow.reward.reward_model import compute_rm_score
    from rlflow.workers import ActorRolloutWorker, RewardModelWorker

    tiny = get_tiny_model_path()
    with tempfile.TemporaryDirectory() as rm_dir:
        torch.manual_seed(3)
        rm = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(tiny, num_labels=1))
        rm.save_pretrained(rm_dir)
        load_tokenizer(tiny).save_pretrained(rm_dir)
        cfg = plain_config(
            check_overrides(**bf16(ACTOR), **{"reward_model.enable": True, "reward_model.model.path": rm_dir})
        )
        worker = build(RewardModelWorker, cfg)
    module_dtype = next(worker.module.parameters()).dtype
    expect(params_on(worker.module, device), f"reward model not on {device}")
    expect(module_dtype == torch.bfloat16, f"reward model in {module_dtype}, not the actor's bf16")
    actor = build(ActorRolloutWorker, cfg)
    gen = actor.generate_sequences(prompts_batch(cfg, seed=2))
    free(actor)
    scores = worker.compute_rm_score(gen).batch["rm_scores"]
    free(worker)
    expect(scores.device.type == "cpu", "scores returned on the device")
    b = gen.batch
    with torch.no_grad():
        ref = compute_rm_score(
            rm.eval(), b["input_ids"], b["attention_mask"], b["position_ids"], RESPONSE_LEN
        )
    mask = b["response_mask"].bool()
    mx = float((scores.float() - ref.float()).abs()[mask].max())
    scale = float(ref[mask].abs().max())
    ok = mx <= 0.02 + 0.02 * scale
    return [("reward_model", "PASS" if ok else "FAIL", f"max abs Δscore={mx:.3g} (scores up to {scale:.3g})")]


def check_flash_attn(device: str) -> list[Row]:
    """rlflow's packed attention through flash-attn varlen (bf16) against the padded SDPA forward."""
    if device != "cuda":
        return [("flash_attn_varlen", "SKIP", "needs CUDA")]
    if importlib.util.find_spec("flash_attn") is None:
        return [("flash_attn_varlen", "SKIP", "flash-attn is not installed (pip install rlflow[gpu])")]
    from rlflow.models import attention
    from rlflow.models.attention import set_packed_attention
    from rlflow.models.forward import forward_micro_batch
    from rlflow.models.loader import load_causal_lm
    from rlflow.models.tiny import get_tiny_model_path

    calls = []
    original = attention._flash_varlen

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return original(*args, **kwargs)

    attention._flash_varlen = counted
    try:
        cfg = plain_config(check_overrides())
        gen = prompts_batch(cfg, seed=4, min_len=10)
        ids, mask = gen.batch["input_ids"], gen.batch["attention_mask"]
        # the prompts' last 8 tokens stand for the responses (all valid: every prompt has >= 10)
        batch = {k: v.cuda() for k, v in gen.batch.items()} | {"responses": ids[:, -8:].cuda()}
        path = get_tiny_model_path()
        packed = set_packed_attention(load_causal_lm(path, "bfloat16", "sdpa")).cuda().eval()
        padded = load_causal_lm(path, "bfloat16", "sdpa").cuda().eval()
        with torch.no_grad():
            a = forward_micro_batch(packed, batch, output="log_probs", use_remove_padding=True)["log_probs"]
            b = forward_micro_batch(padded, batch, output="log_probs")["log_probs"]
    finally:
        attention._flash_varlen = original
    mx, mean = masked_abs_diff(a, b, mask[:, -8:].cuda())
    ok = bool(calls) and mx < 5e-2
    return [
        (
            "flash_attn_varlen",
            "PASS" if ok else "FAIL",
            f"{len(calls)} varlen calls, max={mx:.3g} mean={mean:.3g}",
        )
    ]


def _one_update(config: PPOTrainerConfig) -> tuple[dict[str, float], torch.Tensor, Any]:
    from rlflow.workers import ActorRolloutWorker, CriticWorker

    actor, critic = build(ActorRolloutWorker, config), build(CriticWorker, config)
    gen = actor.generate_sequences(prompts_batch(config, seed=5))
    batch = training_batch(gen, seed=5)
    batch.batch["old_log_probs"] = actor.compute_log_prob(batch).batch["old_log_probs"]
    adv = critic.compute_advantage(batch, critic.compute_values(batch))
    metrics = actor.update_actor(batch, adv).meta_info["metrics"]
    metrics.update(critic.update_critic(batch, adv).meta_info["metrics"])
    after = actor.compute_log_prob(batch).batch["old_log_probs"]
    free(critic)
    return metrics, after, actor


def _same_update(name: str, plain: PPOTrainerConfig, changed: PPOTrainerConfig, extra: Callable) -> list[Row]:
    """The same PPO update with and without one option: equal losses, gradient norms and new log-probs."""
    m0, lp0, a0 = _one_update(plain)
    free(a0)
    m1, lp1, a1 = _one_update(changed)
    note = extra(a1)
    free(a1)
    # pg_loss of a first update is ~0 (whitened advantages, ratio 1): compared on the advantages' scale
    # (1); the gradient norms relative to themselves; the new log-probs (scale ~5) absolutely.
    dloss = max(abs(m1[k] - m0[k]) for k in ("actor/pg_loss", "critic/vf_loss"))
    rel = max(abs(m1[k] - m0[k]) / abs(m0[k]) for k in ("actor/grad_norm", "critic/grad_norm"))
    dlp = float((lp1 - lp0).abs().max())
    ok = dloss < 1e-4 and rel < 1e-3 and dlp < 1e-3 and note[0]
    numbers = f"max abs Δloss={dloss:.2g} max rel Δ(grad norms)={rel:.2g} max abs Δlogp={dlp:.2g} {note[1]}"
    return [(name, "PASS" if ok else "FAIL", numbers.strip())]


def check_gradient_checkpointing(device: str) -> list[Row]:
    """Gradient checkpointing (actor and critic) changes nothing but memory."""
    gc = {
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "critic.model.enable_gradient_checkpointing": True,
    }
    return _same_update(
        "gradient_checkpointing",
        plain_config(check_overrides()),
        plain_config(check_overrides(**gc)),
        lambda actor: (True, ""),
    )


def check_cpu_offload(device: str) -> list[Row]:
    """Parameter and optimizer offload (FSDP2 CPUOffloadPolicy): the same update, state on the CPU."""
    if device != "cuda":
        return [("cpu_offload", "SKIP", "offload is a no-op on the CPU")]
    off = {
        f"{p}.fsdp_config.{k}": True for p in (ACTOR, CRITIC) for k in ("param_offload", "optimizer_offload")
    }

    def where(actor: Any) -> tuple[bool, str]:
        states = [
            t for s in actor.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()
        ]
        ok = params_on(actor.module, "cpu") and all(
            getattr(t, "_local_tensor", t).device.type == "cpu" for t in states
        )
        return ok, "params+optimizer state on cpu between calls" if ok else "state left on the GPU"

    return _same_update(
        "cpu_offload", plain_config(check_overrides()), plain_config(check_overrides(**off)), where
    )


def check_vllm(device: str) -> list[Row]:
    """The vLLM rollout: greedy tokens and log-probs against the HF rollout of the same weights."""
    if device != "cuda":
        return [("vllm_rollout", "SKIP", "needs CUDA")]
    if importlib.util.find_spec("vllm") is None:
        return [("vllm_rollout", "SKIP", "vLLM is not installed (pip install rlflow[vllm])")]
    from rlflow.workers import ActorRolloutWorker

    cfg = plain_config(
        check_overrides(**{f"{ROLLOUT}.name": "vllm", f"{ROLLOUT}.gpu_memory_utilization": 0.3})
    )
    actor = build(ActorRolloutWorker, cfg)
    prompts = prompts_batch(cfg, seed=6, validate=True)
    out = actor.generate_sequences(prompts)
    expect(on_cpu(out), "generate_sequences returned device tensors")
    old = actor.compute_log_prob(training_batch(out)).batch["old_log_probs"]
    free(actor)
    hf = build(ActorRolloutWorker, plain_config(check_overrides()))
    ref = hf.generate_sequences(prompts)
    free(hf)
    same_rows = int((out.batch["responses"] == ref.batch["responses"]).all(-1).sum())
    mx, mean = masked_abs_diff(out.batch["rollout_log_probs"], old, out.batch["response_mask"])
    ok = same_rows >= ROWS - 1 and mean < 1e-3 and mx < 2e-2
    numbers = f"{same_rows}/{ROWS} rows = HF greedy; vLLM vs trainer logp max={mx:.3g} mean={mean:.3g}"
    return [("vllm_rollout", "PASS" if ok else "FAIL", numbers)]


CHECKS: dict[str, Callable[[str], list[Row]]] = {
    "update_bf16_rmpad": check_update_bf16_rmpad,
    "logprob_fp32": check_logprob_fp32,
    "hf_rollout": check_hf_rollout,
    "reward_model": check_reward_model,
    "flash_attn": check_flash_attn,
    "gradient_checkpointing": check_gradient_checkpointing,
    "cpu_offload": check_cpu_offload,
    "vllm": check_vllm,
}


# --------------------------------------------------------------------------- running and reporting


def run_checks(rank: int, device: str, names: list[str]) -> list[tuple[str, str, str, float]]:
    """Every check in this (one-rank) process; a check's exception is its FAIL row."""
    rows = []
    for name in names:
        start = time.perf_counter()
        try:
            results = CHECKS[name](device)
        except Fail as exc:
            results = [(name, "FAIL", str(exc))]
        except Exception as exc:  # the table reports it; the run goes on to the next check
            last = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{Path(last.filename).name}:{last.lineno}"
            results = [(name, "FAIL", f"{type(exc).__name__}: {str(exc)[:160]} ({where})")]
        seconds = time.perf_counter() - start
        rows += [(*r, seconds) for r in results]
        print(f"[gpu_check] {name}: {', '.join(r[1] for r in results)} in {seconds:.1f} s", flush=True)
    return rows


def environment(device: str) -> dict[str, str]:
    env = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "device": device}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = str(torch.version.cuda)
    for pkg in ("transformers", "flash_attn", "vllm"):
        if importlib.util.find_spec(pkg) is not None:
            env[pkg] = getattr(__import__(pkg), "__version__", "?")
    return env


def format_table(rows: list[tuple[str, str, str, float]]) -> str:
    """A Markdown table (it goes into docs/gpu.md as printed)."""
    lines = ["| check | result | numbers | s |", "|---|---|---|---|"]
    lines += [f"| {c} | {s} | {n} | {t:.1f} |" for c, s, n, t in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: CUDA when visible"
    )
    p.add_argument(
        "--only", nargs="+", choices=sorted(CHECKS), metavar="CHECK", help=f"of {', '.join(CHECKS)}"
    )
    p.add_argument("--json", type=Path, help="also write the rows and the environment here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.only or list(CHECKS)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "none"
    if device == "cuda" and not torch.cuda.is_available():
        device = "none"
    if device == "none":
        rows = [(n, "SKIP", "no CUDA device visible to torch", 0.0) for n in names]
    else:
        if device == "cpu":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the workers pick their device from CUDA visibility
        from rlflow.parallel.distributed import spawn_workers

        rows = spawn_workers(run_checks, 1, args=(device, names))[0]
    env = environment(device)
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=2))
    failed = [r[0] for r in rows if r[1] == "FAIL"]
    if failed:
        print(f"FAIL: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
