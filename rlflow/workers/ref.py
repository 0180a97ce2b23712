"""`RefWorker`: the frozen reference policy's Ray actor (``compute_ref_log_prob``)."""

from __future__ import annotations

from typing import Any

from rlflow.engine.actor import DataParallelPPOActor
from rlflow.engine.batching import log_prob_spec
from rlflow.parallel.weight_mixing import mix_local_shards_
from rlflow.protocol import DataProto
from rlflow.rollout.base import logprob_temperature
from rlflow.single_controller import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from rlflow.workers.base import RoleWorker
from rlflow.workers.role_setup import ref_layout, resolve_torch_compile

__all__ = ["RefWorker"]


class RefWorker(RoleWorker):
    """The frozen reference policy: the actor's model, mesh and precision, no optimizer."""

    mesh_name = "ref"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        self._build("causal_lm", ref_layout(self.config), optim=None)

    def profile_sections(self) -> list[tuple[Any, frozenset[str] | None]]:
        return [(self.config.actor_rollout_ref.ref, None)]

    def _init_roles(self) -> None:
        arr = self.config.actor_rollout_ref
        ref = arr.ref
        self.ref = DataParallelPPOActor(
            arr.actor,
            self.module,
            log_prob=log_prob_spec(
                ref.log_prob_use_dynamic_bsz,
                ref.log_prob_micro_batch_size_per_gpu,
                ref.log_prob_max_token_len_per_gpu,
                self.parallel.dims.sp_size,
            ),
            temperature=logprob_temperature(arr.rollout.temperature),
            use_remove_padding=arr.model.use_remove_padding,
            share_prompts=arr.model.use_shared_prompts,
            torch_compile=resolve_torch_compile(ref.use_torch_compile, self.device),
            **self._groups(),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mix_in_weights(self, shards: dict, alpha: float) -> None:
        """``reference <- alpha * actor + (1 - alpha) * reference`` on this rank's shards
        (``ref.sync_ref_model``; ``shards``: the actor's `ActorRolloutWorker.weight_shards` of this rank)."""
        mix_local_shards_(self.module, shards, float(alpha))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        log_probs, _ = self.ref.compute_log_prob(data)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})
