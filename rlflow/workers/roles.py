"""Ray-facing workers, one small class per role (composition, no role flags).

* `ActorRolloutWorker` — the policy: rollout, old log-probs, PPO update (computes advantages from
  the critic's values future on the batch gathered over its DP ranks).
* `RefWorker` — the frozen reference policy (``compute_ref_log_prob``).
* `CriticWorker` — values (non-blocking: the driver gets a future) and the value update (returns
  computed from the same values future).
* `RewardModelWorker` — sequence-classification reward model scores.

Each role is its own worker group (own processes, own process group and FSDP mesh), colocated with
the others on one placement group. Data methods use mesh dispatch: samples are split by the DP rank
each worker registers, Ulysses peers get the same samples and only sp-rank-0 outputs are gathered.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from rlflow.algos.compute_advantage import advantage_metrics, compute_advantage
from rlflow.algos.stats import explained_variance
from rlflow.engine.actor import DataParallelPPOActor
from rlflow.engine.critic import DataParallelPPOCritic
from rlflow.engine.optim import build_lr_scheduler, build_optimizer
from rlflow.models.loader import load_reward_model, load_tokenizer
from rlflow.parallel.checkpoint import export_hf, load_checkpoint, save_checkpoint
from rlflow.parallel.sharded import load_optimizer_to_device, offload_optimizer_to_cpu
from rlflow.protocol import DataProto
from rlflow.single_controller import Dispatch, Worker, make_nd_compute_dataproto_dispatch_fn, register
from rlflow.workers.role_setup import (
    GatheredAdvantages,
    build_role_module,
    gathered_advantages,
    metrics_proto,
    model_path,
    peak_memory_metrics,
    per_rank_sizes,
    setup_role_parallel,
    timed_call,
    tokenizer_path,
)

logger = logging.getLogger(__name__)

__all__ = ["ActorRolloutWorker", "CriticWorker", "RefWorker", "RewardModelWorker"]


def _hf_config(model_cfg: dict) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(
        model_path(model_cfg), trust_remote_code=bool(model_cfg.get("trust_remote_code"))
    )


def _custom_advantage_fn(config: dict) -> Any:
    spec = config["algorithm"].get("custom_advantage_function") or {}
    if not spec.get("path"):
        return None
    from rlflow.algos.custom import load_custom_advantage_fn

    return load_custom_advantage_fn(spec["path"], spec["name"])


class _ModelRole(Worker):
    """Shared set-up: process group, meshes, dispatch registration, model, optional optimizer."""

    mesh_name = ""
    key_prefix = ""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.module: torch.nn.Module | None = None
        self.optimizer = None
        self.lr_scheduler = None

    def _build(self, kind: str, model_cfg: dict, section: dict, with_optimizer: bool) -> None:
        torch.manual_seed(int(self.config["trainer"]["seed"]))
        self.parallel = setup_role_parallel(self.world_size, section, _hf_config(model_cfg), self.key_prefix)
        dims = self.parallel.dims
        self.register_dispatch_info(self.mesh_name, dims.dp_rank, dims.is_collect_rank)
        self.module = build_role_module(
            kind, model_cfg, section, self.parallel, int(self.config["trainer"]["seed"])
        )
        if with_optimizer:
            optim_cfg = section["optim"]
            total = int(self.config["trainer"]["total_training_steps_resolved"])
            self.optimizer = build_optimizer(self.module.parameters(), optim_cfg, f"{self.key_prefix}.optim")
            self.lr_scheduler = build_lr_scheduler(
                self.optimizer, optim_cfg, total, f"{self.key_prefix}.optim"
            )

    def _groups(self) -> dict[str, Any]:
        p = self.parallel
        return {"dp_group": p.dp_group, "sp_group": p.sp_group, "sync_group": p.sync_group}

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        """Sharded model, optimizer, scheduler and RNG, plus ``huggingface/`` (config and tokenizer of the
        base model) so that ``python -m rlflow.model_merger`` needs nothing else."""
        self._load_optimizer()
        save_checkpoint(
            path, self.module, self.optimizer, self.lr_scheduler, extra_state={"global_step": global_step}
        )
        self._offload_optimizer()
        if self.rank == 0:
            from transformers import AutoConfig

            model_cfg = self._model_cfg()
            hf_dir = os.path.join(path, "huggingface")
            trust = bool(model_cfg.get("trust_remote_code"))
            AutoConfig.from_pretrained(model_path(model_cfg), trust_remote_code=trust).save_pretrained(hf_dir)
            load_tokenizer(tokenizer_path(model_cfg), trust_remote_code=trust).save_pretrained(hf_dir)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self._load_optimizer()
        load_checkpoint(path, self.module, self.optimizer, self.lr_scheduler)
        self._offload_optimizer()

    def _gathered_advantages(self, data: DataProto, values: DataProto) -> GatheredAdvantages:
        """Advantages and returns from the critic's values, on the batch gathered over this role's DP ranks
        (the actor and the critic run the same computation, so both see the same numbers)."""
        data.batch["values"] = values.batch["values"]
        algorithm = self.config["algorithm"]
        return gathered_advantages(
            data,
            self.parallel.dp_group,
            self.parallel.dims.dp_rank,
            lambda full: compute_advantage(full, algorithm, self.custom_adv_fn),
        )

    def _optimizer_update(self, prefix: str, update: Any, data: DataProto, metrics: dict[str, float]) -> None:
        """Run ``update(data)`` with the optimizer state on the device, record its metrics, the lr and the
        timing, then step the lr scheduler once per training step."""
        self._load_optimizer()
        with timed_call(f"{prefix}/update", metrics, int(data.batch["attention_mask"].sum())):
            metrics.update(update(data))
        self._offload_optimizer()
        metrics[f"{prefix}/lr"] = self._lr()
        metrics.update(peak_memory_metrics("perf" if prefix == "actor" else f"perf/{prefix}"))
        self.lr_scheduler.step()

    def _offload_optimizer(self) -> None:
        """``fsdp_config.optimizer_offload``: keep the optimizer state on CPU between updates (GPU runs;
        a logged no-op on CPU, where it already is)."""
        if self.optimizer is not None and self._fsdp_cfg().get("optimizer_offload", False):
            offload_optimizer_to_cpu(self.optimizer)

    def _load_optimizer(self) -> None:
        if self.optimizer is not None and self._fsdp_cfg().get("optimizer_offload", False):
            load_optimizer_to_device(self.optimizer)

    def _fsdp_cfg(self) -> dict:
        return {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> None:
        """Write a HF model directory (with the tokenizer) that ``from_pretrained`` loads."""
        tokenizer = load_tokenizer(tokenizer_path(self._model_cfg()))
        export_hf(self.module, tokenizer, out_dir)

    def _model_cfg(self) -> dict:
        raise NotImplementedError


class ActorRolloutWorker(_ModelRole):
    """The policy: generation, log-probs, PPO update."""

    mesh_name = "actor"
    key_prefix = "actor_rollout_ref.actor"

    def _model_cfg(self) -> dict:
        return self.config["actor_rollout_ref"]["model"]

    def _fsdp_cfg(self) -> dict:
        return self.config["actor_rollout_ref"]["actor"].get("fsdp_config") or {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        arr = self.config["actor_rollout_ref"]
        actor_cfg = arr["actor"]
        self._build("causal_lm", arr["model"], actor_cfg, with_optimizer=True)
        n = int(arr["rollout"]["n"])
        flat = per_rank_sizes(actor_cfg, n, self.parallel.dims.dp_size, self.key_prefix)
        rollout = arr["rollout"]
        flat.update(
            use_remove_padding=bool(arr["model"].get("use_remove_padding", False)),
            log_prob_micro_batch_size_per_gpu=rollout.get("log_prob_micro_batch_size_per_gpu"),
            log_prob_use_dynamic_bsz=rollout.get("log_prob_use_dynamic_bsz", False),
            log_prob_max_token_len_per_gpu=rollout.get("log_prob_max_token_len_per_gpu"),
            seed=int(self.config["trainer"]["seed"]),
        )
        self.actor = DataParallelPPOActor(flat, self.module, self.optimizer, **self._groups())
        from rlflow.rollout import get_rollout_class

        self.tokenizer = load_tokenizer(tokenizer_path(arr["model"]))
        rollout_cls = get_rollout_class(rollout["name"])
        extra = {"model_path": model_path(arr["model"])} if rollout["name"] == "vllm" else {}
        self.rollout = rollout_cls(
            self.module, rollout, self.tokenizer, dp_rank=self.parallel.dims.dp_rank, **extra
        )
        self.custom_adv_fn = _custom_advantage_fn(self.config)
        self._offload_optimizer()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        metrics: dict[str, float] = {}
        with timed_call("actor/generate", metrics):
            out = self.rollout.generate_sequences(prompts)
        out.meta_info.setdefault("metrics", {}).update(metrics)
        return out

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        metrics: dict[str, float] = {}
        with timed_call("actor/compute_log_prob", metrics, int(data.batch["attention_mask"].sum())):
            log_probs, entropy = self.actor.compute_log_prob(data, calculate_entropy=True)
        mask = data.batch["response_mask"].to(entropy.dtype)
        stats = torch.stack([(entropy * mask).sum(), mask.sum()]).double()
        if self.parallel.dims.dp_size > 1:
            torch.distributed.all_reduce(stats, group=self.parallel.dp_group)
        metrics["actor/entropy"] = float(stats[0] / stats[1].clamp(min=1))
        return DataProto.from_dict(tensors={"old_log_probs": log_probs}, meta_info={"metrics": metrics})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update_actor(self, data: DataProto, values: DataProto | None = None) -> DataProto:
        """PPO update. With ``values`` (the critic's future, materialised here) the advantages are
        computed on the gathered batch first; without, the batch already carries them."""
        metrics: dict[str, float] = {}
        if values is not None:
            g = self._gathered_advantages(data, values)
            data.batch["advantages"] = g.advantages
            metrics.update(advantage_metrics(g.full, g.full_advantages, g.full_returns))
        self._optimizer_update("actor", self.actor.update_policy, data, metrics)
        return metrics_proto(len(data), metrics)


class RefWorker(_ModelRole):
    """The frozen reference policy."""

    mesh_name = "ref"
    key_prefix = "actor_rollout_ref.ref"

    def _model_cfg(self) -> dict:
        return self.config["actor_rollout_ref"]["model"]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        arr = self.config["actor_rollout_ref"]
        # Same mesh layout and precision as the actor, so that ref and old log-probs differ only by the
        # weights (a bf16 actor against an fp32 reference would show KL from precision alone).
        actor_fsdp = arr["actor"].get("fsdp_config") or {}
        fsdp = {**actor_fsdp, **(arr["ref"].get("fsdp_config") or {})}
        section = {**arr["ref"], "strategy": arr["actor"]["strategy"], "fsdp_config": fsdp}
        self._build("causal_lm", arr["model"], section, with_optimizer=False)
        flat = dict(arr["ref"])
        flat["use_remove_padding"] = bool(arr["model"].get("use_remove_padding", False))
        self.ref = DataParallelPPOActor(flat, self.module, None, **self._groups())

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        log_probs, _ = self.ref.compute_log_prob(data)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})


class CriticWorker(_ModelRole):
    """The value model: values as a future, the clipped value-loss update."""

    mesh_name = "critic"
    key_prefix = "critic"

    def _model_cfg(self) -> dict:
        return self.config["critic"]["model"]

    def _fsdp_cfg(self) -> dict:
        return self.config["critic"].get("fsdp_config") or {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        critic_cfg = self.config["critic"]
        self._build("value", critic_cfg["model"], critic_cfg, with_optimizer=True)
        n = int(self.config["actor_rollout_ref"]["rollout"]["n"])
        flat = per_rank_sizes(critic_cfg, n, self.parallel.dims.dp_size, self.key_prefix)
        flat["seed"] = int(self.config["trainer"]["seed"])
        self.critic = DataParallelPPOCritic(flat, self.module, self.optimizer, **self._groups())
        self.custom_adv_fn = _custom_advantage_fn(self.config)
        self._offload_optimizer()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"), blocking=False)
    def compute_values(self, data: DataProto) -> DataProto:
        values = self.critic.compute_values(data)
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def update_critic(self, data: DataProto, values: DataProto) -> DataProto:
        """Returns from the same values future (on the gathered batch), then the value update."""
        g = self._gathered_advantages(data, values)
        data.batch["returns"] = g.returns
        full = g.full.batch
        metrics = {
            "critic/vf_explained_var": explained_variance(
                g.full_returns, full["values"], full["response_mask"]
            )
        }
        self._optimizer_update("critic", self.critic.update_critic, data, metrics)
        return metrics_proto(len(data), metrics)


class RewardModelWorker(_ModelRole):
    """A sequence-classification reward model; scores go at the last valid response token.

    Inference only: every rank holds a full copy (no FSDP) and scores its share of the samples in
    micro-batches of ``reward_model.micro_batch_size_per_gpu``. It must share the policy's tokenizer.
    """

    mesh_name = "reward_model"
    key_prefix = "reward_model"

    def _model_cfg(self) -> dict:
        return self.config["reward_model"]["model"]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        from rlflow.parallel.distributed import init_distributed

        init_distributed()
        self.register_dispatch_info(self.mesh_name, self.rank, True)
        model_cfg = self.config["reward_model"]["model"]
        self.module = load_reward_model(
            model_path(model_cfg), trust_remote_code=bool(model_cfg.get("trust_remote_code"))
        )
        self.module.eval()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("reward_model"))
    def compute_rm_score(self, data: DataProto) -> DataProto:
        from rlflow.reward.reward_model import compute_rm_score

        micro = int(self.config["reward_model"]["micro_batch_size_per_gpu"])
        parts = []
        with torch.no_grad():
            for mb in data.batch.split(micro):
                parts.append(
                    compute_rm_score(
                        self.module,
                        mb["input_ids"],
                        mb["attention_mask"],
                        mb["position_ids"],
                        mb["responses"].shape[-1],
                    )
                )
        return DataProto.from_dict(tensors={"rm_scores": torch.cat(parts)})
