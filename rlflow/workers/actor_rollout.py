"""`ActorRolloutWorker`: the policy's Ray actor — rollout, old log-probs and the PPO update."""

from __future__ import annotations

from typing import Any

import torch

from rlflow.engine.actor import DataParallelPPOActor
from rlflow.engine.batching import actor_update_spec, log_prob_spec
from rlflow.models.router_replay import ROUTED_EXPERTS
from rlflow.parallel.fsdp import mixed_precision_dtypes
from rlflow.parallel.weight_mixing import local_shards
from rlflow.protocol import DataProto
from rlflow.rollout import get_rollout_class
from rlflow.rollout.base import logprob_temperature
from rlflow.single_controller import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from rlflow.workers.base import RoleWorker
from rlflow.workers.role_setup import (
    actor_layout,
    metrics_proto,
    model_path,
    resolve_torch_compile,
    role_tokenizer,
    timed_call,
)

__all__ = ["ActorRolloutWorker"]


def _router_top_k(actor: Any, module: torch.nn.Module) -> int | None:
    """Experts per token of a mixture-of-experts actor whose router losses are on (None when they are off);
    that the model is one was checked before Ray started (`rlflow.config.megatron_checks`)."""
    if not (float(actor.moe_aux_loss_coef) or float(actor.moe_z_loss_coef)):
        return None
    return int(module.config.num_experts_per_tok)


class ActorRolloutWorker(RoleWorker):
    """The policy: generation (``actor_rollout_ref.rollout``), log-probs, PPO update."""

    mesh_name = "actor"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        self._build("causal_lm", actor_layout(self.config), self.config.actor_rollout_ref.actor.optim)

    def checkpoint_section(self) -> Any:
        return self.config.actor_rollout_ref.actor.checkpoint

    def profile_sections(self) -> list[tuple[Any, frozenset[str] | None]]:
        arr = self.config.actor_rollout_ref
        return [(arr.rollout, frozenset({"generate_sequences"})), (arr.actor, None)]

    def _init_roles(self) -> None:
        arr = self.config.actor_rollout_ref
        actor, rollout = arr.actor, arr.rollout
        dims = self.parallel.dims
        correction = self.config.algorithm.rollout_correction
        self.actor = DataParallelPPOActor(
            actor,
            self.module,
            self.optimizer,
            update=actor_update_spec(
                actor,
                rollout.n,
                dims.dp_size,
                self.config.trainer.seed,
                offload_activations=arr.model.enable_activation_offload,
            ),
            log_prob=log_prob_spec(
                rollout.log_prob_use_dynamic_bsz,
                rollout.log_prob_micro_batch_size_per_gpu,
                rollout.log_prob_max_token_len_per_gpu,
                dims.sp_size,
            ),
            temperature=logprob_temperature(rollout.temperature),
            use_remove_padding=arr.model.use_remove_padding,
            share_prompts=arr.model.use_shared_prompts,
            reinforce=correction if correction.use_policy_gradient else None,
            torch_compile=resolve_torch_compile(actor.use_torch_compile, self.device),
            router_top_k=_router_top_k(actor, self.module),
            router_replay=str(actor.router_replay.mode),
            **self._groups(),
        )
        self.tokenizer = role_tokenizer(arr.model)
        extra = {"model_path": model_path(arr.model)} if rollout.name == "vllm" else {}
        param_dtype = mixed_precision_dtypes(actor.fsdp_config.mixed_precision)[0]
        self.rollout = get_rollout_class(rollout.name)(
            self.module, rollout, self.tokenizer, dp_rank=dims.dp_rank, compute_dtype=param_dtype, **extra
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_shards(self) -> dict:
        """This rank's local parameter shards as CPU tensors (the reference sync, ``ref.sync_ref_model``)."""
        return local_shards(self.module)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        metrics: dict[str, float] = {}
        with timed_call("actor/generate", metrics):
            out = self.rollout.generate_sequences(prompts)
        if self.rollout.last_weight_sync_s is not None:  # verl's name for the weight sync into the engine
            metrics["timing_s/update_weights"] = float(self.rollout.last_weight_sync_s)
        out.meta_info.setdefault("metrics", {}).update(metrics)
        return out

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` of the responses, and ``actor/entropy`` of the whole batch."""
        metrics: dict[str, float] = {}
        with timed_call("actor/compute_log_prob", metrics, int(data.batch["attention_mask"].sum())):
            log_probs, entropy = self.actor.compute_log_prob(data, calculate_entropy=True)
        mask = data.batch["response_mask"].to(entropy.dtype)
        stats = torch.stack([(entropy * mask).sum(), mask.sum()]).double()
        if self.parallel.dims.dp_size > 1:
            torch.distributed.all_reduce(stats, group=self.parallel.dp_group)
        metrics["actor/entropy"] = float(stats[0] / stats[1].clamp(min=1))
        if self.actor.last_replay_mismatch is not None:  # R3: the rollout's experts vs the trainer's
            metrics["actor/router_replay_rollout_mismatch"] = self.actor.last_replay_mismatch
        tensors = {"old_log_probs": log_probs}
        if self.actor.last_routing is not None:  # router_replay.mode=R2: what the update replays
            tensors[ROUTED_EXPERTS] = self.actor.last_routing
        return DataProto.from_dict(tensors=tensors, meta_info={"metrics": metrics})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def forward_ahead(self, data: DataProto) -> DataProto:
        """``trainer.forward_ahead``: the coming update's forwards of this shard, run now and kept for
        `update_actor` (`rlflow.engine.forward_ahead`); returns ``perf/actor/forward_ahead/time_s``."""
        metrics: dict[str, float] = {}
        with timed_call("actor/forward_ahead", metrics, int(data.batch["attention_mask"].sum())):
            self.actor.forward_ahead(data, self._step(data))
        return metrics_proto(len(data), metrics)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update_actor(self, data: DataProto, adv: DataProto | None = None) -> DataProto:
        """PPO update. ``adv`` is the critic group's future of ``advantages`` (routed here by sample
        index); without a critic the batch already carries them."""
        if adv is not None:
            data.batch["advantages"] = adv.batch["advantages"]
        metrics = self._optimizer_update("actor", self.actor.update_policy, data)
        return metrics_proto(len(data), metrics)
