"""``perf/*`` of a training step: tokens/s, and the MFU of the actor's and the critic's updates from FLOPs
estimates of their models (`rlflow.logging.flops.FlopsCounter`) and the per-worker peak."""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlflow.config import need_critic
from rlflow.config.schema import PPOTrainerConfig
from rlflow.protocol import DataProto
from rlflow.trainer.metrics import compute_throughput_metrics
from rlflow.trainer.worker_groups import WorkerGroups, rank_threads

__all__ = ["UpdateThroughput"]

logger = logging.getLogger(__name__)


class UpdateThroughput:
    """FLOPs estimators of the actor's and the critic's models and the peak of one worker, set up once.

    Args:
        config: the run's typed config.
    """

    def __init__(self, config: PPOTrainerConfig) -> None:
        from rlflow.logging.flops import FlopsCounter, peak_flops
        from rlflow.models.loader import load_model_config

        self.epochs = {
            "actor": int(config.actor_rollout_ref.actor.ppo_epochs),
            "critic": int(config.critic.ppo_epochs),
        }
        models = {"actor": (config.actor_rollout_ref.model, None)}
        if need_critic(config):
            models["critic"] = (config.critic.model, 1)  # a value head of one output
        self.counters: dict[str, Any] = {}
        for role, (model, head) in models.items():
            try:
                hf = load_model_config(
                    str(model.path), bool(model.trust_remote_code), dict(model.override_config)
                )
                self.counters[role] = FlopsCounter(hf, head_outputs=head)
            except (ValueError, TypeError) as err:  # e.g. a mixture-of-experts config
                logger.warning("no FLOPs estimate for the %s model (%s); its MFU is not reported", role, err)
        self.peak_flops: float | None = None
        if self.counters:
            trainer = config.trainer
            configured = None if trainer.peak_tflops is None else float(trainer.peak_tflops) * 1e12
            device = "cuda" if torch.cuda.is_available() and str(trainer.device) != "cpu" else "cpu"
            threads = rank_threads(config)
            self.peak_flops = peak_flops(device, configured=configured, num_threads=threads)

    def metrics(
        self, batch: DataProto, timing: dict[str, float], groups: WorkerGroups, ahead: bool = False
    ) -> dict[str, float]:
        """``perf/*``: tokens/s and, for the roles that updated this step, the MFU (`compute_throughput_metrics`).
        With ``ahead`` (``trainer.forward_ahead``) the updates' forwards ran before their phase: the actor's
        in ``timing["forward_ahead"]``, the critic's as its values (``timing["values"]``); each is added to
        its update's time."""
        seqlens = batch.batch["attention_mask"].sum(-1).tolist()
        if ahead:
            timing = dict(timing)
            for role, forwards in (("actor", "forward_ahead"), ("critic", "values")):
                if f"update_{role}" in timing:
                    timing[f"update_{role}"] += timing.get(forwards, 0.0)
        flops = {
            role: counter.estimate_flops(seqlens) * self.epochs[role]
            for role, counter in self.counters.items()
            if f"update_{role}" in timing
        }
        return compute_throughput_metrics(
            batch,
            timing,
            n_workers=groups.actor.world_size,
            actor_flops=flops.get("actor"),
            peak_flops=self.peak_flops,
            critic_flops=flops.get("critic"),
            n_critic_workers=groups.critic.world_size if groups.critic is not None else None,
        )
