"""Decoded generations for people to read: training rollouts (``trainer.rollout_data_dir``), validation
samples (``trainer.validation_data_dir``, ``trainer.log_val_generations``).

The files are `rlflow.logging.rollout_viewer` dumps (``<dir>/<step>.jsonl``, rendered by
``python scripts/view_rollouts.py``).
"""

from __future__ import annotations

from typing import Any

from rlflow.logging.rollout_viewer import dump_generations
from rlflow.protocol import DataProto

__all__ = ["decode_samples", "dump_columns", "dump_rollouts", "record_validation"]

_TEXT = ("prompt", "response", "score")


def decode_samples(tokenizer: Any, parts: list[tuple[DataProto, list[float]]]) -> dict[str, list[Any]]:
    """Columns of the samples of ``parts`` (batches with ``prompts``, ``responses``, ``attention_mask``,
    and one score per sample): decoded ``prompt`` and ``response``, ``score``, and ``ground_truth`` /
    ``data_source`` when the batch has them."""
    batch = DataProto.concat([b.select(meta_info_keys=[]) for b, _ in parts])
    prompt_len = batch.batch["prompts"].shape[-1]
    mask = batch.batch["attention_mask"].bool()
    decode = tokenizer.decode
    columns: dict[str, list[Any]] = {
        "prompt": [decode(ids[m[:prompt_len]].tolist()) for ids, m in zip(batch.batch["prompts"], mask)],
        "response": [decode(ids[m[prompt_len:]].tolist()) for ids, m in zip(batch.batch["responses"], mask)],
        "score": [s for _, part in parts for s in part],
    }
    if "reward_model" in batch.non_tensor_batch:
        columns["ground_truth"] = [str(r.get("ground_truth")) for r in batch.non_tensor_batch["reward_model"]]
    if "data_source" in batch.non_tensor_batch:
        columns["data_source"] = [str(x) for x in batch.non_tensor_batch["data_source"]]
    return columns


def dump_columns(out_dir: str, step: int, columns: dict[str, list[Any]]) -> str:
    """Write `decode_samples` columns to ``<out_dir>/<step>.jsonl``; returns the file."""
    extra = {k: v for k, v in columns.items() if k not in _TEXT}
    return dump_generations(out_dir, step, columns["prompt"], columns["response"], columns["score"], extra)


def dump_rollouts(tokenizer: Any, out_dir: str, step: int, batch: DataProto) -> str:
    """A step's scored training responses (summed ``token_level_scores``) with their ``uid`` (the responses
    of one prompt share it) to ``<out_dir>/<step>.jsonl``."""
    columns = decode_samples(tokenizer, [(batch, batch.batch["token_level_scores"].sum(-1).tolist())])
    columns["uid"] = [str(u) for u in batch.non_tensor_batch["uid"]]
    return dump_columns(out_dir, step, columns)


def record_validation(
    tokenizer: Any,
    parts: list[tuple[DataProto, list[float]]],
    step: int,
    out_dir: str | None,
    log_first: int,
    tracker: Any | None,
) -> None:
    """Validation samples: all of them to ``<out_dir>/<step>.jsonl`` (``trainer.validation_data_dir``), and
    the first ``log_first`` (the same prompts at every validation; ``trainer.log_val_generations``) to the
    tracker's ``log_generations``."""
    columns = decode_samples(tokenizer, parts)
    if out_dir:
        dump_columns(out_dir, step, columns)
    if log_first > 0 and hasattr(tracker, "log_generations"):
        count = min(log_first, len(columns["score"]))
        tracker.log_generations([{k: v[i] for k, v in columns.items()} for i in range(count)], step=step)
