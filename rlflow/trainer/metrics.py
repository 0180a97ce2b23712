"""Metrics the driver computes from a finished PPO step: data statistics, timing, throughput, MFU.

Every function here is pure (tensors and dicts in, ``dict[str, float]`` out). Metric names follow verl's
(``critic/score/mean``, ``response_length/clip_ratio``, ``timing_s/gen``, ``perf/throughput``, ...), so a
verl dashboard reads an rlflow run. ``docs/metrics.md`` explains every name.

Statistics of values, advantages and returns are *not* computed here: those tensors stay in the workers
(values travel as Ray futures), which report ``critic/{advantages,returns,values}/*`` and
``critic/vf_explained_var`` as scalars (`rlflow.algos.stats`). Peak memory comes from the workers too
(`rlflow.logging.memory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from math import comb
from typing import Any

import numpy as np
import torch

__all__ = [
    "compute_data_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "expected_best_of_k",
    "reduce_metrics",
    "rollout_entropy",
    "rollout_probs_diff",
    "validation_metrics",
]

# Sections of a step whose cost grows with the number of tokens they process, and which tokens those are.
# ``gen`` produces the response tokens; the forward/backward sections run over prompt + response tokens.
# Other sections (reward, testing, save_checkpoint, step) get only ``timing_s/<name>``.
_RESPONSE_TOKEN_SECTIONS = ("gen",)
_ALL_TOKEN_SECTIONS = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update")


def _batch_tensors(batch: Any) -> Mapping[str, torch.Tensor]:
    """The TensorDict of a ``DataProto`` (or a plain mapping of tensors, for tests and scripts)."""
    tensors = getattr(batch, "batch", batch)
    if tensors is None:
        raise ValueError("metrics: the DataProto has no tensor batch")
    return tensors


def _require(tensors: Mapping[str, torch.Tensor], key: str, fn_name: str) -> torch.Tensor:
    if key not in tensors.keys():
        raise ValueError(f"{fn_name}: the batch has no {key!r} (has {sorted(tensors.keys())})")
    return tensors[key]


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``<prefix>/{mean,max,min}`` of a 1-D tensor (float64 arithmetic)."""
    v = values.detach().to(torch.float64)
    return {
        f"{prefix}/mean": float(v.mean()),
        f"{prefix}/max": float(v.max()),
        f"{prefix}/min": float(v.min()),
    }


def _lengths(
    tensors: Mapping[str, torch.Tensor], fn_name: str
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Per-sample prompt and response lengths ``(bs,)`` and the padded widths ``prompt_len, response_len``.

    ``response_len`` is the width of ``responses``; the response lengths are ``response_mask.sum(-1)``
    (or the last ``response_len`` columns of ``attention_mask`` when ``response_mask`` is absent); the
    prompt lengths are ``attention_mask[:, :prompt_len].sum(-1)``.
    """
    responses = _require(tensors, "responses", fn_name)
    attention_mask = _require(tensors, "attention_mask", fn_name)
    response_len = responses.shape[-1]
    prompt_len = attention_mask.shape[-1] - response_len
    if prompt_len < 0:
        raise ValueError(
            f"{fn_name}: attention_mask has {attention_mask.shape[-1]} columns, fewer than the "
            f"{response_len} of responses"
        )
    if "response_mask" in tensors.keys():
        response_mask = tensors["response_mask"]
    else:
        response_mask = attention_mask[:, prompt_len:]
    response_length = response_mask.to(torch.float64).sum(-1)
    prompt_length = attention_mask[:, :prompt_len].to(torch.float64).sum(-1)
    return prompt_length, response_length, prompt_len, response_len


def _is_eos(last_tokens: torch.Tensor, eos_token_id: int | Iterable[int]) -> torch.Tensor:
    ids = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]
    return torch.isin(last_tokens, torch.tensor(ids, dtype=last_tokens.dtype, device=last_tokens.device))


def compute_data_metrics(batch: Any, eos_token_id: int | Iterable[int] | None = None) -> dict[str, float]:
    """Score, reward and length statistics of the batch of one PPO step.

    Args:
        batch: a ``DataProto`` whose ``batch`` holds ``responses: (bs, response_len)``,
            ``attention_mask: (bs, prompt_len + response_len)`` (prompts left-padded),
            ``response_mask: (bs, response_len)`` (optional, else taken from ``attention_mask``),
            ``token_level_scores`` and ``token_level_rewards: (bs, response_len)``.
        eos_token_id: when given, a full-length response whose last token is an EOS id is not counted
            as clipped. Without it a response is clipped when it fills all ``response_len`` slots.

    Returns:
        ``critic/score/{mean,max,min}``: per-sequence sums of ``token_level_scores`` over the response
        axis (the outcome score sits at the last valid token, zeros elsewhere), then mean/max/min over
        sequences. ``critic/rewards/{mean,max,min}``: the same over ``token_level_rewards`` (score minus
        the in-reward KL penalty, when enabled). ``response_length/{mean,max,min}``: valid response
        tokens per sequence; ``response_length/clip_ratio``: fraction of sequences whose response fills
        ``response_len`` (cut by the length limit rather than ended by EOS).
        ``prompt_length/{mean,max,min}``: valid prompt tokens per sequence;
        ``prompt_length/clip_ratio``: fraction of prompts filling the ``prompt_len`` window.
    """
    fn = "compute_data_metrics"
    tensors = _batch_tensors(batch)
    scores = _require(tensors, "token_level_scores", fn).to(torch.float64).sum(-1)
    rewards = _require(tensors, "token_level_rewards", fn).to(torch.float64).sum(-1)
    prompt_length, response_length, prompt_len, response_len = _lengths(tensors, fn)
    if response_length.numel() == 0:
        raise ValueError(f"{fn}: the batch is empty")

    clipped = response_length == response_len
    if eos_token_id is not None and response_len > 0:
        clipped = clipped & ~_is_eos(tensors["responses"][:, -1], eos_token_id)

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", scores))
    metrics.update(_stats("critic/rewards", rewards))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float(clipped.to(torch.float64).mean())
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = float((prompt_length == prompt_len).to(torch.float64).mean())
    return metrics


def _token_counts(batch: Any, fn_name: str) -> tuple[float, float]:
    """``(response tokens, prompt + response tokens)`` of the batch (valid tokens only)."""
    prompt_length, response_length, _, _ = _lengths(_batch_tensors(batch), fn_name)
    n_response = float(response_length.sum())
    return n_response, n_response + float(prompt_length.sum())


def compute_timing_metrics(batch: Any, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """Wall time of each named section of a step, in seconds and per processed token.

    Args:
        batch: the step's ``DataProto`` (``responses``, ``attention_mask``, optional ``response_mask``).
        timing_raw: section name → seconds (``gen``, ``reward``, ``old_log_prob``, ``ref``, ``values``,
            ``adv``, ``update_critic``, ``update_actor``, ``testing``, ``save_checkpoint``, ``step``; with
            ``trainer.overlap_updates`` also ``update``, the phase in which both updates ran, and each
            role's section then overlaps the other's).

    Returns:
        ``timing_s/<name>`` for every section, and ``timing_per_token_ms/<name>`` = 1000 × seconds /
        tokens for the token-bound sections: ``gen`` over the valid response tokens; ``old_log_prob``,
        ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``, ``update`` over the valid prompt +
        response tokens. Sections with no token to divide by get no per-token entry.
    """
    n_response, n_all = _token_counts(batch, "compute_timing_metrics")
    tokens = {name: n_response for name in _RESPONSE_TOKEN_SECTIONS}
    tokens.update({name: n_all for name in _ALL_TOKEN_SECTIONS})
    metrics: dict[str, float] = {}
    for name, seconds in timing_raw.items():
        metrics[f"timing_s/{name}"] = float(seconds)
    for name, seconds in timing_raw.items():
        n = tokens.get(name, 0.0)
        if n > 0:
            metrics[f"timing_per_token_ms/{name}"] = 1000.0 * float(seconds) / n
    return metrics


def compute_throughput_metrics(
    batch: Any,
    timing_raw: Mapping[str, float],
    n_workers: int,
    actor_flops: float | None = None,
    peak_flops: float | None = None,
    critic_flops: float | None = None,
    n_critic_workers: int | None = None,
) -> dict[str, float]:
    """Tokens per second per worker and, given FLOPs estimates and a peak, the actor's and critic's MFU.

    Args:
        batch: the step's ``DataProto`` (``attention_mask: (bs, prompt_len + response_len)``).
        timing_raw: section name → seconds; needs ``step`` (and ``update_actor`` for the MFU).
        n_workers: ranks that share the work (the actor world size), > 0.
        actor_flops: FLOPs of the whole actor update of this step, summed over ranks and PPO epochs, e.g.
            ``FlopsCounter(hf_config).estimate_flops(seqlens) * ppo_epochs``
            (:mod:`rlflow.logging.flops`).
        peak_flops: peak FLOP/s of *one* worker (:func:`rlflow.logging.flops.peak_flops`).

    Returns:
        ``perf/total_num_tokens``: valid prompt + response tokens of the batch; ``perf/time_per_step``:
        ``timing_raw["step"]``; ``perf/throughput``: ``total_num_tokens / (time_per_step * n_workers)``.
        With both ``actor_flops`` and ``peak_flops``: ``perf/mfu/actor`` =
        ``actor_flops / (timing_raw["update_actor"] * n_workers * peak_flops)`` (model FLOPs utilisation,
        Chowdhery et al. 2022, PaLM, appendix B) and ``perf/achieved_tflops/actor`` (per worker); with
        ``critic_flops`` (the critic update's FLOPs, value head of one output) the same for the critic
        over ``timing_raw["update_critic"]`` and ``n_critic_workers`` (default ``n_workers``). With
        ``trainer.overlap_updates`` the two updates share the cores for the same wall time, so their MFUs
        add up to the phase's utilisation.
    """
    fn = "compute_throughput_metrics"
    if int(n_workers) <= 0:
        raise ValueError(f"{fn}: n_workers must be > 0, got {n_workers}")
    if "step" not in timing_raw:
        raise ValueError(f"{fn}: timing_raw has no 'step' (has {sorted(timing_raw)})")
    attention_mask = _require(_batch_tensors(batch), "attention_mask", fn)
    total_tokens = float(attention_mask.to(torch.float64).sum())
    time_per_step = float(timing_raw["step"])
    metrics = {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": time_per_step,
        "perf/throughput": total_tokens / (time_per_step * n_workers) if time_per_step > 0 else 0.0,
    }
    roles = [("actor", actor_flops, int(n_workers))]
    roles.append(("critic", critic_flops, int(n_critic_workers or n_workers)))
    for role, flops, workers in roles:
        if flops is None or peak_flops is None:
            continue
        update_s = float(timing_raw.get(f"update_{role}", 0.0))
        if update_s > 0 and peak_flops > 0:
            per_worker = float(flops) / (update_s * workers)
            metrics[f"perf/achieved_tflops/{role}"] = per_worker / 1e12
            metrics[f"perf/mfu/{role}"] = per_worker / float(peak_flops)
    return metrics


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Mean of each metric's list of values (e.g. one value per mini-batch or per rank).

    Args:
        metrics: name → list of numbers (a bare number is kept as is).

    Returns:
        name → float mean.

    Raises:
        ValueError: a metric has an empty list (its mean is undefined), naming the metric.
    """
    out: dict[str, float] = {}
    for key, values in metrics.items():
        if isinstance(values, int | float | np.number):
            out[key] = float(values)
            continue
        arr = np.asarray([float(v) for v in values], dtype=np.float64)
        if arr.size == 0:
            raise ValueError(f"reduce_metrics: metric {key!r} has no value to average")
        out[key] = float(arr.mean())
    return out


def rollout_probs_diff(batch: Any) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the trainer's (verl's metric names).

    ``|exp(rollout_log_probs) - exp(old_log_probs)|`` over valid response tokens: 0 up to float noise
    when the rollout and the training forward agree (DESIGN invariant 2).

    Args:
        batch: with ``rollout_log_probs``, ``old_log_probs``, ``response_mask``: (bs, response_len).

    Returns:
        ``training/rollout_probs_diff_{max,mean,std}``.
    """
    tensors = _batch_tensors(batch)
    fn_name = "rollout_probs_diff"
    mask = _require(tensors, "response_mask", fn_name).bool()
    rollout = _require(tensors, "rollout_log_probs", fn_name)
    trainer = _require(tensors, "old_log_probs", fn_name)
    diff = (rollout.double().exp() - trainer.double().exp()).abs()[mask]
    if diff.numel() == 0:
        return {}
    std = float(diff.std()) if diff.numel() > 1 else 0.0
    return {
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": std,
    }


def rollout_entropy(batch: Any) -> dict[str, float]:
    """``actor/entropy`` from the rollout (popped from ``batch``) when it stood in for the ``compute_log_prob``
    pass (bypass mode): the token-mean over the valid response tokens of the whole batch, as that pass
    computes it; {} when the rollout did not report entropies.

    Args:
        batch: with ``response_mask`` and, from the hf engine, ``rollout_entropy``: (bs, response_len).
    """
    tensors = _batch_tensors(batch)
    if "rollout_entropy" not in tensors.keys():
        return {}
    entropy = tensors.pop("rollout_entropy").double()
    mask = _require(tensors, "response_mask", "rollout_entropy").double()
    return {"actor/entropy": float((entropy * mask).sum() / mask.sum().clamp(min=1))}


def expected_best_of_k(scores: Sequence[float], k: int) -> float:
    """Expected maximum of ``k`` scores drawn without replacement from ``scores`` (exact, no bootstrap).

    With the scores sorted ascending, ``s_(1) <= ... <= s_(n)``, the ``i``-th is the maximum of a random
    ``k``-subset with probability ``C(i-1, k-1) / C(n, k)``. On 0/1 scores this is the unbiased pass@k
    estimator ``1 - C(n-c, k) / C(n, k)`` (``c`` correct samples).

    Args:
        scores: ``n >= k`` scores of one prompt's samples.
        k: subset size, ``1 <= k <= n``.
    """
    n = len(scores)
    if not 1 <= k <= n:
        raise ValueError(f"expected_best_of_k: need 1 <= k <= n, got k={k}, n={n}")
    total = comb(n, k)
    return float(sum(s * comb(i, k - 1) for i, s in enumerate(sorted(scores))) / total)


def _ks(n: int) -> list[int]:
    """1, 2, 4, ... below ``n``, and ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def validation_metrics(
    sources: Sequence[str], scores: Sequence[float], n: int, correct_at: float = 1.0
) -> dict[str, float]:
    """Validation metrics of ``n`` responses per prompt, per data source (verl's names where they exist).

    ``scores`` holds each prompt's ``n`` responses consecutively (``DataProto.repeat(n, interleave=True)``).

    Returns, for each ``src``:
        ``val-core/<src>/reward/mean@<n>``: mean score over all responses;
        with ``n > 1`` also ``val-aux/<src>/reward/std@<n>`` (per-prompt std, averaged), and for
        ``k`` in 2, 4, ... and ``n``: ``val-core/<src>/reward/best@<k>/mean`` (expected best of ``k``
        responses, `expected_best_of_k`), ``val-core/<src>/pass@<k>`` (probability that one of ``k``
        responses scores at least ``correct_at``; the unbiased estimator) — each averaged over prompts.
    """
    if n < 1 or len(scores) % n or len(sources) != len(scores):
        raise ValueError(
            f"validation_metrics: {len(scores)} scores and {len(sources)} sources are not whole groups of n={n}"
        )
    groups: dict[str, list[list[float]]] = {}
    for start in range(0, len(scores), n):
        group_sources = set(sources[start : start + n])
        if len(group_sources) != 1:
            raise ValueError(
                f"validation_metrics: responses {start}..{start + n - 1} mix data sources {group_sources}"
            )
        groups.setdefault(str(sources[start]), []).append([float(x) for x in scores[start : start + n]])
    out: dict[str, float] = {}
    for src, prompts in groups.items():
        arr = np.asarray(prompts, dtype=np.float64)
        out[f"val-core/{src}/reward/mean@{n}"] = float(arr.mean())
        if n == 1:
            continue
        out[f"val-aux/{src}/reward/std@{n}"] = float(arr.std(axis=1).mean())
        correct = (arr >= correct_at).astype(np.float64)
        for k in _ks(n)[1:]:
            out[f"val-core/{src}/reward/best@{k}/mean"] = float(
                np.mean([expected_best_of_k(p, k) for p in arr])
            )
            out[f"val-core/{src}/pass@{k}"] = float(np.mean([expected_best_of_k(c, k) for c in correct]))
        out[f"val-core/{src}/pass@1"] = float(correct.mean())
    return out
