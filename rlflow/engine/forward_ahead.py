"""The forwards of an on-policy update, run before the update's loss inputs exist (``trainer.forward_ahead``).

An update of one PPO epoch over one mini-batch (`is_single_pass`) runs each micro-batch's forward on the
weights that generated the step's responses, and the forward reads only the responses: not the
advantages, the returns or the reference's log-probs that its loss needs. The actor's forwards can
therefore run while the critic computes its values, and the critic's values *are* its update's forwards
(the same weights, the same samples), so the update need not run them again. `run_ahead` runs the
update's micro-batch forwards with autograd and keeps their outputs and graphs; the update then takes
each micro-batch's outputs (`ForwardAhead.take`) instead of its forward and only computes the loss and
the backward. Same weights, same micro-batches, same kernels: the update's gradients are those it would
have computed itself.

`take` checks that the update's micro-batch is the one that ran ahead (its ``input_ids`` and
``attention_mask``); anything else (another batch, another split) runs its own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlflow.engine.batching import UpdateSpec
from rlflow.engine.ppo_loop import FORWARD_KEYS, iter_mini_batches, split_micro_batches
from rlflow.protocol import DataProto

__all__ = ["ForwardAhead", "is_single_pass", "run_ahead"]

_INDEX = "_ahead_index"  # each sample's index in the update's input, carried through the shuffle


def is_single_pass(spec: UpdateSpec | None, samples: int) -> bool:
    """True when the update of ``samples`` samples is one epoch over one mini-batch, and its activations
    stay in memory (``offload_activations`` moves them only inside the update's own forwards)."""
    return (
        spec is not None
        and spec.epochs == 1
        and spec.samples_per_mini_batch >= samples
        and not spec.offload_activations
    )


@dataclass
class ForwardAhead:
    """The outputs of the update's micro-batch forwards, computed ahead, one per micro-batch."""

    keys: list[tuple[torch.Tensor, torch.Tensor]]  # input_ids, attention_mask of each micro-batch
    outputs: list[Any]

    def take(self, index: int, micro_batch: Any) -> Any | None:
        """The outputs of micro-batch ``index`` if it is the one that ran ahead, else None."""
        if index >= len(self.outputs) or self.outputs[index] is None:
            return None
        ids, mask = self.keys[index]
        if not (
            torch.equal(ids, micro_batch["input_ids"]) and torch.equal(mask, micro_batch["attention_mask"])
        ):
            return None
        out, self.outputs[index] = self.outputs[index], None  # the graph is freed by its backward
        return out


def run_ahead(
    data: DataProto,
    spec: UpdateSpec,
    step: int,
    forward: Callable[[Any], Any],
    sync_group: Any = None,
    share_prompts: bool = False,
) -> tuple[ForwardAhead, Any, torch.Tensor]:
    """Run ``forward`` on the micro-batches the single-pass update of ``data`` at ``step`` will form.

    Args:
        data: the rank's samples as the update will receive them (the forward keys are read).
        spec: the role's `UpdateSpec` (`is_single_pass` must hold); its micro-batching is the update's.
        step: the training step (seeds the mini-batch permutation, as `run_update`).
        forward: one micro-batch's forward with autograd (the role's ``_forward_micro_batch``).
        sync_group / share_prompts: as `split_micro_batches`.

    Returns:
        ``(ahead, micro_batches, order)``: the kept outputs, the `MicroBatches` (to restore per-sample
        outputs to the mini-batch's order) and ``order`` (bs,), the mini-batch's sample indices in
        ``data`` (a permutation when the update shuffles).
    """
    if not is_single_pass(spec, len(data)):
        raise ValueError(
            "forward_ahead needs a single-pass update (ppo_epochs=1, one mini-batch per step, no activation "
            f"offload); this one has {spec.epochs} epoch(s) and mini-batches of {spec.samples_per_mini_batch} "
            f"of {len(data)} samples"
        )
    n = len(data)
    indexed = DataProto(batch=data.batch.select(*[k for k in FORWARD_KEYS if k in data.batch.keys()]))
    indexed.batch[_INDEX] = torch.arange(n)
    (_, mini), *_ = list(iter_mini_batches(indexed, n, 1, spec.shuffle, spec.seed + step))
    order = mini.batch.pop(_INDEX)
    micro_batches = split_micro_batches(mini.batch, spec.micro, sync_group, share_prompts)
    keys = [(mb["input_ids"], mb["attention_mask"]) for mb in micro_batches.batches]
    outputs = [forward(mb) for mb in micro_batches.batches]
    return ForwardAhead(keys, outputs), micro_batches, order
