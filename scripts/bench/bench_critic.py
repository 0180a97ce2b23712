"""Critic update benchmark: remove-padding vs padded, dynamic vs fixed micro-batching, Ulysses SP memory.

Three measurements of `rlflow.engine.critic.DataParallelPPOCritic.update_critic` on a Qwen2 value model
(``Qwen2ForTokenClassification``, one label) wrapped with FSDP2 on gloo, fp32, CPU:

1. **Remove-padding vs padded.** One mini-batch of ``--batch-size`` samples whose total lengths are spread
   evenly over ``[L/4, L]`` (``L = --seq-len``; prompts left-padded to ``L/2``, responses right-padded to
   ``L/2``), so that padded tokens / real tokens is about 1.6. Throughput counts real tokens only. The
   ideal speed-up of remove-padding is padded tokens / real tokens; the goal (issue 5) is >= 0.8 x ideal.
2. **Dynamic vs fixed micro-batching**, both with remove-padding (the padded forward keeps every row at
   ``L`` columns, so grouping cannot change its work): fixed micro-batches of ``--micro-batch-size``
   samples vs micro-batches formed under a token budget of ``--dyn-slack`` x (real tokens / number of fixed
   micro-batches), i.e. about as many micro-batches, but balanced by Karmarkar-Karp.
3. **Peak memory, Ulysses SP 2 vs SP 1** on one ``--long-seq-len`` sequence per data-parallel group, two
   gloo processes (FSDP over both in either case, so parameter shards are the same): SP 1 gives each rank
   its own sequence (dp 2); SP 2 splits one sequence over the two ranks (dp 1). Each variant runs in
   fresh processes: a short warm-up update (creates the AdamW state), then the long update; the figure is
   the per-rank peak RSS (``getrusage`` ``ru_maxrss``) minus the RSS just before the long update.

Parts 1 and 2 run in one single-rank process, all variants on copies of the same initial weights, in the
order A B C, C B A, ... after ``--warmup`` rounds; the table gives medians, and ratios are the median over
rounds of the per-round ratio (the machine is shared and noisy). Each update is timed by the wall clock and
by the process CPU time (``time.process_time``; with one thread per process it is the work done, and it
barely moves when other jobs load the machine). Part 3 alternates SP1 SP2, SP2 SP1, ...

Usage::

    python scripts/bench/bench_critic.py                      # defaults: ~2 min CPU; 3-6 min wall on 2 busy cores
    python scripts/bench/bench_critic.py --repeats 3 --mem-repeats 2 --long-seq-len 2048   # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import math
import os
import platform
import resource
import statistics
import time
import warnings
from typing import Any

import torch

from rlflow.engine.seqlen_balancing import rearrange_micro_batches
from rlflow.parallel.distributed import spawn_workers
from rlflow.protocol import DataProto

MIB = 2**20


def _setup_worker(threads: int) -> None:
    """Intra-op threads of this process; silence FSDP2's 'returned a view tensor' warning (once per model)."""
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")


# ---- model, data, critic ---------------------------------------------------------------------------------


def build_value_model(model_kw: dict[str, int], rmpad: bool) -> torch.nn.Module:
    """Seeded ``Qwen2ForTokenClassification`` (``num_labels=1``, no dropout), SDPA or packed attention."""
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    from rlflow.models.attention import set_packed_attention

    cfg = Qwen2Config(
        vocab_size=model_kw["vocab"],
        hidden_size=model_kw["hidden"],
        intermediate_size=model_kw["intermediate"],
        num_hidden_layers=model_kw["layers"],
        num_attention_heads=model_kw["heads"],
        num_key_value_heads=model_kw["kv_heads"],
        max_position_embeddings=model_kw["max_pos"],
        tie_word_embeddings=False,
        num_labels=1,
        classifier_dropout=0.0,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(1)
    model = Qwen2ForTokenClassification(cfg).float()
    if rmpad:
        set_packed_attention(model)
    return model


def role_config(settings: dict[str, Any], mini_batch_size: int) -> dict[str, Any]:
    """Critic config (per-rank sizes) for one variant: ``settings`` has ``micro``, ``dynamic`` (token
    budget or None), ``rmpad`` and ``sp``."""
    dynamic = settings.get("dynamic")
    return {
        "ppo_mini_batch_size": mini_batch_size,
        "ppo_micro_batch_size_per_gpu": settings.get("micro"),
        "use_dynamic_bsz": dynamic is not None,
        "ppo_max_token_len_per_gpu": dynamic,
        "ppo_epochs": 1,
        "shuffle": False,
        "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean",
        "grad_clip": 1.0,
        "ulysses_sequence_parallel_size": settings.get("sp", 1),
        "model": {"use_remove_padding": bool(settings.get("rmpad"))},
    }


def build_critic(settings: dict[str, Any], world: int, model_kw: dict[str, int], mini_batch_size: int):
    """FSDP2-wrapped critic with AdamW on this process group; returns ``(critic, dims)``."""
    from rlflow.engine.critic import DataParallelPPOCritic
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import apply_fsdp

    sp = int(settings.get("sp", 1))
    model = build_value_model(model_kw, bool(settings.get("rmpad")))
    dims = ParallelDims(
        world_size=world,
        ulysses_sequence_parallel_size=sp,
        num_attention_heads=model_kw["heads"],
        num_key_value_heads=model_kw["kv_heads"],
    )
    dims.build_meshes("cpu")
    model = apply_fsdp(model, dims, strategy="fsdp2")
    groups = {
        "dp_group": dims.ulysses_mesh["dp"].get_group(),
        "sp_group": dims.ulysses_mesh["sp"].get_group() if sp > 1 else None,
        "sync_group": torch.distributed.group.WORLD,
    }
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return DataParallelPPOCritic(role_config(settings, mini_batch_size), model, optim, **groups), dims


def make_batch(
    prompt_lens: list[int],
    response_lens: list[int],
    prompt_len: int,
    response_len: int,
    vocab: int,
    seed: int,
) -> DataProto:
    """Critic-update batch: left-padded prompts, right-padded responses, random values and returns.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``: (bs, prompt_len + response_len); ``responses``,
        ``response_mask``, ``values``, ``returns``: (bs, response_len).
    """
    gen = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    ids = torch.zeros(bs, prompt_len + response_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[i, prompt_len - p : prompt_len + r] = torch.randint(1, vocab, (p + r,), generator=gen)
        mask[i, prompt_len - p : prompt_len + r] = 1
    response_mask = mask[:, prompt_len:].clone()
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt_len:].clone(),
            "response_mask": response_mask,
            "values": torch.randn(bs, response_len, generator=gen) * response_mask,
            "returns": torch.randn(bs, response_len, generator=gen) * response_mask,
        },
        meta_info={"global_steps": 1},
    )


def varied_lengths(batch_size: int, seq_len: int, seed: int) -> tuple[list[int], list[int]]:
    """Prompt and response lengths whose totals are spread evenly over ``[seq_len/4, seq_len]`` (shuffled);
    prompt part at most ``seq_len // 2``, response part at least 1 and at most the rest."""
    gen = torch.Generator().manual_seed(seed)
    prompt_max, response_max = seq_len // 2, seq_len - seq_len // 2
    totals = torch.linspace(seq_len / 4, seq_len, batch_size).round().long()
    totals = totals[torch.randperm(batch_size, generator=gen)].tolist()
    prompts, responses = [], []
    for t in totals:
        lo, hi = max(1, t - prompt_max), min(response_max, t - 1)
        r = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        prompts.append(t - r)
        responses.append(r)
    return prompts, responses


def throughput_batch(args: argparse.Namespace) -> DataProto:
    prompts, responses = varied_lengths(args.batch_size, args.seq_len, seed=0)
    half = args.seq_len // 2
    return make_batch(prompts, responses, half, args.seq_len - half, args.vocab, seed=0)


def model_kwargs(args: argparse.Namespace) -> dict[str, int]:
    return {
        "vocab": args.vocab,
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "layers": args.layers,
        "heads": 4,
        "kv_heads": 2,
        "max_pos": max(args.seq_len, args.long_seq_len),
    }


# ---- parts 1 and 2: throughput, one process ----------------------------------------------------------


def _throughput_worker(
    rank: int, variants: dict[str, dict], args: argparse.Namespace
) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds per ``update_critic`` of every variant, rounds ``A B C, C B A, ...`` after
    warm-up: ``{"wall": {variant: [s, ...]}, "cpu": {...}}``."""
    _setup_worker(args.threads)
    data = throughput_batch(args)
    critics = {name: build_critic(s, 1, model_kwargs(args), len(data))[0] for name, s in variants.items()}
    names = list(variants)
    times: dict[str, dict[str, list[float]]] = {"wall": {n: [] for n in names}, "cpu": {n: [] for n in names}}
    for rnd in range(args.warmup + args.repeats):
        for name in names if rnd % 2 == 0 else names[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            critics[name].update_critic(data)
            if rnd >= args.warmup:
                times["wall"][name].append(time.perf_counter() - wall)
                times["cpu"][name].append(time.process_time() - cpu)
    return times


def micro_batch_tokens(data: DataProto, settings: dict[str, Any]) -> list[int]:
    """Real tokens of each micro-batch the critic will form (same rules as ``split_micro_batches``)."""
    mask = data.batch["attention_mask"]
    if settings.get("dynamic") is not None:
        _, parts = rearrange_micro_batches({"attention_mask": mask}, max_token_len=settings["dynamic"])
        return [int(mask[p].sum()) for p in parts]
    return [int(m.sum()) for m in mask.split(settings["micro"])]


# ---- part 3: Ulysses peak memory, fresh processes ---------------------------------------------------------


def _current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc), so the baseline RSS holds only live memory."""
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _memory_worker(rank: int, sp: int, args: argparse.Namespace) -> dict[str, float]:
    """Peak RSS increase of one long-sequence critic update on this rank (fresh process)."""
    _setup_worker(args.threads)
    settings = {"micro": 1, "rmpad": True, "sp": sp}
    critic, dims = build_critic(settings, 2, model_kwargs(args), 1)

    def one_sequence(total: int) -> DataProto:  # full (unpadded) sequence: half prompt, half response
        half = total // 2
        batch = make_batch(
            [half] * dims.dp_size, [total - half] * dims.dp_size, half, total - half, args.vocab, 0
        )
        return batch.slice(dims.dp_rank, dims.dp_rank + 1)

    critic.update_critic(one_sequence(64))  # warm-up: optimizer state, lazy initialisation
    data = one_sequence(args.long_seq_len)
    _trim_heap()
    rss_before, peak_before = _current_rss(), _peak_rss()
    wall, cpu = time.perf_counter(), time.process_time()
    critic.update_critic(data)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak_after = _peak_rss()
    return {
        "increase": peak_after - rss_before,
        "peak": peak_after,
        "valid": float(peak_after > peak_before),
        "wall": wall,
        "cpu": cpu,
        "tokens": args.long_seq_len // sp,
    }


# ---- report ------------------------------------------------------------------------------------------


def _paired_ratio(num: list[float], den: list[float]) -> str:
    """Median over rounds of ``num[i] / den[i]``, with the range over rounds: ``"1.62x (1.55..1.70)"``."""
    ratios = [a / b for a, b in zip(num, den)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}..{max(ratios):.2f})"


def _median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den))


def report_throughput(
    args: argparse.Namespace, variants: dict[str, dict], times: dict[str, dict[str, list[float]]]
) -> None:
    """Print the per-variant table (medians) and the paired ratios, wall clock and process CPU time."""
    data = throughput_batch(args)
    real = int(data.batch["attention_mask"].sum())
    padded = data.batch["attention_mask"].numel()
    ideal = padded / real
    lens = data.batch["attention_mask"].sum(-1)
    print(
        f"\n### Critic update throughput (batch {args.batch_size}, L={args.seq_len}, lengths "
        f"{int(lens.min())}..{int(lens.max())}, real tokens {real}, padded tokens {padded}; "
        f"{args.repeats} rounds)\n"
    )
    print(
        "| variant | micro-batches | max real tokens / micro-batch | median wall s | median CPU s "
        "| real tok/s (wall) | real tok/s (CPU) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, settings in variants.items():
        toks = micro_batch_tokens(data, settings)
        wall, cpu = (statistics.median(times[k][name]) for k in ("wall", "cpu"))
        print(
            f"| {name} | {len(toks)} | {max(toks)} | {wall:.2f} | {cpu:.2f} | {real / wall:.0f} | {real / cpu:.0f} |"
        )
    print("\n| ratio: median of per-round ratios (range) | wall | CPU | reference |")
    print("|---|---|---|---|")
    speedup = {k: _median_ratio(v["padded, fixed"], v["remove-padding, fixed"]) for k, v in times.items()}
    verdict = ", ".join(
        f"{k} {'met' if speedup[k] >= 0.8 * ideal else 'NOT met'} ({speedup[k] / ideal:.2f} x ideal)"
        for k in ("wall", "cpu")
    )
    pad = [
        _paired_ratio(times[k]["padded, fixed"], times[k]["remove-padding, fixed"]) for k in ("wall", "cpu")
    ]
    print(
        f"| remove-padding / padded throughput | {pad[0]} | {pad[1]} | ideal {ideal:.2f}x (padded / real "
        f"tokens); goal >= 0.8 x ideal = {0.8 * ideal:.2f}x: {verdict} |"
    )
    dyn = [
        _paired_ratio(times[k]["remove-padding, fixed"], times[k]["remove-padding, dynamic"])
        for k in ("wall", "cpu")
    ]
    print(
        f"| dynamic / fixed micro-batching throughput (remove-padding) | {dyn[0]} | {dyn[1]} | 1.00x = same speed |"
    )


def report_memory(args: argparse.Namespace, results: dict[int, list[list[dict]]]) -> None:
    """Print per-rank peak RSS increase (max over the two ranks of a run; median and range over runs)."""
    print(
        f"\n### Ulysses peak memory (one {args.long_seq_len}-token sequence per DP group, 2 gloo ranks, "
        f"{args.mem_repeats} fresh runs each)\n"
    )
    print(
        "| SP | tokens per rank | peak RSS increase per rank, MiB: median (range) | peak RSS per rank, MiB "
        "| update wall s | update CPU s |"
    )
    print("|---|---|---|---|---|---|")
    inc = {}
    for sp, runs in results.items():
        inc[sp] = [max(r["increase"] for r in ranks) / MIB for ranks in runs]
        med = {
            k: statistics.median(max(r[k] for r in ranks) for ranks in runs) for k in ("peak", "wall", "cpu")
        }
        flag = "" if all(r["valid"] for ranks in runs for r in ranks) else " (warm-up peak not exceeded!)"
        print(
            f"| {sp} | {runs[0][0]['tokens']} | {statistics.median(inc[sp]):.0f} "
            f"({min(inc[sp]):.0f}..{max(inc[sp]):.0f}){flag} | {med['peak'] / MIB:.0f} | {med['wall']:.2f} "
            f"| {med['cpu']:.2f} |"
        )
    print(
        f"\nSP2 / SP1 peak RSS increase per rank: {_paired_ratio(inc[2], inc[1])} "
        "(activations alone would give 0.50x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512, help="L: prompt L/2 + response L/2")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument(
        "--dyn-slack", type=float, default=1.1, help="dynamic budget / mean fixed micro tokens"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--long-seq-len", type=int, default=4096)
    parser.add_argument("--mem-repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--parts", default="throughput,memory")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(
        f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, threads/process "
        f"{args.threads}; Qwen2 value model hidden {args.hidden}, {args.layers} layers, 4 heads, 2 kv heads, "
        f"intermediate {args.intermediate}, vocab {args.vocab}; FSDP2, fp32, AdamW"
    )
    start = time.perf_counter()
    if "throughput" in parts:
        data = throughput_batch(args)
        n_fixed = math.ceil(args.batch_size / args.micro_batch_size)
        budget = max(
            math.ceil(args.dyn_slack * int(data.batch["attention_mask"].sum()) / n_fixed),
            int(data.batch["attention_mask"].sum(-1).max()),
        )
        mbs = args.micro_batch_size
        variants = {
            "padded, fixed": {"micro": mbs, "rmpad": False},
            "remove-padding, fixed": {"micro": mbs, "rmpad": True},
            "remove-padding, dynamic": {"dynamic": budget, "rmpad": True},
        }
        times = spawn_workers(_throughput_worker, 1, args=(variants, args))[0]
        report_throughput(args, variants, times)
        print(f"(fixed: {mbs} samples per micro-batch; dynamic: budget {budget} tokens)")
    if "memory" in parts:
        results: dict[int, list[list[dict]]] = {1: [], 2: []}
        for rnd in range(args.mem_repeats):
            for sp in (1, 2) if rnd % 2 == 0 else (2, 1):
                results[sp].append(spawn_workers(_memory_worker, 2, args=(sp, args)))
        report_memory(args, results)
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
