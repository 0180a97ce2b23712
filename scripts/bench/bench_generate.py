"""Generation throughput of the HF rollout loop vs transformers' ``generate``, side by side in one run.

Methods (same model, same prompts, same sampling: temperature 1, top-k 50, top-p 0.9, EOS stops a row):

* ``ours``: `rlflow.rollout.hf.HFRollout.generate_sequences` (own KV-cache loop, DynamicCache).
* ``generate``: plain batched ``model.generate(do_sample=True, ...)`` (DynamicCache).
* ``generate_static``: ``model.generate(..., cache_implementation="static")``.
* ``continuous``: ``model.generate_batch`` (transformers continuous batching, paged cache).

The machine is shared and noisy, so every round runs all methods back to back (A B C D, D C B A, ...)
after one warm-up round; the table reports medians, minima and the median over rounds of each method's
time divided by ``generate``'s time in the same round. Tokens counted are the generated tokens up to and
including each row's EOS (``--num-eos`` k makes ids 2..k+1 all EOS, so rows stop at varied lengths).

Usage::

    python scripts/bench/bench_generate.py --batch-sizes 16 64 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from rlflow.config import config_section
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.protocol import DataProto
from rlflow.rollout.hf import HFRollout
from rlflow.utils.torch_functional import get_response_mask

PAD = 0
EOS: list[int] = [2]  # set from --num-eos: more EOS ids = rows stop earlier and at more varied lengths
SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": 0.9}


def make_prompts(batch_size: int, max_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of 16..max_len tokens: ``(ids, mask)``, each ``(batch_size, max_len)``."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min(16, max_len), max_len + 1, (batch_size,), generator=gen)
    ids = torch.randint(3, 259, (batch_size, max_len), generator=gen)
    mask = (torch.arange(max_len) >= (max_len - lengths).unsqueeze(1)).long()
    return ids * mask + PAD * (1 - mask), mask


def run_ours(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, response_len: int) -> int:
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    prompts = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        meta_info={"eos_token_id": EOS, "pad_token_id": PAD},
    )
    seed = torch.initial_seed()  # the round's seed: each round draws fresh samples, as generate does
    config = config_section(
        "actor_rollout_ref.rollout",
        response_length=response_len,
        prompt_length=ids.shape[1],
        seed=seed,
        **SAMPLING,
    )
    out = HFRollout(model, config).generate_sequences(prompts)
    return int(out.batch["response_mask"].sum())


def run_generate(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, response_len: int, static: bool = False
) -> int:
    kwargs = {"cache_implementation": "static"} if static else {}
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        max_new_tokens=response_len,
        eos_token_id=EOS,
        pad_token_id=PAD,
        **SAMPLING,
        **kwargs,
    )
    responses = out[:, ids.shape[1] :]
    if responses.shape[1] == 0:
        return 0
    return int(get_response_mask(responses, EOS).sum())


def run_continuous(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, response_len: int) -> int:
    from transformers import GenerationConfig

    inputs = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    config = GenerationConfig(
        max_new_tokens=response_len, do_sample=True, eos_token_id=EOS, pad_token_id=PAD, **SAMPLING
    )
    outs = model.generate_batch(inputs=inputs, generation_config=config, progress_bar=False, warmup=False)
    return sum(len(o.generated_tokens) for o in outs.values())


METHODS: dict[str, Callable[..., int]] = {
    "ours": run_ours,
    "generate": run_generate,
    "generate_static": lambda *a: run_generate(*a, static=True),
    "continuous": run_continuous,
}


def bench(model: torch.nn.Module, methods: list[str], batch_size: int, args: argparse.Namespace) -> None:
    """Time every method on the same prompts, round by round; print medians and paired ratios."""
    ids, mask = make_prompts(batch_size, args.prompt_len, seed=batch_size)
    times: dict[str, list[float]] = {m: [] for m in methods}
    tokens: dict[str, list[int]] = {m: [] for m in methods}
    failed: dict[str, str] = {}
    for rep in range(args.repeats + 1):  # round 0 is the warm-up
        order = methods if rep % 2 else methods[::-1]  # A B C, C B A, ...: no method always runs first
        for name in order:
            if name in failed:
                continue
            torch.manual_seed(rep)
            start = time.perf_counter()
            try:
                with torch.no_grad():
                    n_tok = METHODS[name](model, ids, mask, args.response_len)
            except Exception as exc:  # report a method that does not run here instead of aborting
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                continue
            if rep > 0:
                times[name].append(time.perf_counter() - start)
                tokens[name].append(n_tok)
    print(
        f"\nbatch={batch_size} prompt<={args.prompt_len} response<={args.response_len} rounds={args.repeats}"
    )
    print(
        f"{'method':16s} {'median s':>9s} {'min s':>8s} {'tok/s':>8s} {'tokens':>7s} {'paired time ratio':>18s}"
    )
    ref = times.get("generate") if "generate" not in failed else None
    for name in methods:
        if name in failed:
            print(f"{name:16s} failed: {failed[name]}")
            continue
        med, tok = statistics.median(times[name]), statistics.median(tokens[name])
        # time / generate's time in the same round, median over rounds (robust to load drifting between rounds)
        ratio = f"{statistics.median(a / b for a, b in zip(times[name], ref)):.2f}x" if ref else "-"
        print(f"{name:16s} {med:9.3f} {min(times[name]):8.3f} {tok / med:8.0f} {tok:7.0f} {ratio:>18s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--num-eos", type=int, default=1, help="EOS ids (2, 3, ...): more = earlier, varied stops"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    parser.add_argument("--hidden-size", type=int, default=TinyModelConfig.hidden_size)
    parser.add_argument("--layers", type=int, default=TinyModelConfig.num_hidden_layers)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    EOS[:] = list(range(2, 2 + args.num_eos))
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    model = build_tiny_model(TinyModelConfig(hidden_size=args.hidden_size, num_hidden_layers=args.layers))
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, model hidden={args.hidden_size} layers={args.layers}"
    )
    for batch_size in args.batch_sizes:
        bench(model, methods, batch_size, args)


if __name__ == "__main__":
    main()
