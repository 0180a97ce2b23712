"""``DataParallelPPOActor``: log-probs of response tokens and the policy-gradient update.

The reference policy is the same class with no optimizer (``compute_log_prob`` only). Batching
(remove-padding, Ulysses, dynamic micro-batches, global loss normalisation) is shared with the critic
through :mod:`rlflow.models.forward` and :mod:`rlflow.engine.ppo_loop`.
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
from rlflow.trainer.ppo.core_algos import agg_loss, compute_kl_loss, get_policy_loss_fn

__all__ = ["DataParallelPPOActor"]


class DataParallelPPOActor:
    """PPO actor (or reference policy) on one data-parallel rank.

    Args:
        config: the actor config (``actor_rollout_ref.actor.*``) with per-rank sizes (see
            :class:`~rlflow.engine.critic.DataParallelPPOCritic`), plus ``clip_ratio*``,
            ``policy_loss.loss_mode``, ``entropy_coeff``, ``use_kl_loss``, ``kl_loss_coef``,
            ``kl_loss_type``, and for ``compute_log_prob``: ``log_prob_micro_batch_size_per_gpu``,
            ``log_prob_use_dynamic_bsz``, ``log_prob_max_token_len_per_gpu``.
        actor_module: the causal LM.
        actor_optimizer: ``None`` for the reference policy.
        dp_group / sp_group / sync_group: as for the critic.
    """

    def __init__(
        self,
        config: Any,
        actor_module: torch.nn.Module,
        actor_optimizer: torch.optim.Optimizer | None = None,
        *,
        dp_group: Any = None,
        sp_group: Any = None,
        sync_group: Any = None,
    ) -> None:
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.dp_group, self.sp_group, self.sync_group = dp_group, sp_group, sync_group
        self.use_remove_padding = bool(config_get(config, "use_remove_padding", False))
        self.sp_size = int(config_get(config, "ulysses_sequence_parallel_size", 1) or 1)
        self.skipped_steps = 0

    def _forward(self, micro: Any, temperature: float, calculate_entropy: bool) -> dict[str, torch.Tensor]:
        return forward_micro_batch(
            self.actor_module,
            micro,
            output="log_probs",
            use_remove_padding=self.use_remove_padding,
            sp_group=self.sp_group,
            temperature=temperature,
            calculate_entropy=calculate_entropy,
        )

    def _micro(self, batch: Any, dynamic: bool, micro_bs: Any, max_len: Any) -> Any:
        return split_micro_batches(
            batch,
            use_dynamic_bsz=bool(dynamic),
            micro_batch_size=micro_bs,
            max_token_len=None if max_len is None else int(max_len) * self.sp_size,
            sync_group=self.sync_group,
        )

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the response tokens under ``logits / temperature``.

        Args:
            data: ``input_ids``, ``attention_mask``, ``position_ids``: (bs, seqlen); ``responses``:
                (bs, response_len); ``meta_info["temperature"]`` (default 1.0), and optionally
                ``micro_batch_size``, ``use_dynamic_bsz``, ``max_token_len`` overriding the config.
            calculate_entropy: also return the per-token entropy.

        Returns:
            ``(log_probs, entropy)``, each ``(bs, response_len)`` in input order, zero past the response
            mask (entropy None unless asked for).
        """
        self.actor_module.eval()
        meta = data.meta_info
        temperature = float(meta.get("temperature", 1.0))
        batch = data.batch.select(*[k for k in FORWARD_KEYS if k in data.batch.keys()])
        micro = self._micro(
            batch,
            meta.get("use_dynamic_bsz", config_get(self.config, "log_prob_use_dynamic_bsz", False)),
            meta.get("micro_batch_size", config_get(self.config, "log_prob_micro_batch_size_per_gpu")),
            meta.get("max_token_len", config_get(self.config, "log_prob_max_token_len_per_gpu")),
        )
        outs = [self._forward(mb, temperature, calculate_entropy) for mb in micro.batches]
        mask = response_mask_of(data)
        log_probs = micro.restore([o["log_probs"] for o in outs]) * mask
        entropy = micro.restore([o["entropy"] for o in outs]) * mask if calculate_entropy else None
        return log_probs, entropy

    def update_policy(self, data: DataProto) -> dict[str, float]:
        """PPO epochs × mini-batches × micro-batches of the policy loss (plus entropy and KL terms).

        Args:
            data: forward keys plus ``old_log_probs``, ``advantages`` (bs, response_len), and
                ``ref_log_prob`` when ``use_kl_loss``. ``meta_info``: ``temperature``, ``global_steps``.

        Returns:
            Metrics averaged over mini-batches: ``actor/pg_loss``, ``actor/pg_clipfrac``,
            ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, ``actor/entropy_loss``, ``actor/kl_loss`` (when
            enabled), ``actor/grad_norm``, ``actor/skipped_steps``.
        """
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an actor optimizer (the reference policy has none)")
        self.actor_module.train()
        keys = [*FORWARD_KEYS, "old_log_probs", "advantages", "rollout_is_weights"]
        if config_get(self.config, "use_kl_loss", False):
            keys.append("ref_log_prob")
        data = select_update_batch(data, keys)
        temperature = float(data.meta_info.get("temperature", 1.0))
        metrics, skipped = run_update(
            data,
            self.config,
            self.actor_module,
            self.actor_optimizer,
            lambda mini, acc: self._accumulate_mini_batch(mini, temperature, acc),
            self.dp_group,
            "actor",
        )
        self.skipped_steps += skipped
        return metrics

    def _accumulate_mini_batch(self, mini: DataProto, temperature: float, acc: MetricAccumulator) -> None:
        cfg = self.config
        norm = loss_normalisers(mini.batch, self.dp_group)
        loss_agg_mode = config_get(cfg, "loss_agg_mode", "token-mean")
        entropy_coeff = float(config_get(cfg, "entropy_coeff", 0.0) or 0.0)
        use_kl_loss = bool(config_get(cfg, "use_kl_loss", False))
        policy_loss_fn = get_policy_loss_fn(
            config_get(config_get(cfg, "policy_loss", {}) or {}, "loss_mode", "vanilla")
        )
        micro = self._micro(
            mini.batch,
            config_get(cfg, "use_dynamic_bsz", False),
            config_get(cfg, "ppo_micro_batch_size_per_gpu"),
            config_get(cfg, "ppo_max_token_len_per_gpu"),
        )
        for mb in micro.batches:
            mask = mb["response_mask"]
            out = self._forward(mb, temperature, calculate_entropy=entropy_coeff != 0)
            pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = policy_loss_fn(
                mb["old_log_probs"],
                out["log_probs"],
                mb["advantages"],
                mask,
                loss_agg_mode,
                cfg,
                mb["rollout_is_weights"] if "rollout_is_weights" in mb.keys() else None,
                **norm,
            )
            loss = pg_loss
            if entropy_coeff != 0:
                entropy = agg_loss(out["entropy"], mask, loss_agg_mode, **norm)
                loss = loss - entropy_coeff * entropy
                acc.add_rank_share("actor/entropy_loss", entropy)
            if use_kl_loss:
                kl = compute_kl_loss(
                    out["log_probs"],
                    mb["ref_log_prob"],
                    mask,
                    config_get(cfg, "kl_loss_type", "low_var_kl"),
                    loss_agg_mode,
                    **norm,
                )
                loss = loss + float(config_get(cfg, "kl_loss_coef", 0.0)) * kl
                acc.add_rank_share("actor/kl_loss", kl)
            loss.backward()
            n_tok = float(mask.sum())
            acc.add_rank_share("actor/pg_loss", pg_loss)
            acc.add("actor/pg_clipfrac", pg_clipfrac, weight=n_tok)
            acc.add("actor/ppo_kl", ppo_kl, weight=n_tok)
            acc.add("actor/pg_clipfrac_lower", pg_clipfrac_lower, weight=n_tok)
