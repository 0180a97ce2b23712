"""DAPO's dynamic sampling in the trainer (``algorithm.filter_groups``): generation rounds until a step
has ``data.train_batch_size`` prompts whose responses differ in the filter metric.

The group rule is `rlflow.algos.filter_groups.informative_groups`; this module runs the rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rlflow.algos.filter_groups import informative_groups
from rlflow.config.reward_checks import FILTER_METRICS
from rlflow.config.schema import PPOTrainerConfig
from rlflow.protocol import DataProto

__all__ = ["OutOfData", "Round", "filter_metric", "sample_informative_groups"]

Round = tuple[DataProto, dict[str, float], dict[str, list[Any]]]
"""One generation round: the scored responses, the round's metrics, the reward's extra info."""


class OutOfData(Exception):
    """Dynamic sampling needed more prompts than ``trainer.total_epochs`` hold."""


def filter_metric(metric: str, batch: DataProto, extra: dict[str, list[Any]]) -> np.ndarray:
    """Per-response values of ``algorithm.filter_groups.metric``.

    Args:
        metric: a key of ``extra`` or one of `FILTER_METRICS` (the summed ``token_level_scores``; the
            KL penalty is not applied yet, and validation refuses ``seq_final_reward`` with one).
        batch: scored responses.
        extra: the reward's extra info, one list entry per response.

    Returns:
        (bs,) float64.
    """
    if metric in FILTER_METRICS:
        return batch.batch["token_level_scores"].sum(-1).numpy().astype(np.float64)
    values = extra.get(metric)
    try:
        return np.asarray(values, dtype=np.float64).reshape(len(batch))
    except (TypeError, ValueError):
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not a numeric key of the reward's extra info "
            f"(keys: {sorted(extra)}) nor one of {list(FILTER_METRICS)}; a score function that returns a "
            "dict provides its keys"
        ) from None


def sample_informative_groups(
    config: PPOTrainerConfig,
    rounds: list[Round],
    rollout: Callable[[DataProto, int], Round],
    more: Iterator[tuple[int, DataProto]] | None,
    global_steps: int,
) -> tuple[DataProto, dict[str, float]]:
    """Generate rounds until enough informative groups are kept; the step trains on the first ones.

    Args:
        config: the trainer config (``algorithm.filter_groups``, ``data.train_batch_size``,
            ``actor_rollout_ref.rollout.n``).
        rounds: the rounds so far (the first one); later rounds are appended.
        rollout: ``rollout(prompts, first_prompt) -> Round`` generates and scores a round, numbering its
            prompts from ``first_prompt``.
        more: further ``(epoch, prompts)`` batches of the training loader.
        global_steps: the step (meta info of the returned batch).

    Returns:
        ``(batch, metrics)``: ``train_batch_size × n`` responses, whole groups in generation order;
        ``train/num_gen_batches`` and ``train/informative_prompt_fraction``.

    Raises:
        RuntimeError: ``max_num_gen_batches`` rounds did not suffice.
        OutOfData: the loader ran out first.
    """
    spec = config.algorithm.filter_groups
    want = int(config.data.train_batch_size)
    n = int(config.actor_rollout_ref.rollout.n)
    limit = int(spec.max_num_gen_batches)
    kept: list[DataProto] = []
    num_kept = generated = 0
    while True:
        rolled, _, extra = rounds[-1]
        values = filter_metric(str(spec.metric), rolled, extra)
        rows, groups = informative_groups(rolled.non_tensor_batch["uid"], values)
        kept.append(rolled.select_idxs(rows).select(meta_info_keys=[]))
        num_kept += groups
        generated += len(rolled) // n
        if num_kept >= want:
            break
        if 0 < limit <= len(rounds):
            raise RuntimeError(
                f"algorithm.filter_groups: {num_kept} of data.train_batch_size={want} prompts have responses "
                f"that differ in {spec.metric!r} after {len(rounds)} generation rounds "
                f"(max_num_gen_batches={limit}): the data are too hard or too easy for the policy; raise "
                "max_num_gen_batches (0 = no limit) or use other data"
            )
        nxt = next(more, None) if more is not None else None
        if nxt is None:
            raise OutOfData(
                f"algorithm.filter_groups: the training data ran out (trainer.total_epochs="
                f"{config.trainer.total_epochs}) with {num_kept} of {want} informative prompts for the step"
            )
        rounds.append(rollout(nxt[1], generated))
    batch = DataProto.concat(kept).select_idxs(list(range(want * n)))
    batch.meta_info = {"global_steps": global_steps, "global_batch_size": len(batch)}
    return batch, {
        "train/num_gen_batches": float(len(rounds)),
        "train/informative_prompt_fraction": num_kept / generated,
    }
