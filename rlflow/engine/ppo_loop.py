"""Batching and stepping shared by the actor and the critic: one implementation for both roles.

A PPO update on one rank walks ``ppo_epochs`` × mini-batches × micro-batches:

* **Mini-batches** (`iter_mini_batches`): the rank's samples split into consecutive mini-batches of
  `UpdateSpec.samples_per_mini_batch` samples, shuffled per epoch by a generator seeded from the
  config seed, the training step and the epoch — so a resumed run sees the same order.
* **Micro-batches** (`split_micro_batches`): fixed size, or formed under a token budget
  (``use_dynamic_bsz``; Karmarkar–Karp balanced, the same count on every rank) with the indices to
  restore the input order.
* **Global normalisers** (`global_loss_counts`): the mini-batch's valid-token and sequence counts summed
  over the data-parallel ranks, handed to ``agg_loss`` so every micro-batch loss is scaled as a share of
  the whole mini-batch: the summed gradient equals the one-big-batch gradient (DESIGN invariant 1).
* **Step** (`optimizer_step`, called through the roles' ``_optimizer_step`` hook): clip the gradient
  norm; a non-finite norm skips the optimizer step, clears the gradients and is counted, leaving the
  weights untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from rlflow.engine.batching import MicroBatchSpec, UpdateSpec
from rlflow.engine.seqlen_balancing import rearrange_micro_batches, restore_order
from rlflow.models.padding import shared_prompt_items
from rlflow.parallel.activation_offload import ActivationOffload
from rlflow.parallel.sharded import clip_grad_norm_
from rlflow.protocol import DataProto

__all__ = [
    "FORWARD_KEYS",
    "MetricAccumulator",
    "MicroBatches",
    "global_loss_counts",
    "group_size",
    "iter_mini_batches",
    "loss_normalisers",
    "optimizer_step",
    "response_mask_of",
    "run_update",
    "select_update_batch",
    "split_micro_batches",
]


FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
"""Tensors a forward pass over prompt + response reads."""


def response_mask_of(data: DataProto) -> torch.Tensor:
    """``(bs, response_len)``: ``response_mask`` if the batch has it, else the response part of
    ``attention_mask``."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    response_len = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_len:]


def group_size(group: Any) -> int:
    """Ranks in ``group`` (1 without a process group)."""
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def iter_mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[tuple[int, DataProto]]:
    """Yield ``(epoch, mini_batch)`` for ``epochs`` passes over ``data``.

    Args:
        data: this rank's samples.
        mini_batch_size: samples per mini-batch on this rank; must divide ``len(data)``.
        epochs: number of passes (``ppo_epochs``).
        shuffle: permute the samples before each pass.
        seed: seeds the permutation together with the epoch (pass the training step in it for resume).
    """
    n = len(data)
    if mini_batch_size <= 0 or n % mini_batch_size:
        raise ValueError(
            f"ppo_mini_batch_size per rank ({mini_batch_size}) must divide the {n} samples this rank received"
        )
    for epoch in range(epochs):
        batch = data
        if shuffle:
            gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch)
            batch = data.select_idxs(torch.randperm(n, generator=gen))
        for start in range(0, n, mini_batch_size):
            yield epoch, batch.slice(start, start + mini_batch_size)


@dataclass
class MicroBatches:
    """Micro-batches of one batch, and how to put per-sample outputs back in input order."""

    batches: list[Any]
    indices: list[list[int]] | None = None  # set for dynamic batching

    def restore(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate per-micro-batch outputs ``(mbs_i, ...)`` into input order ``(bs, ...)``."""
        cat = torch.cat(outputs, dim=0)
        return cat if self.indices is None else restore_order(cat, self.indices)


def split_micro_batches(
    batch: Any, spec: MicroBatchSpec, sync_group: Any = None, share_prompts: bool = False
) -> MicroBatches:
    """Split a TensorDict of samples into micro-batches.

    Args:
        batch: TensorDict with ``attention_mask: (bs, seqlen)``.
        spec: a fixed number of samples per micro-batch (the last one holds the remainder: losses are
            normalised by global counts, so unequal micro-batches give the same gradient, and every rank
            has the same number of samples, hence of micro-batches), or a token budget (balanced; the
            same count on every rank of ``sync_group``).
        sync_group: ranks that must run the same number of micro-batches (every rank of the FSDP mesh).
        share_prompts: the forwards pack the samples of a prompt around one copy of it: token-budget
            micro-batches keep those samples together and count the tokens the shared packing feeds
            (`rlflow.models.padding.shared_prompt_items`). Fixed micro-batches are consecutive samples,
            which keeps the ``n`` interleaved samples of a prompt together when the size is a multiple of
            ``n``.
    """
    if spec.use_dynamic_bsz:
        if not spec.max_tokens_per_rank:
            raise ValueError("use_dynamic_bsz=True needs ppo_max_token_len_per_gpu (token budget) to be set")
        items = None
        if share_prompts and "responses" in batch.keys():
            items = shared_prompt_items(
                batch["input_ids"],
                batch["attention_mask"],
                batch["responses"].shape[-1],
                spec.max_tokens_per_rank,
            )
        batches, indices = rearrange_micro_batches(
            batch, max_token_len=spec.max_tokens_per_rank, dp_group=sync_group, items=items
        )
        return MicroBatches(batches, indices)
    bs = batch.batch_size[0]
    size = spec.samples_per_micro_batch or bs
    if size <= 0:
        raise ValueError(f"micro_batch_size_per_gpu must be a positive integer, got {size}")
    size = min(int(size), bs)
    return MicroBatches([batch[start : start + size] for start in range(0, bs, size)])


def global_loss_counts(response_mask: torch.Tensor, dp_group: Any = None) -> tuple[float, float]:
    """Valid tokens and sequences (rows with a valid token) of a mini-batch, summed over ``dp_group``.

    Args:
        response_mask: ``(bs, response_len)`` of this rank's part of the mini-batch.
        dp_group: the data-parallel ranks (not the sequence-parallel peers, which hold the same samples).
    """
    counts = torch.stack(
        [response_mask.sum().to(torch.float64), (response_mask.sum(-1) > 0).sum().to(torch.float64)]
    )
    if group_size(dp_group) > 1:
        dist.all_reduce(counts, group=dp_group)
    return float(counts[0]), float(counts[1])


def optimizer_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float | None
) -> tuple[float, bool]:
    """Clip gradients and step, unless their norm is not finite.

    Returns:
        ``(grad_norm, stepped)``: the total gradient norm before clipping (all ranks agree on it) and
        whether the optimizer stepped. When it did not, the gradients are cleared and no weight or
        optimizer state changed.
    """
    max_norm = float(grad_clip) if grad_clip and grad_clip > 0 else math.inf
    grad_norm = float(clip_grad_norm_(module, max_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, True


@dataclass
class MetricAccumulator:
    """Weighted sums for one mini-batch, reduced over the data-parallel ranks, then averaged over
    mini-batches (never summed): ``critic/vf_loss`` of an update is the mean of its mini-batch losses."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)
    rank_share_keys: set[str] = field(default_factory=set)

    def add(self, key: str, value: float | torch.Tensor, weight: float = 1.0) -> None:
        """Add ``value * weight`` to the running mini-batch sum of ``key``."""
        v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        self.sums[key] = self.sums.get(key, 0.0) + v * weight
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def add_rank_share(self, key: str, value: float | torch.Tensor) -> None:
        """Add a globally normalised loss term: the mini-batch value is the rank-average of the sums
        (each rank's micro-batch losses already carry the ``dp_size / global count`` scale)."""
        self.add(key, value, weight=1.0)
        self.rank_share_keys.add(key)

    def end_mini_batch(self, dp_group: Any = None, extra: Mapping[str, float] | None = None) -> None:
        """Reduce this mini-batch's sums over ``dp_group`` and record their weighted means."""
        keys = sorted(self.sums)
        if keys:
            vec = torch.tensor(
                [self.sums[k] for k in keys] + [self.weights[k] for k in keys], dtype=torch.float64
            )
            if group_size(dp_group) > 1:
                dist.all_reduce(vec, group=dp_group)
            for i, k in enumerate(keys):
                if k in self.rank_share_keys:
                    value = float(vec[i]) / group_size(dp_group)
                else:
                    w = float(vec[len(keys) + i])
                    value = float(vec[i]) / w if w else 0.0
                self.history.setdefault(k, []).append(value)
        for k, v in (extra or {}).items():
            self.history.setdefault(k, []).append(float(v))
        self.sums, self.weights = {}, {}

    def means(self) -> dict[str, float]:
        """Mean over recorded mini-batches of every metric."""
        return {k: (sum(v) / len(v) if v else 0.0) for k, v in self.history.items()}


def select_update_batch(data: DataProto, keys: list[str]) -> DataProto:
    """The tensors an update reads (those of ``keys`` present), with ``response_mask`` always set."""
    present = [k for k in keys if k in data.batch.keys()]
    out = DataProto(batch=data.batch.select(*present), meta_info=data.meta_info)
    if "response_mask" not in out.batch.keys():
        out.batch["response_mask"] = response_mask_of(data)
    return out


def loss_normalisers(
    mini_batch: Any, dp_group: Any = None, scale_factor: float | None = None
) -> dict[str, Any]:
    """``agg_loss``'s global arguments for one mini-batch (TensorDict with ``response_mask``, ``responses``);
    ``scale_factor`` is ``seq-mean-token-sum-norm``'s divisor (None: the response length)."""
    tokens, seqs = global_loss_counts(mini_batch["response_mask"], dp_group)
    return {
        "global_token_num": tokens,
        "global_seq_num": seqs,
        "dp_size": group_size(dp_group),
        "loss_scale_factor": mini_batch["responses"].shape[-1]
        if scale_factor is None
        else float(scale_factor),
    }


def run_update(
    data: DataProto,
    spec: UpdateSpec,
    step: int,
    accumulate: Callable[[DataProto, MetricAccumulator], None],
    optimizer_step: Callable[[], float],
    dp_group: Any,
    prefix: str,
) -> tuple[dict[str, float], int]:
    """``spec.epochs`` × mini-batches of ``accumulate(mini_batch, acc)`` (forward + backward of its
    micro-batches; saved activations in host memory with ``spec.offload_activations``), each followed
    by ``optimizer_step()`` (clip, step or skip; returns the norm).

    Args:
        data: this rank's samples.
        spec: sizes and schedule of the update.
        step: the training step (seeds the mini-batch shuffle with ``spec.seed``).
        accumulate: forward and backward of one mini-batch's micro-batches.
        optimizer_step: the role's ``_optimizer_step`` hook; a non-finite return means "skipped".
        dp_group: the data-parallel ranks metrics are reduced over.
        prefix: metric prefix (``actor`` / ``critic``).

    Returns:
        Metrics averaged over mini-batches, including ``<prefix>/grad_norm`` and
        ``<prefix>/skipped_steps``, and the number of skipped (non-finite) steps.
    """
    acc, skipped = MetricAccumulator(), 0
    batches = iter_mini_batches(
        data, spec.samples_per_mini_batch, spec.epochs, spec.shuffle, spec.seed + step
    )
    for _, mini in batches:
        with ActivationOffload(spec.offload_activations):
            accumulate(mini, acc)
        grad_norm = float(optimizer_step())
        skipped += int(not math.isfinite(grad_norm))
        acc.end_mini_batch(dp_group, extra={f"{prefix}/grad_norm": grad_norm})
    metrics = acc.means()
    metrics[f"{prefix}/skipped_steps"] = float(skipped)
    return metrics, skipped
