"""The trainer's validation pass: generation with ``rollout.val_kwargs`` over the validation set, scored like
training samples (reward-model group, then the validation reward function)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlflow.protocol import DataProto
from rlflow.trainer.worker_groups import WorkerGroups

__all__ = ["ValidationResult", "run_validation"]


@dataclass
class ValidationResult:
    """Per generated response: its ``data_source`` and its score (the sum of its token rewards); and, when
    kept, each scored batch with its scores (for `rlflow.trainer.generations.record_validation`)."""

    sources: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    batches: list[tuple[DataProto, list[float]]] = field(default_factory=list)


def run_validation(
    dataloader: Iterable[dict[str, Any]],
    groups: WorkerGroups,
    reward_fn: Callable[..., dict[str, Any]],
    meta: dict[str, Any],
    n: int,
    keep_batches: bool = False,
) -> ValidationResult:
    """Generate ``n`` responses per validation prompt and score them.

    Args:
        dataloader: the validation batches (collated dataset rows).
        groups: the trainer's worker groups (actor for generation, reward model when enabled).
        reward_fn: the validation reward function (``return_dict=True`` gives ``reward_tensor``).
        meta: the generation ``meta_info`` (``validate=True``: the rollout uses ``val_kwargs``).
        n: ``actor_rollout_ref.rollout.val_kwargs.n``; RuntimeError when the rollout returns another count.
        keep_batches: also return the scored batches.
    """
    result = ValidationResult()
    for raw in dataloader:
        batch = DataProto.from_single_dict(raw)
        gen_batch = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
        gen_batch.meta_info.update(meta)
        out = groups.actor.generate_sequences(gen_batch)
        out.meta_info = {}
        if len(out) != n * len(batch):
            raise RuntimeError(
                f"validation: {len(out)} responses for {len(batch)} prompts, expected "
                f"actor_rollout_ref.rollout.val_kwargs.n={n} each"
            )
        batch = batch.repeat(n, interleave=True).union(out)
        if groups.reward_model is not None:
            batch.union(groups.reward_model.compute_rm_score(batch).select(meta_info_keys=[]))
        seq_scores = reward_fn(batch, return_dict=True)["reward_tensor"].sum(-1).tolist()
        sources = batch.non_tensor_batch.get("data_source", np.array(["unknown"] * len(batch), dtype=object))
        result.sources.extend(str(src) for src in sources)
        result.scores.extend(float(s) for s in seq_scores)
        if keep_batches:
            result.batches.append((batch, seq_scores))
    return result
