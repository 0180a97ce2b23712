"""Supervised fine-tuning on one data-parallel rank: the negative log-likelihood of the response tokens.

The batch has PPO's post-rollout layout (`rlflow.data.sft_dataset.collate_sft`), so the loss runs through
the PPO actor's forward (`rlflow.models.forward.forward_micro_batch`: remove-padding, Ulysses SP, any
micro-batching) and the same global normalisation: the loss of a step is

    L = - sum over every response token t of the batch (all ranks)  log p(t) / (number of those tokens)

whatever the micro-batch size, dynamic batching or data-parallel size (`rlflow.algos.losses.agg_loss`
with the global token count). Prompt tokens and pads are never in the loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rlflow.algos.losses import agg_loss
from rlflow.engine.batching import MicroBatchSpec
from rlflow.engine.ppo_loop import (
    MetricAccumulator,
    group_size,
    loss_normalisers,
    optimizer_step,
    split_micro_batches,
)
from rlflow.models.forward import forward_micro_batch

__all__ = ["SFT_KEYS", "SFTEngine"]

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


class SFTEngine:
    """One rank's SFT steps and validation passes.

    Args:
        module: the causal LM (plain or FSDP-wrapped).
        optimizer / lr_scheduler: stepped once per `train_step` (the scheduler after the optimizer).
        micro: how a rank's share of a batch is cut into micro-batches.
        grad_clip: maximum total gradient norm; <= 0 = none.
        use_remove_padding: packed forwards.
        dp_group / sp_group / sync_group: data-parallel group (loss normaliser), Ulysses group, and the
            ranks that run the same number of micro-batches (the FSDP world).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        *,
        micro: MicroBatchSpec,
        grad_clip: float,
        use_remove_padding: bool,
        dp_group: Any = None,
        sp_group: Any = None,
        sync_group: Any = None,
    ) -> None:
        self.module, self.optimizer, self.lr_scheduler = module, optimizer, lr_scheduler
        self.micro, self.grad_clip = micro, float(grad_clip)
        self.use_remove_padding = bool(use_remove_padding)
        self.dp_group, self.sp_group, self.sync_group = dp_group, sp_group, sync_group

    def _log_probs(self, mb: Any) -> torch.Tensor:
        out = forward_micro_batch(
            self.module,
            mb,
            output="log_probs",
            use_remove_padding=self.use_remove_padding,
            sp_group=self.sp_group,
        )
        return out["log_probs"]

    def train_step(self, batch: Any) -> dict[str, float]:
        """Forward + backward of every micro-batch of this rank's share, then one optimizer step.

        Args:
            batch: TensorDict with `SFT_KEYS`, this rank's samples of the step.

        Returns:
            ``train/loss`` (the step's token-mean NLL over all ranks), ``train/grad_norm`` (before
            clipping), ``train/lr`` (the rate this step used), ``train/tokens`` (response tokens of the
            step, all ranks), ``train/skipped`` (1 when the gradient was not finite and no step was taken).
        """
        self.module.train()
        norm = loss_normalisers(batch, self.dp_group)
        acc = MetricAccumulator()
        for mb in split_micro_batches(batch.select(*SFT_KEYS), self.micro, self.sync_group).batches:
            loss = agg_loss(-self._log_probs(mb), mb["response_mask"], "token-mean", **norm)
            loss.backward()
            acc.add_rank_share("train/loss", loss)
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm, stepped = optimizer_step(self.module, self.optimizer, self.grad_clip)
        acc.end_mini_batch(self.dp_group, extra={"train/grad_norm": grad_norm})
        self.lr_scheduler.step()
        metrics = acc.means()
        metrics.update(
            {"train/lr": lr, "train/tokens": norm["global_token_num"], "train/skipped": float(not stepped)}
        )
        return metrics

    @torch.no_grad()
    def nll_sums(self, batch: Any) -> tuple[float, float]:
        """``(sum of -log p over the response tokens, their number)`` of ``batch``, summed over the
        data-parallel ranks (validation: divide the first by the second, over all batches)."""
        self.module.eval()
        total = torch.zeros(2, dtype=torch.float64)
        for mb in split_micro_batches(batch.select(*SFT_KEYS), self.micro, self.sync_group).batches:
            mask = mb["response_mask"]
            lp = self._log_probs(mb)
            total += torch.stack([-(lp * mask).sum().double().cpu(), mask.sum().double().cpu()])
        if group_size(self.dp_group) > 1:
            dist.all_reduce(total, group=self.dp_group)
        return float(total[0]), float(total[1])
