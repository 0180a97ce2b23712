"""``DataParallelPPOCritic``: values of response tokens, and the clipped value-loss update.

The critic is a token-level value model (``(bs, seqlen) -> (bs, seqlen)`` scalar per position, e.g.
``AutoModelForTokenClassification`` with one label). Its value for response token ``t`` is read at the
position that *predicts* it, the same alignment as the actor's log-probs.

Everything about batching (remove-padding, Ulysses, dynamic micro-batches, global loss normalisation)
lives in :mod:`rlflow.models.forward` and :mod:`rlflow.engine.ppo_loop`; this file is the PPO logic.
verl research code subclasses this class and overrides ``_forward_micro_batch(micro_batch) -> values``
and ``_optimizer_step() -> grad_norm``; every pass goes through them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlflow.algos.losses import compute_value_loss
from rlflow.engine.batching import MicroBatchSpec, UpdateSpec
from rlflow.engine.forward_ahead import ForwardAhead, is_single_pass, run_ahead
from rlflow.engine.ppo_loop import (
    FORWARD_KEYS,
    MetricAccumulator,
    loss_normalisers,
    optimizer_step,
    response_mask_of,
    run_update,
    select_update_batch,
    split_micro_batches,
)
from rlflow.models.forward import forward_micro_batch, reads_shared_prompts
from rlflow.protocol import DataProto
from rlflow.utils.torch_functional import masked_mean

if TYPE_CHECKING:
    from rlflow.config.schema import CriticConfig

__all__ = ["DataParallelPPOCritic"]

_WHOLE_PASS = MicroBatchSpec()  # one micro-batch per pass


class DataParallelPPOCritic:
    """PPO critic on one data-parallel rank (the module may be FSDP1/FSDP2-sharded).

    Args:
        config: the ``critic`` section (``cliprange_value``, ``loss_agg_mode``).
        critic_module: the value model.
        critic_optimizer: its optimizer (``None`` for a critic used only for ``compute_values``).
        update: per-rank sizes of `update_critic` (`rlflow.engine.batching.critic_update_spec`).
        forward: micro-batching of `compute_values` (``forward_*`` keys of the section).
        use_remove_padding: packed (remove-padding) forwards.
        share_prompts: with remove-padding, the samples of a prompt in a micro-batch are packed with one
            copy of the prompt (`rlflow.models.padding.unpad_shared_prompts`; ``model.use_shared_prompts``).
        dp_group: process group of the data-parallel ranks (``None``: all ranks hold different data).
        sp_group: Ulysses group (``None`` or size 1: no sequence parallelism).
        sync_group: every rank that must run the same number of forward passes (the FSDP world).
    """

    def __init__(
        self,
        config: CriticConfig,
        critic_module: torch.nn.Module,
        critic_optimizer: torch.optim.Optimizer | None = None,
        *,
        update: UpdateSpec | None = None,
        forward: MicroBatchSpec = _WHOLE_PASS,
        use_remove_padding: bool = False,
        share_prompts: bool = False,
        dp_group: Any = None,
        sp_group: Any = None,
        sync_group: Any = None,
    ) -> None:
        self.config = config
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.update = update
        self.forward = forward
        self.use_remove_padding = bool(use_remove_padding)
        self.share_prompts = (
            bool(share_prompts) and self.use_remove_padding and reads_shared_prompts(critic_module)
        )
        self.dp_group, self.sp_group, self.sync_group = dp_group, sp_group, sync_group
        self._ahead: ForwardAhead | None = None  # `values_ahead`'s forwards, for the next update
        self._taking: ForwardAhead | None = None  # those the running update takes
        self.skipped_steps = 0

    # ---- hooks (verl's names) --------------------------------------------------------------------------

    def _forward_micro_batch(self, micro_batch: Any) -> torch.Tensor:
        """Values of one micro-batch: ``(mbs, response_len)`` (differentiable in train mode).

        Args:
            micro_batch: ``input_ids``, ``attention_mask``, ``position_ids``: (mbs, seqlen); ``responses``:
                (mbs, response_len).
        """
        out = forward_micro_batch(
            self.critic_module,
            micro_batch,
            output="values",
            use_remove_padding=self.use_remove_padding,
            sp_group=self.sp_group,
            share_prompts=self.share_prompts,
        )
        return out["values"]

    def _optimizer_step(self) -> float:
        """`optimizer_step` with this role's ``grad_clip``; returns the gradient norm before clipping."""
        return optimizer_step(
            self.critic_module, self.critic_optimizer, self.update.grad_clip if self.update else None
        )[0]

    # ---- passes ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values of the response tokens, zero on masked positions.

        Args:
            data: ``input_ids``, ``attention_mask``, ``position_ids``: (bs, seqlen); ``responses``:
                (bs, response_len); optional ``response_mask``.

        Returns:
            ``(bs, response_len)`` values in input order.
        """
        self.critic_module.eval()
        mask = response_mask_of(data)
        batch = data.batch.select(*[k for k in FORWARD_KEYS if k in data.batch.keys()])
        micro = split_micro_batches(batch, self.forward, self.sync_group, self.share_prompts)
        values = micro.restore([self._forward_micro_batch(mb) for mb in micro.batches])
        return values * mask.to(values.dtype)

    def values_ahead(self, data: DataProto, step: int) -> torch.Tensor:
        """`compute_values` through the coming single-pass update's own forwards (its micro-batches, train
        mode, autograd), kept for `update_critic`, which then runs only the loss and the backward
        (`rlflow.engine.forward_ahead`): the values are the update's first predictions, exactly.

        Args:
            data: as `compute_values`; the samples the update will receive, in its order.
            step: the training step of the update (seeds its mini-batch permutation).

        Returns:
            ``(bs, response_len)`` values in input order, zero on masked positions (no gradient).

        Raises:
            ValueError: the update is not a single pass (`is_single_pass`).
        """
        if self.update is None or not is_single_pass(self.update, len(data)):
            raise ValueError(
                "values_ahead: the critic's update is not a single pass (ppo_epochs=1, one mini-batch, no "
                "activation offload)"
            )
        self.critic_module.train()
        mask = response_mask_of(data)
        self._ahead, micro, order = run_ahead(
            data,
            self.update,
            step,
            self._forward_micro_batch,
            self.sync_group,
            self.share_prompts,
        )
        shuffled = micro.restore([v.detach() for v in self._ahead.outputs])
        values = torch.empty_like(shuffled)
        values[order] = shuffled
        return values * mask.to(values.dtype)

    def update_critic(self, data: DataProto, step: int = 0) -> dict[str, float]:
        """PPO epochs × mini-batches × micro-batches of the clipped value loss.

        Args:
            data: the forward keys plus ``values`` (rollout-time critic values) and ``returns``:
                (bs, response_len).
            step: the training step (seeds the mini-batch shuffle).

        Returns:
            Metrics averaged over mini-batches: ``critic/vf_loss``, ``critic/vf_clipfrac``,
            ``critic/vpred_mean``, ``critic/grad_norm``, and ``critic/skipped_steps`` (non-finite
            gradient norms in this update; the weights were left unchanged for those).
        """
        if self.critic_optimizer is None or self.update is None:
            raise RuntimeError("update_critic needs a critic optimizer and an UpdateSpec")
        self.critic_module.train()
        data = select_update_batch(data, [*FORWARD_KEYS, "values", "returns"])
        self._taking, self._ahead = self._ahead, None  # the forwards of `values_ahead`, taken once
        try:
            metrics, skipped = run_update(
                data,
                self.update,
                step,
                self._accumulate_mini_batch,
                self._optimizer_step,
                self.dp_group,
                "critic",
            )
        finally:
            self._taking = None
        self.skipped_steps += skipped
        return metrics

    def _accumulate_mini_batch(self, mini: DataProto, acc: MetricAccumulator) -> None:
        """Forward and backward every micro-batch of ``mini``; gradients accumulate in the module."""
        norm = loss_normalisers(mini.batch, self.dp_group)
        micro = split_micro_batches(mini.batch, self.update.micro, self.sync_group, self.share_prompts)
        for i, mb in enumerate(micro.batches):
            mask = mb["response_mask"]
            vpreds = self._taking.take(i, mb) if self._taking is not None else None
            if vpreds is None:
                vpreds = self._forward_micro_batch(mb)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds=vpreds,
                returns=mb["returns"],
                values=mb["values"],
                response_mask=mask,
                cliprange_value=self.config.cliprange_value,
                loss_agg_mode=self.config.loss_agg_mode,
                **norm,
            )
            vf_loss.backward()
            n_tok = float(mask.sum())
            acc.add_rank_share("critic/vf_loss", vf_loss)
            acc.add("critic/vf_clipfrac", vf_clipfrac, weight=n_tok)
            acc.add("critic/vpred_mean", masked_mean(vpreds.detach(), mask), weight=n_tok)
