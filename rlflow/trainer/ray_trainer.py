"""``RayPPOTrainer``: the PPO loop on the driver, as named steps.

One step::

    generate → reward → old log-prob → ref log-prob → (KL in reward) → values (a future)
             → advantages → update critic → update actor → validate → save → log

With a critic, ``compute_values`` and ``compute_advantage`` run in the critic group, non-blocking: the
object refs of the values and of the advantages and returns derived from them (computed once, on the
critic's shards) go straight to ``update_critic`` and ``update_actor`` on the workers, routed by sample
index, and the driver never fetches them. Without one, the driver computes the advantages (it holds the
whole batch), so group estimators always see whole groups.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rlflow.algos.advantages import advantage_metrics, compute_advantage, get_estimator_info
from rlflow.algos.rollout_correction import correct_rollout_batch
from rlflow.config import to_typed, update_is_on_policy
from rlflow.config.correction_checks import resolve_bypass_mode, rollout_correction_active
from rlflow.config.schema import PPOTrainerConfig
from rlflow.logging.tracking import ProgressBar
from rlflow.protocol import DataProto
from rlflow.single_controller.futures import DataProtoFuture
from rlflow.trainer.batch_order import balance_order
from rlflow.trainer.checkpointing import TrainerCheckpointer
from rlflow.trainer.dynamic_sampling import OutOfData, Round, sample_informative_groups
from rlflow.trainer.generations import dump_rollouts, record_validation
from rlflow.trainer.metrics import (
    compute_data_metrics,
    compute_timing_metrics,
    rollout_entropy,
    rollout_probs_diff,
    validation_metrics,
)
from rlflow.trainer.pf_ppo import redraw_batch
from rlflow.trainer.ppo.core_algos import apply_kl_penalty, get_kl_controller
from rlflow.trainer.throughput import UpdateThroughput
from rlflow.trainer.validation import run_validation
from rlflow.trainer.worker_groups import (
    WorkerGroups,
    build_worker_groups,
    forwards_ahead,
    overlap_threads,
    overlapped_updates,
    profiled_step,
    ref_beside_reward,
    resolve_forward_ahead,
    score_beside_reference,
    sync_reference,
    values_beside_reference,
    worker_metrics,
)

logger = logging.getLogger(__name__)

__all__ = ["RayPPOTrainer"]


@contextmanager
def _timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


class RayPPOTrainer:
    """Runs PPO (or GRPO and the other estimators) with colocated FSDP worker groups.

    Args:
        config: the typed, validated trainer config (`rlflow.config.to_typed`).
        tokenizer: the actor's tokenizer (pad/eos ids for generation, decoding for rewards).
        reward_fn / val_reward_fn: reward managers (``fn(batch, return_dict=True)``).
        train_dataloader / val_dataloader: resumable loaders of prompt batches (dicts for
            ``DataProto.from_single_dict``).
        custom_advantage_fn: the loaded ``algorithm.custom_advantage_function`` (driver side).
        tracker: an object with ``log(metrics, step)`` (e.g. :class:`rlflow.logging.tracking.Tracking`).
    """

    def __init__(
        self,
        config: PPOTrainerConfig,
        tokenizer: Any,
        reward_fn: Callable[..., Any],
        val_reward_fn: Callable[..., Any] | None,
        train_dataloader: Any,
        val_dataloader: Any | None = None,
        custom_advantage_fn: Callable[..., Any] | None = None,
        tracker: Any | None = None,
    ) -> None:
        if not isinstance(config, PPOTrainerConfig):  # a composed DictConfig (notebooks, verl-style code)
            config = to_typed(config)
        self.config = config
        self.tokenizer = tokenizer
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn or reward_fn
        self.train_dataloader, self.val_dataloader = train_dataloader, val_dataloader
        self.custom_advantage_fn = custom_advantage_fn
        self.tracker = tracker
        self.global_steps = 0
        self.kl_ctrl = (
            get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        )
        self.groups: WorkerGroups | None = None
        self.overlap: tuple[int, int] | None = None
        """``(actor, critic)`` threads of the overlapped updates (`overlap_threads`); None: one after the other."""
        # ReMax: one greedy response per prompt, its reward the baseline of the prompt's samples.
        self.needs_baselines = (
            custom_advantage_fn is None
            and get_estimator_info(str(config.algorithm.adv_estimator)).needs_baselines
        )
        # One epoch over one mini-batch: the update's own forward gives the old policy's log-probs.
        correction = config.algorithm.rollout_correction
        self.bypass_old_log_prob, bypass_why = resolve_bypass_mode(config)
        self.recompute_old_log_prob = not (self.bypass_old_log_prob or update_is_on_policy(config))
        # use_policy_gradient: the actor's loss recomputes weights and rejection in every micro-batch
        self.rollout_correction = (
            correction if rollout_correction_active(config) and not correction.use_policy_gradient else None
        )
        if correction.use_policy_gradient:
            logger.info(
                "algorithm.rollout_correction.use_policy_gradient: REINFORCE loss with importance weights of "
                "the current policy against the rollout's, recomputed in the actor's update (bypass mode)"
            )
        elif self.bypass_old_log_prob:
            logger.info(
                "%s: the rollout's log-probs are the old policy's (no compute_log_prob pass; rollout_is / "
                "rollout_rs then see identical log-probs: weights 1)",
                bypass_why,
            )
        elif not self.recompute_old_log_prob:
            logger.info(
                "on-policy update (ppo_epochs=1, ppo_mini_batch_size=train_batch_size): old log-probs come "
                "from the update's forward; the compute_log_prob pass is skipped"
            )
        self.checkpointer = TrainerCheckpointer(
            config.trainer, save_ref=bool(config.actor_rollout_ref.ref.sync_ref_model)
        )
        self.history: list[dict[str, float]] = []
        self.total_training_steps = self._total_steps()
        self.throughput = UpdateThroughput(config)

    # ---- set-up ---------------------------------------------------------------------------------------

    def _total_steps(self) -> int:
        per_epoch = len(self.train_dataloader)
        total = per_epoch * int(self.config.trainer.total_epochs)
        if self.config.trainer.total_training_steps is not None:
            total = min(total, int(self.config.trainer.total_training_steps))
        return total

    def init_workers(self) -> None:
        """Create the colocated worker groups and build their models."""
        self.groups = build_worker_groups(self.config, total_training_steps=self.total_training_steps)
        self.overlap = overlap_threads(self.config, self.groups)
        self.forward_ahead = resolve_forward_ahead(self.config, self.overlap)
        self.ref_with_reward = ref_beside_reward(self.config, self.groups, self.forward_ahead, self.overlap)
        if self.overlap is not None:
            logger.info(
                "trainer.overlap_updates: actor and critic update together, %d + %d threads", *self.overlap
            )

    @property
    def use_critic(self) -> bool:
        return self.groups is not None and self.groups.critic is not None

    # ---- the loop -------------------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train for ``total_training_steps``; returns the last step's metrics (plus validation)."""
        if self.groups is None:
            self.init_workers()
        self._load_checkpoint()
        last: dict[str, float] = {}
        val_only = bool(self.config.trainer.val_only)
        if self.val_dataloader is not None and (
            val_only or (self.config.trainer.val_before_train and self.global_steps == 0)
        ):
            last = self._validate()
            self._log(last, step=self.global_steps)
        if val_only:
            logger.info("trainer.val_only=true: validated at step %d, no training", self.global_steps)
            return last
        batches = self._prompt_batches()
        with ProgressBar(self.total_training_steps, initial=self.global_steps, disable=None) as bar:
            while self.global_steps < self.total_training_steps:
                item = next(batches, None)
                if item is None:
                    break
                epoch, batch = item
                self.global_steps += 1
                try:
                    with profiled_step(self.groups, self.config.trainer, self.global_steps):
                        last = self.train_step(batch, epoch, more=batches)
                except OutOfData as err:
                    self.global_steps -= 1
                    logger.warning("%s; training stops after step %d", err, self.global_steps)
                    break
                self._log(last, step=self.global_steps)
                bar.update(last)
        return last

    def _prompt_batches(self) -> Iterator[tuple[int, DataProto]]:
        """``(epoch, prompts)`` from the training loader, epoch after epoch up to ``trainer.total_epochs``."""
        sampler = getattr(self.train_dataloader, "sampler", None)
        epoch = getattr(sampler, "epoch", None)
        if epoch is None:
            epoch = self.global_steps // max(len(self.train_dataloader), 1)
        while epoch < int(self.config.trainer.total_epochs):
            for raw in self.train_dataloader:
                yield epoch, DataProto.from_single_dict(raw)
            epoch += 1

    def train_step(
        self, batch: DataProto, epoch: int = 0, more: Iterator[tuple[int, DataProto]] | None = None
    ) -> dict[str, float]:
        """One PPO step on a batch of prompts; returns its metrics.

        Args:
            batch: the step's prompts (``data.gen_batch_size`` of them).
            epoch: logged as ``training/epoch``.
            more: ``(epoch, prompts)`` batches for more generation rounds (``algorithm.filter_groups``).
        """
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {"training/global_step": self.global_steps, "training/epoch": epoch}
        with _timer("step", timing):
            batch, sample_metrics = self._sample(batch, timing, more)
            metrics.update(sample_metrics)
            if self.config.trainer.rollout_data_dir:
                with _timer("dump_rollout", timing):
                    dump_rollouts(
                        self.tokenizer, str(self.config.trainer.rollout_data_dir), self.global_steps, batch
                    )
            self._balance(batch)
            if self.recompute_old_log_prob:
                with _timer("old_log_prob", timing):
                    metrics.update(self._old_log_prob(batch))
            elif self.bypass_old_log_prob:
                batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"].clone()
                metrics.update(rollout_entropy(batch))
            if self.rollout_correction is not None:
                metrics.update(correct_rollout_batch(batch, self.rollout_correction))
            values, out = None, None
            actor_due = self.global_steps > int(self.config.trainer.critic_warmup)
            if self.forward_ahead:
                out, values, ahead = forwards_ahead(self.groups, batch, self.overlap, timing, actor_due)
                metrics.update(ahead)
            elif self.groups.ref is not None and self.use_critic and self.overlap is not None:
                out, values = values_beside_reference(self.groups, batch, self.overlap, timing)
            if out is not None:
                batch.union(out.select(batch_keys=["ref_log_prob"], meta_info_keys=[]))
            elif self.groups.ref is not None and "ref_log_prob" not in batch.batch.keys():
                with _timer("ref", timing):
                    self._ref_log_prob(batch)
            metrics.update(self._rewards_with_kl(batch))
            with _timer("adv", timing):
                adv, adv_metrics = self._advantages(batch, values)
            metrics.update(adv_metrics)
            trained = batch
            if self.config.algorithm.use_pf_ppo:
                algo, seed = self.config.algorithm, int(self.config.trainer.seed)
                trained, adv, pf_metrics = redraw_batch(
                    batch, adv, algo.pf_ppo, seed, self.global_steps, self._order
                )
                metrics.update(pf_metrics)
            if self.use_critic and actor_due and self.overlap is not None:
                for out in overlapped_updates(self.groups, trained, adv, self.overlap, timing):
                    metrics.update(worker_metrics(out))
            else:
                if self.use_critic:
                    with _timer("update_critic", timing):
                        metrics.update(self._update_critic(trained, adv))
                if actor_due:
                    with _timer("update_actor", timing):
                        metrics.update(self._update_actor(trained, adv))
            if self._ref_sync_due():
                with _timer("sync_ref", timing):
                    sync_reference(
                        self.groups, float(self.config.actor_rollout_ref.ref.ref_model_mixup_alpha)
                    )
            if self._due(self.config.trainer.test_freq):
                with _timer("testing", timing):
                    metrics.update(self._validate())
            if self._due(self.config.trainer.save_freq):
                with _timer("save_checkpoint", timing):
                    self._save_checkpoint()
        metrics.update(compute_data_metrics(batch, eos_token_id=self._eos_token_ids()))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(self.throughput.metrics(trained, timing, self.groups, self.forward_ahead))
        return metrics

    def _due(self, freq: int | None) -> bool:
        if not freq or freq <= 0:
            return False
        return self.global_steps % int(freq) == 0 or self.global_steps == self.total_training_steps

    # ---- steps ----------------------------------------------------------------------------------------

    def _generate(self, batch: DataProto, first_prompt: int = 0) -> tuple[DataProto, dict[str, float]]:
        """Sample ``rollout.n`` responses per prompt; the batch becomes one row per response.

        Args:
            batch: prompts.
            first_prompt: index of the first prompt among the step's (> 0 in later rounds of dynamic
                sampling): uids and sampling rows continue the step's numbering, so no two rounds draw
                the same noise.

        The returned batch carries the step's meta info, read by the calls of this step: ``global_steps``
        (sampling keys, mini-batch shuffles) and ``global_batch_size`` (the unpadded size, so workers
        can tell dispatch padding apart).
        """
        n = int(self.config.actor_rollout_ref.rollout.n)
        batch.non_tensor_batch["uid"] = np.array(
            [f"{self.global_steps}-{first_prompt + i}" for i in range(len(batch))], dtype=object
        )
        gen_batch = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
        gen_batch.meta_info.update(self._generation_meta(validate=False))
        if first_prompt:
            gen_batch.meta_info["row_offset"] = first_prompt * n
        out = self.groups.actor.generate_sequences(gen_batch)
        metrics = worker_metrics(out)
        out.meta_info = {}
        batch = batch.repeat(n, interleave=True).union(out)
        batch.meta_info = {"global_steps": self.global_steps, "global_batch_size": len(batch)}
        return batch, metrics

    def _rollout(self, batch: DataProto, timing: dict[str, float], first_prompt: int = 0) -> Round:
        """One generation round: (ReMax baselines,) responses and their scores.

        Returns:
            ``(batch, metrics, reward_extra_info)``: one row per response with ``token_level_scores``.
        """
        metrics: dict[str, float] = {}
        if self.needs_baselines:
            with _timer("gen_baseline", timing):
                baselines, baseline_metrics = self._reward_baselines(batch)
            metrics.update(baseline_metrics)
        with _timer("gen", timing):
            batch, gen_metrics = self._generate(batch, first_prompt)
        metrics.update(gen_metrics)
        if self.needs_baselines:
            n = int(self.config.actor_rollout_ref.rollout.n)
            batch.batch["reward_baselines"] = baselines.repeat_interleave(n)
        with _timer("reward", timing):
            extra = self._reward(batch, timing if self.ref_with_reward else None)
        return batch, metrics, extra

    def _sample(
        self, batch: DataProto, timing: dict[str, float], more: Iterator[tuple[int, DataProto]] | None
    ) -> tuple[DataProto, dict[str, float]]:
        """The step's scored responses: one round, or with ``algorithm.filter_groups`` as many rounds as
        it takes to keep ``data.train_batch_size`` prompts whose responses differ in the metric
        (`rlflow.algos.filter_groups`); the first ``train_batch_size`` kept prompts are the step's.

        ``reward/<key>/mean`` is over every response generated in the step. With filtering, also
        ``train/num_gen_batches`` (rounds) and ``train/informative_prompt_fraction``.
        """
        rounds = [self._rollout(batch, timing)]
        metrics: dict[str, float] = {}
        if self.config.algorithm.filter_groups.enable:
            batch, metrics = sample_informative_groups(
                self.config,
                rounds,
                lambda prompts, first: self._rollout(prompts, timing, first),
                more,
                self.global_steps,
            )
        else:
            batch = rounds[0][0]
        for key in rounds[0][1]:
            metrics[key] = float(np.mean([m[key] for _, m, _ in rounds if key in m]))
        for key in rounds[0][2]:
            joined = [v for _, _, extra in rounds for v in extra.get(key, [])]
            if _is_numeric(joined):
                metrics[f"reward/{key}/mean"] = float(np.mean(joined))
        return batch, metrics

    def _reward_baselines(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        """ReMax's baselines (Li et al. 2023, arXiv:2310.10505): the reward of one greedy response per
        prompt, from the same weights that sample the step's responses, scored like them.

        Args:
            batch: the step's prompts (before `_generate`; left unchanged).

        Returns:
            ``(baselines, metrics)``: ``(prompts,)`` summed token-level scores, and
            ``reward/baseline/mean``.
        """
        prompts = DataProto(
            batch=batch.batch.select("input_ids", "attention_mask", "position_ids"),
            non_tensor_batch=dict(batch.non_tensor_batch),
            meta_info={**self._generation_meta(validate=False), "do_sample": False, "n": 1},
        )
        out = self.groups.actor.generate_sequences(prompts)
        out.meta_info = {}
        greedy = DataProto(batch=None, non_tensor_batch=dict(batch.non_tensor_batch), meta_info={}).union(out)
        greedy.meta_info = {"global_steps": self.global_steps, "global_batch_size": len(greedy)}
        self._reward(greedy)
        baselines = greedy.batch["token_level_scores"].sum(-1)
        return baselines, {"reward/baseline/mean": float(baselines.mean())}

    def _eos_token_ids(self) -> list[int]:
        """The tokenizer's EOS and every EOS of the model's generation config (e.g. an end-of-turn token)."""
        if not hasattr(self, "_eos_ids"):
            from transformers import GenerationConfig

            ids = [self.tokenizer.eos_token_id]
            try:
                gen = GenerationConfig.from_pretrained(str(self.config.actor_rollout_ref.model.path))
                extra = gen.eos_token_id
                ids += extra if isinstance(extra, list) else [extra]
            except OSError:  # no generation_config.json
                pass
            self._eos_ids = sorted({int(i) for i in ids if i is not None})
        return self._eos_ids

    def _generation_meta(self, validate: bool) -> dict[str, Any]:
        bypass = self.bypass_old_log_prob and not validate  # the hf engine reports what the pass would
        return {
            "eos_token_id": self._eos_token_ids(),
            "pad_token_id": self.tokenizer.pad_token_id,
            "global_steps": self.global_steps,
            "validate": validate,
            "calculate_log_probs": bypass,
            "calculate_entropy": bypass,
        }

    def _balance(self, batch: DataProto) -> None:
        """Reorder samples so every actor DP rank gets a similar number of tokens."""
        order = self._order(batch)
        if order is not None:
            batch.reorder(torch.as_tensor(order))

    def _order(self, batch: DataProto) -> list[int] | None:
        """`_balance`'s order of the samples (None with ``trainer.balance_batch=false``)."""
        return balance_order(batch, self.config, self.groups.actor_dp_size)

    def _reward(self, batch: DataProto, ref_timing: dict[str, float] | None = None) -> dict[str, list[Any]]:
        """Score the responses into ``token_level_scores`` (with ``ref_timing``, the reference's log-probs
        too, beside the reward model: `score_beside_reference`); returns the reward's extra info."""
        if ref_timing is not None:
            batch.union(score_beside_reference(self.groups, batch, self.overlap, ref_timing))
        elif self.groups.reward_model is not None:
            batch.union(self.groups.reward_model.compute_rm_score(batch).select(meta_info_keys=[]))
        result = self.reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        return dict(result.get("reward_extra_info", {}))

    def _old_log_prob(self, batch: DataProto) -> dict[str, float]:
        out = self.groups.actor.compute_log_prob(batch)
        metrics = worker_metrics(out)
        batch.union(out.select(meta_info_keys=[]))  # old_log_probs, and R2's routed_experts
        if "rollout_log_probs" in batch.batch.keys():
            metrics.update(rollout_probs_diff(batch))
        return metrics

    def _ref_log_prob(self, batch: DataProto) -> None:
        out = self.groups.ref.compute_ref_log_prob(batch)
        batch.union(out.select(batch_keys=["ref_log_prob"], meta_info_keys=[]))

    def _rewards_with_kl(self, batch: DataProto) -> dict[str, float]:
        if self.kl_ctrl is None:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            return {}
        _, metrics = apply_kl_penalty(batch, self.kl_ctrl, self.config.algorithm.kl_penalty)
        return metrics

    def _advantages(
        self, batch: DataProto, values: DataProtoFuture | None = None
    ) -> tuple[DataProtoFuture | None, dict[str, float]]:
        """Advantages of the step, computed once.

        With a critic: ``compute_values`` (unless ``values``, their future, came with the reference's
        call: `values_beside_reference`) then ``compute_advantage`` in the critic group, both
        non-blocking; the returned future (values, advantages, returns) goes to both updates and is
        never fetched here. Without one, the driver holds the whole batch and computes them (group
        estimators see whole groups); the batch then carries ``advantages`` and ``returns``.
        """
        if self.use_critic:
            if values is None:
                values = self.groups.critic.compute_values(batch)
            adv = self.groups.critic.compute_advantage(batch, values=values)
            if not isinstance(adv, DataProtoFuture):
                raise TypeError("CriticWorker.compute_advantage must be registered with blocking=False")
            return adv, {}
        advantages, returns = compute_advantage(batch, self.config.algorithm, self.custom_advantage_fn)
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        return None, advantage_metrics(batch, advantages, returns)

    def _update_critic(self, batch: DataProto, adv: DataProtoFuture) -> dict[str, float]:
        return worker_metrics(self.groups.critic.update_critic(batch, adv=adv))

    def _update_actor(self, batch: DataProto, adv: DataProtoFuture | None) -> dict[str, float]:
        if adv is None:
            return worker_metrics(self.groups.actor.update_actor(batch))
        return worker_metrics(self.groups.actor.update_actor(batch, adv=adv))

    def _ref_sync_due(self) -> bool:
        ref = self.config.actor_rollout_ref.ref
        return (
            bool(ref.sync_ref_model)
            and self.groups.ref is not None
            and self.global_steps % int(ref.ref_model_sync_steps) == 0
        )

    # ---- validation -----------------------------------------------------------------------------------

    def _validate(self) -> dict[str, float]:
        """Generation with ``rollout.val_kwargs`` (greedy by default) on the validation set; per data source
        the mean score, and with ``val_kwargs.n > 1`` best@k and pass@k (`validation_metrics`)."""
        if self.val_dataloader is None:
            return {}
        n = int(self.config.actor_rollout_ref.rollout.val_kwargs.n)
        trainer = self.config.trainer
        record = bool(trainer.validation_data_dir) or int(trainer.log_val_generations) > 0
        result = run_validation(
            self.val_dataloader,
            self.groups,
            self.val_reward_fn,
            self._generation_meta(validate=True),
            n,
            keep_batches=record,
        )
        if result.batches:
            record_validation(
                self.tokenizer,
                result.batches,
                self.global_steps,
                trainer.validation_data_dir,
                int(trainer.log_val_generations),
                self.tracker,
            )
        return validation_metrics(result.sources, result.scores, n)

    # ---- checkpoints ----------------------------------------------------------------------------------

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "global_steps": self.global_steps,
            "dataloader": self.train_dataloader.state_dict(),
            "kl_coef": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
        }

    def _save_checkpoint(self) -> None:
        self.checkpointer.save(self.global_steps, self.groups, self._trainer_state())

    def _load_checkpoint(self) -> None:
        state = self.checkpointer.load(self.groups)
        if state is None:
            return
        self.global_steps = int(state["global_steps"])
        self.train_dataloader.load_state_dict(state["dataloader"])
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = state["kl_coef"]
        logger.info("resumed from step %d", self.global_steps)

    # ---- logging --------------------------------------------------------------------------------------

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.history.append({"step": step, **metrics})
        if self.tracker is not None:
            self.tracker.log(metrics, step=step)

    def shutdown(self) -> None:
        """Write Ray's timeline (``trainer.ray_timeline_json_file``), then kill the worker actors and
        release their placement group."""
        _write_ray_timeline(self.config.trainer.ray_timeline_json_file)
        if self.groups is not None:
            self.groups.shutdown()
            self.groups = None


def _write_ray_timeline(path: str | None) -> None:
    """Ray's timeline of the run's tasks and actor calls, as JSON at ``path`` (None: nothing)."""
    import ray

    if path is None or not ray.is_initialized():
        return
    target = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    ray.timeline(filename=target)
    logger.info("Ray timeline written to %s (open it in chrome://tracing or Perfetto)", target)


def _is_numeric(values: Any) -> bool:
    try:
        np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return True
