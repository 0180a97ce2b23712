"""Log-prob and entropy kernels on the logits: eager vs ``use_torch_compile`` (`rlflow.utils.logit_blocks`).

For each (tokens, vocab) size, runs `logprobs_from_logits` + `entropy_from_logits` forward and backward
(the actor update's per-micro-batch work on the logits) eagerly and compiled, alternated A B B A over
``--rounds`` rounds after one warm-up call each (which, compiled, includes the compilation), and prints
the medians, the median per-round ratio, and where the time goes (forward / backward). One torch thread
unless ``--threads``.

    python scripts/bench/bench_logit_kernels.py [--sizes 4096x272,2048x32000,1024x151936] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlflow.utils.torch_functional import entropy_from_logits, logprobs_from_logits


def _one(logits: torch.Tensor, labels: torch.Tensor, compiled: bool) -> tuple[float, float]:
    """Seconds of the forward and of the backward of ``sum(log_probs) + sum(entropy)``."""
    leaf = logits.detach().requires_grad_(True)
    t0 = time.perf_counter()
    loss = logprobs_from_logits(leaf, labels, compiled=compiled).sum()
    loss = loss + entropy_from_logits(leaf, compiled=compiled).sum()
    t1 = time.perf_counter()
    loss.backward()
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096x272,2048x32000,1024x151936")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds (A B B A)")
    header = (
        "tokens x vocab | eager fwd / bwd (s) | compiled fwd / bwd (s) | first compiled call (s) | speed-up"
    )
    print(header)
    print("-" * len(header))
    for size in args.sizes.split(","):
        n, vocab = (int(v) for v in size.lower().split("x"))
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(n, vocab, generator=g) * 3
        labels = torch.randint(0, vocab, (n,), generator=g)
        _one(logits, labels, False)
        t = time.perf_counter()
        _one(logits, labels, True)  # compiles (or loads inductor's on-disk cache)
        first = time.perf_counter() - t
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        ratios = []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {c: _one(logits, labels, c) for c in order}
            for c, v in got.items():
                times[c].append(v)
            ratios.append(sum(got[False]) / sum(got[True]))
        med = {c: [statistics.median(x[i] for x in times[c]) for i in (0, 1)] for c in times}
        print(
            f"{n} x {vocab} | {med[False][0]:.4f} / {med[False][1]:.4f} | {med[True][0]:.4f} / "
            f"{med[True][1]:.4f} | {first:.1f} | {statistics.median(ratios):.2f}x"
        )


if __name__ == "__main__":
    main()
