"""``DataParallelPPOCritic``: values of response tokens, and the clipped value-loss update.

The critic is a token-level value model (``(bs, seqlen) -> (bs, seqlen)`` scalar per position, e.g.
``AutoModelForTokenClassification`` with one label). Its value for response token ``t`` is read at the
position that *predicts* it, the same alignment as the actor's log-probs.

Everything about batching (remove-padding, Ulysses, dynamic micro-batches, global loss normalisation)
lives in :mod:`rlflow.models.forward` and :mod:`rlflow.engine.ppo_loop`; this file is the PPO logic.
"""

from __future__ import annotations

from typing import Any

import torch

from rlflow.algos.common import config_get
from rlflow.engine.ppo_loop import (
    FORWARD_KEYS,
    MetricAccumulator,
    loss_normalisers,
    response_mask_of,
    run_update,
    select_update_batch,
    split_micro_batches,
)
from rlflow.models.forward import forward_micro_batch
from rlflow.protocol import DataProto
from rlflow.trainer.ppo.core_algos import compute_value_loss
from rlflow.utils.torch_functional import masked_mean

__all__ = ["DataParallelPPOCritic"]


class DataParallelPPOCritic:
    """PPO critic on one data-parallel rank (the module may be FSDP1/FSDP2-sharded).

    Args:
        config: the critic config (``critic.*``) with per-rank sizes: ``ppo_mini_batch_size`` and
            ``ppo_micro_batch_size_per_gpu`` / ``forward_micro_batch_size_per_gpu`` in samples on this rank,
            ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu`` / ``forward_max_token_len_per_gpu``,
            ``ppo_epochs``, ``shuffle``, ``cliprange_value``, ``loss_agg_mode``, ``grad_clip``,
            ``ulysses_sequence_parallel_size``, ``model.use_remove_padding``, ``seed``.
        critic_module: the value model.
        critic_optimizer: its optimizer (``None`` for a critic used only for ``compute_values``).
        dp_group: process group of the data-parallel ranks (``None``: all ranks hold different data).
        sp_group: Ulysses group (``None`` or size 1: no sequence parallelism).
        sync_group: every rank that must run the same number of forward passes (the FSDP world).
    """

    def __init__(
        self,
        config: Any,
        critic_module: torch.nn.Module,
        critic_optimizer: torch.optim.Optimizer | None = None,
        *,
        dp_group: Any = None,
        sp_group: Any = None,
        sync_group: Any = None,
    ) -> None:
        self.config = config
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.dp_group, self.sp_group, self.sync_group = dp_group, sp_group, sync_group
        self.use_remove_padding = bool(
            config_get(config_get(config, "model", {}) or {}, "use_remove_padding", False)
        )
        self.sp_size = int(config_get(config, "ulysses_sequence_parallel_size", 1) or 1)
        self.use_dynamic_bsz = bool(config_get(config, "use_dynamic_bsz", False))
        self.skipped_steps = 0

    # ---- forward ---------------------------------------------------------------------------------------

    def _forward(self, micro: Any) -> torch.Tensor:
        out = forward_micro_batch(
            self.critic_module,
            micro,
            output="values",
            use_remove_padding=self.use_remove_padding,
            sp_group=self.sp_group,
        )
        return out["values"]

    def _micro_batches(self, batch: Any, micro_key: str, token_key: str) -> Any:
        max_len = config_get(self.config, token_key)
        return split_micro_batches(
            batch,
            use_dynamic_bsz=self.use_dynamic_bsz,
            micro_batch_size=config_get(self.config, micro_key),
            max_token_len=None if max_len is None else int(max_len) * self.sp_size,
            sync_group=self.sync_group,
        )

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
        micro = self._micro_batches(
            batch, "forward_micro_batch_size_per_gpu", "forward_max_token_len_per_gpu"
        )
        values = micro.restore([self._forward(mb) for mb in micro.batches])
        return values * mask.to(values.dtype)

    # ---- update ----------------------------------------------------------------------------------------

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """PPO epochs × mini-batches × micro-batches of the clipped value loss.

        Args:
            data: the forward keys plus ``values`` (rollout-time critic values) and ``returns``:
                (bs, response_len). ``meta_info["global_steps"]`` seeds the mini-batch shuffle.

        Returns:
            Metrics averaged over mini-batches: ``critic/vf_loss``, ``critic/vf_clipfrac``,
            ``critic/vpred_mean``, ``critic/grad_norm``, and ``critic/skipped_steps`` (non-finite
            gradient norms in this update; the weights were left unchanged for those).
        """
        if self.critic_optimizer is None:
            raise RuntimeError("update_critic needs a critic optimizer")
        self.critic_module.train()
        data = select_update_batch(data, [*FORWARD_KEYS, "values", "returns"])
        metrics, skipped = run_update(
            data,
            self.config,
            self.critic_module,
            self.critic_optimizer,
            self._accumulate_mini_batch,
            self.dp_group,
            "critic",
        )
        self.skipped_steps += skipped
        return metrics

    def _accumulate_mini_batch(self, mini: DataProto, acc: MetricAccumulator) -> None:
        """Forward and backward every micro-batch of ``mini``; gradients accumulate in the module."""
        norm = loss_normalisers(mini.batch, self.dp_group)
        micro = self._micro_batches(mini.batch, "ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu")
        for mb in micro.batches:
            mask = mb["response_mask"]
            vpreds = self._forward(mb)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds=vpreds,
                returns=mb["returns"],
                values=mb["values"],
                response_mask=mask,
                cliprange_value=config_get(self.config, "cliprange_value"),
                loss_agg_mode=config_get(self.config, "loss_agg_mode", "token-mean"),
                **norm,
            )
            vf_loss.backward()
            n_tok = float(mask.sum())
            acc.add_rank_share("critic/vf_loss", vf_loss)
            acc.add("critic/vf_clipfrac", vf_clipfrac, weight=n_tok)
            acc.add("critic/vpred_mean", masked_mean(vpreds.detach(), mask), weight=n_tok)
