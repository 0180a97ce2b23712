"""What the emulated FP8 recipes and QAT cost: one training forward + backward and one decoding-sized
forward of a model, plain against each setting, side by side in one process.

`rlflow.models.fp8` and `rlflow.models.qat` compute the numbers of FP8 GEMMs and FP4 weights without FP8 or
FP4 kernels (each operand quantized and dequantized, FP32 products), so they cost time rather than save it;
this prints how much, and where (quantizing vs the products). Variants run in alternating order (A B C ...,
then reversed) for ``--rounds`` rounds after a warm-up; the table reports medians and the median of each
variant's time over the plain one's in the same round.

Usage::

    python scripts/bench/bench_low_precision.py --hidden 384 --layers 6 --tokens 2656 --rounds 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from rlflow.models.fp8 import Fp8Recipe, install_fp8, quantize_fp8_weights_
from rlflow.models.qat import QATSpec, install_qat, qat_quantize_weights_
from rlflow.models.tiny import TinyModelConfig, build_tiny_model

VARIANTS: dict[str, Callable[[torch.nn.Module], None]] = {
    "plain": lambda m: None,
    "fp8 tensorwise": lambda m: install_fp8(m, Fp8Recipe("e4m3", "tensorwise")),
    "fp8 blockwise": lambda m: install_fp8(m, Fp8Recipe("hybrid", "blockwise")),
    "fp8 mxfp8": lambda m: install_fp8(m, Fp8Recipe("e4m3", "mxfp8")),
    "qat w4a16": lambda m: install_qat(m, QATSpec("w4a16")),
}


def _train_step(model: torch.nn.Module, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    model(ids).logits.float().logsumexp(-1).mean().backward()
    return time.perf_counter() - start


def _decode_forward(model: torch.nn.Module, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model(ids)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument(
        "--tokens", type=int, default=2656, help="training tokens per step (16 x 166 default)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = TinyModelConfig(
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128),
        tie_word_embeddings=False,
    )
    base = build_tiny_model(config)
    models = {}
    for name, install in VARIANTS.items():
        models[name] = copy.deepcopy(base)
        install(models[name])
    rollout = copy.deepcopy(base)  # the FP8 rollout's copy: weights quantized once, activations per token
    install_fp8(rollout, Fp8Recipe("e4m3", "blockwise"))
    quantize_fp8_weights_(rollout)
    qat_rollout = copy.deepcopy(base)
    qat_quantize_weights_(qat_rollout, QATSpec("w4a16"))

    rows = args.tokens // 166 or 1
    train_ids = torch.randint(3, 250, (rows, args.tokens // rows))
    decode_ids = torch.randint(3, 250, (16, 1))  # one decoding step of 16 rows (no cache: the products)
    names = list(models)
    decode = {"plain": base, "fp8 rollout (weights quantized once)": rollout, "qat rollout": qat_rollout}
    train_times: dict[str, list[float]] = {n: [] for n in names}
    decode_times: dict[str, list[float]] = {n: [] for n in decode}
    for r in range(args.rounds + 1):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            models[name].zero_grad(set_to_none=True)
            t = _train_step(models[name], train_ids)
            if r:
                train_times[name].append(t)
        for name in decode if r % 2 == 0 else list(decode)[::-1]:
            t = min(_decode_forward(decode[name], decode_ids) for _ in range(5))
            if r:
                decode_times[name].append(t)
    params = sum(p.numel() for p in base.parameters()) / 1e6
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, {params:.1f}M parameters; {torch.get_num_threads()} "
        f"threads; {args.rounds} rounds"
    )
    print(f"### forward + backward, {rows} x {args.tokens // rows} tokens")
    print("| variant | median s | x plain |")
    print("|---|---|---|")
    for name in names:
        ratio = statistics.median(t / p for t, p in zip(train_times[name], train_times["plain"]))
        print(f"| {name} | {statistics.median(train_times[name]):.3f} | {ratio:.2f} |")
    print("### one forward of 16 rows x 1 token (a decoding step's products, best of 5)")
    print("| variant | median ms | x plain |")
    print("|---|---|---|")
    for name in decode:
        ratio = statistics.median(t / p for t, p in zip(decode_times[name], decode_times["plain"]))
        print(f"| {name} | {1e3 * statistics.median(decode_times[name]):.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
