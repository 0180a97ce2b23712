"""``DataParallelPPOActor``: log-probs of response tokens and the policy-gradient update.

The reference policy is the same class with no optimizer (``compute_log_prob`` only). Batching
(remove-padding, Ulysses, dynamic micro-batches, global loss normalisation) is shared with the critic
through :mod:`rlflow.models.forward` and :mod:`rlflow.engine.ppo_loop`.

verl research code subclasses this class and overrides two hooks, which every pass goes through:
``_forward_micro_batch(micro_batch, temperature, calculate_entropy) -> (entropy, log_probs)`` and
``_optimizer_step() -> grad_norm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rlflow.algos.cov_losses import COV_LOSS_MODES, select_cov_tokens, token_keys
from rlflow.algos.kl import compute_kl_loss
from rlflow.algos.losses import agg_loss, compute_rollout_is_weights, get_policy_loss_fn
from rlflow.algos.policy_loss_call import PolicyLossCall
from rlflow.algos.reinforce_loss import compute_policy_loss_reinforce
from rlflow.algos.rollout_correction import correction_settings
from rlflow.engine.batching import MicroBatchSpec, UpdateSpec
from rlflow.engine.forward_ahead import ForwardAhead, is_single_pass, run_ahead
from rlflow.engine.ppo_loop import (
    FORWARD_KEYS,
    MetricAccumulator,
    global_loss_counts,
    group_size,
    loss_normalisers,
    optimizer_step,
    response_mask_of,
    run_update,
    select_update_batch,
    split_micro_batches,
)
from rlflow.models.forward import forward_micro_batch, reads_shared_prompts
from rlflow.models.mtp import depth_masks, predictor_of
from rlflow.models.router_replay import ROUTED_EXPERTS, RouterReplay
from rlflow.protocol import DataProto
from rlflow.utils.torch_functional import masked_mean

if TYPE_CHECKING:
    from rlflow.config.schema import ActorConfig, RolloutCorrectionConfig

__all__ = ["DataParallelPPOActor"]

_WHOLE_PASS = MicroBatchSpec()  # one micro-batch per pass


class DataParallelPPOActor:
    """PPO actor (or reference policy) on one data-parallel rank.

    Args:
        config: the actor section (``actor_rollout_ref.actor``): loss settings (``clip_ratio*``,
            ``policy_loss.loss_mode``, ``loss_agg_mode``, ``entropy_coeff``, ``use_kl_loss``,
            ``kl_loss_coef``, ``kl_loss_type``).
        actor_module: the causal LM (plain or FSDP-wrapped).
        actor_optimizer: ``None`` for the reference policy.
        update: per-rank sizes of `update_policy` (`rlflow.engine.batching.actor_update_spec`); None for
            the reference policy.
        log_prob: micro-batching of `compute_log_prob`.
        temperature: log-probs are ``log_softmax(logits / temperature)`` (the rollout's log-prob
            temperature, `rlflow.rollout.base.logprob_temperature`).
        use_remove_padding: packed (remove-padding) forwards.
        share_prompts: with remove-padding, the samples of a prompt in a micro-batch are packed with one
            copy of the prompt (`rlflow.models.padding.unpad_shared_prompts`; ``model.use_shared_prompts``).
        dp_group / sp_group / sync_group: data-parallel group (loss normalisers), Ulysses group, and the
            ranks that run the same number of micro-batches (the FSDP world).
        reinforce: ``algorithm.rollout_correction`` when its ``use_policy_gradient`` is on: the policy
            loss is then `rlflow.algos.reinforce_loss.compute_policy_loss_reinforce` against the batch's
            ``rollout_log_probs``, with these weights, rejection and veto, instead of
            ``policy_loss.loss_mode``.
        torch_compile: log-probs and entropy from the logits through the ``torch.compile``d block
            kernels (``use_torch_compile`` of the role, resolved: `rlflow.utils.logit_blocks`).
        router_top_k: a mixture-of-experts model's experts per token, when ``moe_aux_loss_coef`` or
            ``moe_z_loss_coef`` is set: the update adds those router losses (`rlflow.algos.moe`).
        router_replay: a mixture-of-experts actor's routing replay (``actor.router_replay.mode``,
            `rlflow.models.router_replay`): ``"R2"``: `compute_log_prob` records the routing (read it from
            ``last_routing``) and the update's forwards replay the batch's ``routed_experts``; ``"R3"``: both
            replay the rollout's (``last_replay_mismatch``: the share of `compute_log_prob`'s replayed
            choices its live routers would have made differently). ``"disabled"``: live routing.
    """

    def __init__(
        self,
        config: ActorConfig,
        actor_module: torch.nn.Module,
        actor_optimizer: torch.optim.Optimizer | None = None,
        *,
        update: UpdateSpec | None = None,
        log_prob: MicroBatchSpec = _WHOLE_PASS,
        temperature: float = 1.0,
        use_remove_padding: bool = False,
        share_prompts: bool = False,
        dp_group: Any = None,
        sp_group: Any = None,
        sync_group: Any = None,
        reinforce: RolloutCorrectionConfig | None = None,
        torch_compile: bool = False,
        router_top_k: int | None = None,
        router_replay: str = "disabled",
    ) -> None:
        if not temperature > 0:
            raise ValueError(f"DataParallelPPOActor: temperature must be > 0, got {temperature}")
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.update = update
        self.log_prob = log_prob
        self.temperature = float(temperature)
        self.use_remove_padding = bool(use_remove_padding)
        # the MTP layers (rlflow.models.mtp): their loss when they train
        predictor = predictor_of(actor_module)
        self.mtp = predictor.spec if predictor is not None and predictor.spec.train else None
        self._mtp_out: tuple[Any, Any] = (None, None)  # of the last training forward
        # the forwards pack shared prompts only where the attention reads them and no router loss counts tokens
        self.share_prompts = (
            bool(share_prompts)
            and self.use_remove_padding
            and self.mtp is None
            and router_top_k is None
            and router_replay == "disabled"
            and reads_shared_prompts(actor_module)
        )
        self.dp_group, self.sp_group, self.sync_group = dp_group, sp_group, sync_group
        self.reinforce = reinforce
        self.torch_compile = bool(torch_compile)
        self.router_top_k = router_top_k
        self.router_replay = str(router_replay)
        self._replay = RouterReplay.of(actor_module) if self.router_replay != "disabled" else None
        self.last_routing: torch.Tensor | None = None  # R2: the routing compute_log_prob recorded
        self.last_replay_mismatch: float | None = None  # R3: compute_log_prob's replayed choices that differ
        self._router_losses: tuple[Any, Any] = (None, None)  # of the last training forward
        self._recorded_routing: torch.Tensor | None = None  # of the last forward, routing="record"
        self._mini_batch_seed = 0  # KL-Cov / Clip-Cov: seeds the draw of the current mini-batch
        self._ahead: ForwardAhead | None = None  # `forward_ahead`'s outputs, for the next update
        self._taking: ForwardAhead | None = None  # those the running update takes
        self.skipped_steps = 0

    # ---- hooks (verl's names) --------------------------------------------------------------------------

    def _forward_micro_batch(
        self, micro_batch: Any, temperature: float, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One micro-batch forward.

        Args:
            micro_batch: ``input_ids``, ``attention_mask``, ``position_ids``: (mbs, seqlen); ``responses``:
                (mbs, response_len).
            temperature: divides the logits.
            calculate_entropy: also return the per-token entropy.

        Returns:
            ``(entropy or None, log_probs)``, each ``(mbs, response_len)``.
        """
        out = forward_micro_batch(
            self.actor_module,
            micro_batch,
            output="log_probs",
            use_remove_padding=self.use_remove_padding,
            sp_group=self.sp_group,
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            compiled=self.torch_compile,
            router_top_k=self.router_top_k if self.actor_module.training else None,  # the update's forwards
            share_prompts=self.share_prompts,
            routing=self._routing_action(micro_batch),
            mtp=self.mtp is not None and self.actor_module.training,
        )
        self._router_losses = (out.get("moe_aux_loss"), out.get("moe_z_loss"))
        self._mtp_out = (out.get("mtp_loss_sums"), out.get("mtp_counts"))
        self._recorded_routing = out.get(ROUTED_EXPERTS)
        return out.get("entropy"), out["log_probs"]

    def _routing_action(self, micro_batch: Any) -> str | None:
        """What the forward does with the routers: the update's forwards replay the batch's routing (R2
        without an old-log-prob pass has none: its forwards are the old policy's); `compute_log_prob`
        records it (R2) or replays the rollout's (R3)."""
        if self.router_replay == "disabled":
            return None
        if not self.actor_module.training and self.router_replay == "R2":
            return "record"
        if ROUTED_EXPERTS in micro_batch.keys():
            return "replay"
        if self.router_replay == "R3":
            raise ValueError(
                f"actor.router_replay.mode=R3 needs the rollout's {ROUTED_EXPERTS!r} in the batch "
                "(actor_rollout_ref.rollout.enable_rollout_routing_replay=true)"
            )
        return None

    def _policy_loss(self) -> PolicyLossCall:
        """The configured ``policy_loss.loss_mode``, callable in either of verl's conventions (built once)."""
        name = str(self.config.policy_loss.loss_mode)
        if getattr(self, "_policy_loss_call", None) is None or self._policy_loss_call.name != name:
            self._policy_loss_call = PolicyLossCall(get_policy_loss_fn(name), name)
        return self._policy_loss_call

    def _optimizer_step(self) -> float:
        """`optimizer_step` with this role's ``grad_clip``; returns the gradient norm before clipping."""
        return optimizer_step(
            self.actor_module, self.actor_optimizer, self.update.grad_clip if self.update else None
        )[0]

    # ---- passes ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the response tokens under ``logits / temperature``.

        Args:
            data: ``input_ids``, ``attention_mask``, ``position_ids``: (bs, seqlen); ``responses``:
                (bs, response_len).
            calculate_entropy: also return the per-token entropy.

        Returns:
            ``(log_probs, entropy)``, each ``(bs, response_len)`` in input order, zero past the response
            mask (entropy None unless asked for).
        """
        self.actor_module.eval()
        keys = (*FORWARD_KEYS, ROUTED_EXPERTS) if self.router_replay == "R3" else FORWARD_KEYS
        batch = data.batch.select(*[k for k in keys if k in data.batch.keys()])
        micro = split_micro_batches(batch, self.log_prob, self.sync_group, self.share_prompts)
        outs, routing = [], []
        try:
            for mb in micro.batches:
                outs.append(self._forward_micro_batch(mb, self.temperature, calculate_entropy))
                routing.append(self._recorded_routing)
        finally:
            counts = self._stop_replay()
        self.last_routing = micro.restore(routing) if self.router_replay == "R2" else None
        # R3: how often the rollout's experts differ from the ones this forward's routers would pick
        self.last_replay_mismatch = counts[0] / counts[1] if counts and counts[1] else None
        mask = response_mask_of(data)
        log_probs = micro.restore([lp for _, lp in outs]) * mask
        entropy = micro.restore([ent for ent, _ in outs]) * mask if calculate_entropy else None
        return log_probs, entropy

    def forward_ahead_supported(self, samples: int) -> bool:
        """True when the coming update of ``samples`` samples can take its forwards from `forward_ahead`: a
        single pass (`rlflow.engine.forward_ahead.is_single_pass`) whose loss reads nothing but the
        forward's log-probs and entropies (no multi-token prediction or router losses, no routing replay,
        no KL-Cov / Clip-Cov token selection)."""
        return (
            is_single_pass(self.update, samples)
            and self.mtp is None
            and self.router_top_k is None
            and self.router_replay == "disabled"
            and (self.reinforce is not None or str(self.config.policy_loss.loss_mode) not in COV_LOSS_MODES)
        )

    def forward_ahead(self, data: DataProto, step: int = 0) -> None:
        """The forwards of the coming update of ``data`` at ``step``, run now with autograd, before the
        advantages exist (`rlflow.engine.forward_ahead`); `update_policy` takes their outputs and runs only
        the loss and the backward.

        Args:
            data: the forward keys of the samples the update will receive (and ``old_log_probs`` when the
                update will have them: the entropy is then computed only for ``entropy_coeff``).
            step: the training step of the update.

        Raises:
            ValueError: the update cannot take them (`forward_ahead_supported`).
        """
        if not self.forward_ahead_supported(len(data)):
            raise ValueError(
                "forward_ahead: the actor's update is not a single pass whose loss reads only the forward's "
                "log-probs (ppo_epochs=1, one mini-batch, no activation offload, MTP, router losses, routing "
                "replay or KL-Cov / Clip-Cov)"
            )
        self.actor_module.train()
        entropy = float(self.config.entropy_coeff) != 0 or "old_log_probs" not in data.batch.keys()
        self._ahead, _, _ = run_ahead(
            data,
            self.update,
            step,
            lambda mb: self._forward_micro_batch(mb, self.temperature, entropy),
            self.sync_group,
            self.share_prompts,
        )

    def update_policy(self, data: DataProto, step: int = 0) -> dict[str, float]:
        """PPO epochs × mini-batches × micro-batches of the policy loss (plus entropy and KL terms).

        Args:
            data: forward keys plus ``old_log_probs``, ``advantages`` (bs, response_len),
                ``ref_log_prob`` when ``use_kl_loss``, and from ``algorithm.rollout_correction``
                optionally ``rollout_is_weights`` (multiply the per-token policy loss) and
                ``rollout_rs_mask`` (0 = the token leaves the loss and its token counts).
                ``old_log_probs`` may be left out when the update is on-policy (one epoch, one
                mini-batch: `rlflow.config.update_is_on_policy`): each micro-batch's own detached
                log-probs are then the old policy's, exactly.
            step: the training step (seeds the mini-batch shuffle and Clip-Cov's draw).

        With ``policy_loss.loss_mode`` ``kl_cov`` / ``clip_cov`` each mini-batch first runs one forward pass
        without gradient over its micro-batches, and the tokens those losses act on are chosen over the
        whole mini-batch on every data-parallel rank (`rlflow.algos.cov_losses`).

        Returns:
            Metrics averaged over mini-batches: ``actor/pg_loss``, ``actor/pg_clipfrac``,
            ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, ``actor/entropy_loss``, ``actor/kl_loss`` (when
            enabled), ``actor/grad_norm``, ``actor/skipped_steps``; without ``old_log_probs`` also
            ``actor/entropy`` (what ``compute_log_prob`` reports otherwise). With ``reinforce`` the policy
            loss's metrics are ``actor/ppo_kl`` and ``rollout_corr/*`` instead of the clip fractions.

        Raises:
            ValueError: ``old_log_probs`` is missing and the update is not on-policy.
        """
        if self.actor_optimizer is None or self.update is None:
            raise RuntimeError(
                "update_policy needs an actor optimizer and an UpdateSpec (the reference has none)"
            )
        if "old_log_probs" not in data.batch.keys() and not (
            self.update.epochs == 1 and self.update.samples_per_mini_batch >= len(data)
        ):
            raise ValueError(
                f"update_policy without old_log_probs needs an on-policy update (ppo_epochs=1 and one "
                f"mini-batch); this one has ppo_epochs={self.update.epochs} and mini-batches of "
                f"{self.update.samples_per_mini_batch} of {len(data)} samples: run compute_log_prob first"
            )
        self.actor_module.train()
        keys = [*FORWARD_KEYS, "old_log_probs", "advantages"]
        if self.config.use_kl_loss:
            keys.append("ref_log_prob")
        if self.config.tis_imp_ratio_cap > 0:
            if "rollout_log_probs" not in data.batch.keys():
                raise ValueError(
                    "actor.tis_imp_ratio_cap > 0 needs rollout_log_probs (rollout.calculate_log_probs)"
                )
            keys.append("rollout_log_probs")
        if self.reinforce is not None:
            if "rollout_log_probs" not in data.batch.keys():
                raise ValueError(
                    "algorithm.rollout_correction.use_policy_gradient needs rollout_log_probs "
                    "(actor_rollout_ref.rollout.calculate_log_probs=true)"
                )
            keys.append("rollout_log_probs")
        keys += [k for k in ("rollout_is_weights", "rollout_rs_mask") if k in data.batch.keys()]
        if self.router_replay != "disabled":
            keys.append(ROUTED_EXPERTS)
        data = select_update_batch(data, keys)
        self._taking, self._ahead = self._ahead, None  # outputs of `forward_ahead`, taken once
        if "rollout_rs_mask" in data.batch.keys():  # algorithm.rollout_correction's rejection
            data.batch["response_mask"] = data.batch["response_mask"] * data.batch.pop("rollout_rs_mask")
        self._mini_batch_seed = (self.update.seed + step) * 1_000_003
        try:
            metrics, skipped = run_update(
                data,
                self.update,
                step,
                self._accumulate_mini_batch,
                self._optimizer_step,
                self.dp_group,
                "actor",
            )
        finally:
            mismatch = self._stop_replay()
            self._taking = None
        if mismatch is not None and mismatch[1]:
            metrics["actor/router_replay_mismatch"] = mismatch[0] / mismatch[1]
        self.skipped_steps += skipped
        if self.config.use_kl_loss:
            metrics["actor/kl_coef"] = float(self.config.kl_loss_coef)  # verl's name for the KL-loss weight
        return metrics

    def _stop_replay(self) -> tuple[int, int] | None:
        """Routers back to live routing; ``(mismatched, replayed)`` token-layer choices of the pass (None
        without routing replay)."""
        if self._replay is None:
            return None
        self._replay.stop()
        return self._replay.take_mismatch()

    def _accumulate_mini_batch(self, mini: DataProto, acc: MetricAccumulator) -> None:
        cfg = self.config
        norm = loss_normalisers(mini.batch, self.dp_group, cfg.loss_scale_factor)
        mode, entropy_coeff = cfg.loss_agg_mode, float(cfg.entropy_coeff)
        policy_loss = self._policy_loss()
        self._mini_batch_seed += 1
        if self.reinforce is None and policy_loss.name in COV_LOSS_MODES:
            mini.batch["cov_selected"] = self._select_cov_tokens(mini, policy_loss.name)
        micro = split_micro_batches(mini.batch, self.update.micro, self.sync_group, self.share_prompts)
        on_policy = "old_log_probs" not in mini.batch.keys()
        router_tokens = (
            global_loss_counts(mini.batch["attention_mask"], self.dp_group)[0]
            if self.router_top_k is not None
            else None
        )
        mtp_counts = self._mtp_token_counts(mini.batch) if self.mtp is not None else None
        for i, mb in enumerate(micro.batches):
            mask = mb["response_mask"]
            wants_entropy = entropy_coeff != 0 or on_policy
            taken = self._taking.take(i, mb) if self._taking is not None else None
            if taken is None or (wants_entropy and taken[0] is None):
                taken = self._forward_micro_batch(mb, self.temperature, wants_entropy)
            entropy, log_probs = taken
            old_log_probs = log_probs.detach() if on_policy else mb["old_log_probs"]
            if on_policy:
                acc.add("actor/entropy", masked_mean(entropy.detach(), mask), weight=float(mask.sum()))
            is_weights = mb["rollout_is_weights"] if "rollout_is_weights" in mb.keys() else None
            if cfg.tis_imp_ratio_cap > 0:
                is_weights = compute_rollout_is_weights(
                    old_log_probs, mb["rollout_log_probs"], mask, cfg.tis_imp_ratio_cap
                )
                acc.add("actor/tis_weight_mean", masked_mean(is_weights, mask), weight=float(mask.sum()))
            if self.reinforce is not None:
                pg_loss = self._reinforce_loss(mb, log_probs, mode, norm, acc)
                pg_metrics = {}
            else:
                extra = {"cov_selected": mb["cov_selected"]} if "cov_selected" in mb.keys() else None
                pg_loss, pg_metrics = policy_loss(
                    old_log_probs, log_probs, mb["advantages"], mask, mode, cfg, is_weights, norm, extra
                )
            loss = pg_loss
            if entropy_coeff != 0:
                entropy_term = agg_loss(entropy, mask, mode, **norm)
                loss = loss - entropy_coeff * entropy_term
                acc.add_rank_share("actor/entropy_loss", entropy_term)
            if cfg.use_kl_loss:
                kl = compute_kl_loss(log_probs, mb["ref_log_prob"], mask, cfg.kl_loss_type, mode, **norm)
                loss = loss + float(cfg.kl_loss_coef) * kl
                acc.add_rank_share("actor/kl_loss", kl)
            if router_tokens is not None:
                loss = loss + self._router_loss(mb, router_tokens, norm["dp_size"], acc)
            if mtp_counts is not None:
                loss = loss + self._mtp_loss(mtp_counts, norm["dp_size"], acc)
            loss.backward()
            n_tok = float(mask.sum())
            acc.add_rank_share("actor/pg_loss", pg_loss)
            for key, value in pg_metrics.items():
                acc.add(key, value, weight=n_tok)

    @torch.no_grad()
    def _select_cov_tokens(self, mini: DataProto, loss_mode: str) -> torch.Tensor:
        """KL-Cov / Clip-Cov's tokens of one mini-batch, chosen over all its micro-batches and data-parallel
        ranks (`rlflow.algos.cov_losses`): one forward pass over its micro-batches gives the current
        log-probs (the weights the loss will see: they change only at the mini-batch's optimizer step).

        Returns:
            ``(mini_bs, response_len)`` bool, in the mini-batch's order.
        """
        batch = mini.batch
        micro = split_micro_batches(
            batch.select(*[k for k in FORWARD_KEYS if k in batch.keys()]),
            self.update.micro,
            self.sync_group,
            self.share_prompts,
        )
        log_probs = micro.restore(
            [self._forward_micro_batch(mb, self.temperature)[1] for mb in micro.batches]
        )
        old_log_probs = batch["old_log_probs"] if "old_log_probs" in batch.keys() else log_probs
        keys = None
        if loss_mode == "clip_cov":
            keys = token_keys(
                batch["input_ids"], batch["attention_mask"], log_probs.shape[-1], self._mini_batch_seed
            )
        return select_cov_tokens(
            loss_mode,
            batch["advantages"],
            log_probs,
            old_log_probs,
            batch["response_mask"],
            self.config,
            keys=keys,
            group=self.dp_group,
        )

    def _router_loss(self, mb: Any, tokens: float, dp_size: int, acc: MetricAccumulator) -> torch.Tensor:
        """``moe_aux_loss_coef * aux + moe_z_loss_coef * z`` of the last forward, weighted by the micro-batch's
        share of the mini-batch's tokens (over all ranks), as Megatron scales its per-micro-batch router
        losses; the mini-batch's ``actor/moe_aux_loss`` / ``moe_z_loss`` are the token-weighted means."""
        aux, z = self._router_losses
        if aux is None or z is None:
            raise ValueError(
                "moe_aux_loss_coef / moe_z_loss_coef are set but _forward_micro_batch returned no router losses "
                "(an override must pass router_top_k=self.router_top_k to forward_micro_batch while training)"
            )
        share = dp_size * float(mb["attention_mask"].sum()) / max(tokens, 1.0)
        acc.add_rank_share("actor/moe_aux_loss", share * aux.detach())
        acc.add_rank_share("actor/moe_z_loss", share * z.detach())
        return share * (float(self.config.moe_aux_loss_coef) * aux + float(self.config.moe_z_loss_coef) * z)

    def _mtp_token_counts(self, batch: Any) -> torch.Tensor:
        """Each MTP depth's predicted response tokens in the mini-batch, summed over the DP ranks: (D,)."""
        response_len = batch["responses"].shape[1]
        masks = depth_masks(
            batch["attention_mask"], batch["attention_mask"][:, -response_len:], self.mtp.depths
        )
        counts = torch.stack([m.sum() for m in masks]).to(torch.float64)
        if group_size(self.dp_group) > 1:
            dist.all_reduce(counts, group=self.dp_group)
        return counts

    def _mtp_loss(self, counts: torch.Tensor, dp_size: int, acc: MetricAccumulator) -> torch.Tensor:
        """``mtp_loss_scaling_factor / D * sum_k loss_k`` of the last forward, ``loss_k`` the depth's
        cross-entropy summed over this micro-batch and divided by the mini-batch's count over all ranks
        (`_mtp_token_counts`), so the mini-batch's terms add up to the token mean; ``actor/mtp_loss`` (the
        depths' mean) and ``actor/mtp_loss/depth_k`` are those means."""
        sums, _ = self._mtp_out
        if sums is None:
            raise ValueError(
                "the MTP loss is on but _forward_micro_batch returned none (an override must pass "
                "mtp=self.mtp is not None and self.actor_module.training to forward_micro_batch)"
            )
        means = dp_size * sums / counts.clamp(min=1).to(sums.dtype)
        for k, value in enumerate(means.detach()):
            acc.add_rank_share(f"actor/mtp_loss/depth_{k + 1}", value)
        acc.add_rank_share("actor/mtp_loss", means.detach().mean())
        return self.mtp.loss_scale * means.mean()

    def _reinforce_loss(
        self, mb: Any, log_probs: torch.Tensor, mode: str, norm: dict[str, Any], acc: MetricAccumulator
    ) -> torch.Tensor:
        """``use_policy_gradient``'s loss of one micro-batch; its metrics go to ``acc`` with their weights."""
        pg_loss, metrics = compute_policy_loss_reinforce(
            mb["rollout_log_probs"],
            log_probs,
            mb["advantages"],
            mb["response_mask"],
            mode,
            **correction_settings(self.reinforce),
            **norm,
        )
        for key, (value, weight) in metrics.items():
            acc.add(key, value, weight=weight)
        return pg_loss
