"""`CriticWorker`: the value model's Ray actor — values, advantages (once per step) and the value update.

One step with a critic (every call non-blocking up to the updates; the driver moves object refs only)::

    values = critic.compute_values(batch)                 # future: values
    adv = critic.compute_advantage(batch, values=values)   # future: values, advantages, returns
    critic.update_critic(batch, adv=adv)                   # returns + value loss; advantage metrics
    actor.update_actor(batch, adv=adv)                     # routed to the actor's shards by sample index
"""

from __future__ import annotations

from typing import Any

from rlflow.algos.custom import load_custom_advantage_fn
from rlflow.engine.advantage import compute_advantage_on_shard, shard_advantage_metrics
from rlflow.engine.batching import critic_update_spec, log_prob_spec
from rlflow.engine.critic import DataParallelPPOCritic
from rlflow.protocol import DataProto
from rlflow.single_controller import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from rlflow.workers.base import RoleWorker
from rlflow.workers.role_setup import critic_layout, metrics_proto

__all__ = ["CriticWorker"]


def _global_batch_size(data: DataProto) -> int:
    if "global_batch_size" not in data.meta_info:
        raise ValueError("a critic call needs meta_info['global_batch_size'] (the driver sets it per step)")
    return int(data.meta_info["global_batch_size"])


class CriticWorker(RoleWorker):
    """The value model with its own layout (``critic`` section, possibly fewer ranks than the actor)."""

    mesh_name = "critic"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        self._build("value", critic_layout(self.config), self.config.critic.optim)

    def checkpoint_section(self) -> Any:
        return self.config.critic.checkpoint

    def profile_sections(self) -> list[tuple[Any, frozenset[str] | None]]:
        return [(self.config.critic, None)]

    def _init_roles(self) -> None:
        critic = self.config.critic
        dims = self.parallel.dims
        self.critic = DataParallelPPOCritic(
            critic,
            self.module,
            self.optimizer,
            update=critic_update_spec(critic, critic.rollout_n, dims.dp_size, self.config.trainer.seed),
            forward=log_prob_spec(
                critic.use_dynamic_bsz,
                critic.forward_micro_batch_size_per_gpu,
                critic.forward_max_token_len_per_gpu,
                dims.sp_size,
            ),
            use_remove_padding=critic.model.use_remove_padding,
            share_prompts=critic.model.use_shared_prompts,
            **self._groups(),
        )
        spec = self.config.algorithm.custom_advantage_function
        self.custom_adv_fn = load_custom_advantage_fn(spec.path, spec.name) if spec.path else None

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"), blocking=False)
    def compute_values(self, data: DataProto) -> DataProto:
        """The values of this shard; with ``meta_info["forward_ahead"]`` through the coming update's own
        forwards, kept for `update_critic` (``trainer.forward_ahead``, `rlflow.engine.forward_ahead`)."""
        if data.meta_info.get("forward_ahead"):
            return DataProto.from_dict(tensors={"values": self.critic.values_ahead(data, self._step(data))})
        return DataProto.from_dict(tensors={"values": self.critic.compute_values(data)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"), blocking=False)
    def compute_advantage(self, data: DataProto, values: DataProto) -> DataProto:
        """Advantages and returns of this shard from the step's rewards and the critic's values, computed
        once for both updates (`rlflow.engine.advantage.compute_advantage_on_shard`)."""
        data.batch["values"] = values.batch["values"]
        advantages, returns = compute_advantage_on_shard(
            data,
            self.config.algorithm,
            self.custom_adv_fn,
            self.parallel.dp_group,
            self.parallel.dims.dp_rank,
            _global_batch_size(data),
        )
        return DataProto.from_dict(
            tensors={"values": values.batch["values"], "advantages": advantages, "returns": returns}
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def update_critic(self, data: DataProto, adv: DataProto) -> DataProto:
        """The clipped value update towards ``returns``; also reports the step's advantage, return and
        value statistics and the explained variance of the whole batch."""
        for key in ("values", "advantages", "returns"):
            data.batch[key] = adv.batch[key]
        metrics = shard_advantage_metrics(
            data, self.parallel.dp_group, self.parallel.dims.dp_rank, _global_batch_size(data)
        )
        metrics.update(self._optimizer_update("critic", self.critic.update_critic, data))
        return metrics_proto(len(data), metrics)
