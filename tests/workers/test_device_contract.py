"""The device contract (DESIGN invariant 7, docs/gpu.md), proven on a CPU-only machine.

Every data method of every role worker receives its batch on the worker's device and returns CPU tensors,
through one choke point (the wrapper ``rlflow.single_controller.register`` builds). The proof puts each
role's model on a *second device type that exists on CPU*: PyTorch's lazy-tensor device (``lazy``, the
TorchScript backend), where any op that mixes a ``lazy`` tensor with a CPU tensor raises "Input tensor is
not a lazy tensor". The batches arrive as CPU tensors, exactly as they come from Ray. So:

* a method whose input is not moved to the worker's device fails at the first op that meets the model;
* a code path that creates a tensor on the CPU next to device tensors (``torch.arange(n)`` without a
  device, a CPU index or mask) fails where it meets them — the bugs that otherwise appear only on a GPU;
* every output must come back as CPU tensors (checked tensor by tensor).

The models here compute in the padded layout: PyTorch's lazy backend mishandles views made by
``torch.split`` (its results fall back to the CPU), which the remove-padding attention uses; the packed
path's device handling is checked on a real GPU by ``scripts/gpu_check.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from rlflow.protocol import DataProto

LAZY = "lazy"


def _on_cpu(data: DataProto) -> bool:
    return all(t.device.type == "cpu" for t in data.batch.values())


def _params_on(module: torch.nn.Module, device_type: str) -> bool:
    return all(p.device.type == device_type for p in module.parameters())


def _worker(rank: int) -> dict:
    import torch._lazy
    import torch._lazy.ts_backend
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlflow.config import load_config, to_typed
    from rlflow.engine.optim import build_lr_scheduler, build_optimizer
    from rlflow.models.loader import load_causal_lm, load_value_model
    from rlflow.models.tiny import get_tiny_model_path
    from rlflow.parallel.dims import ParallelDims
    from rlflow.workers import ActorRolloutWorker, CriticWorker, RefWorker, RewardModelWorker
    from rlflow.workers.role_setup import RoleParallel, actor_layout, critic_layout, ref_layout

    torch._lazy.ts_backend.init()
    device = torch.device(LAZY)
    path = get_tiny_model_path()
    config = to_typed(
        load_config(
            [
                f"actor_rollout_ref.model.path={path}",
                "actor_rollout_ref.model.use_remove_padding=false",
                "actor_rollout_ref.actor.use_kl_loss=true",
                "actor_rollout_ref.actor.entropy_coeff=0.01",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "critic.ppo_micro_batch_size_per_gpu=2",
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "data.max_response_length=4",
            ],
            config_name="demo_two_ranks",
        )
    )
    dims = ParallelDims(world_size=1).build_meshes("cpu")

    def place(worker, layout, module, mesh: str, optim=None):
        """What RoleWorker._build does, with the model on the lazy device instead of sharded by FSDP."""
        worker.layout, worker.device = layout, device
        worker.parallel = RoleParallel(dims, None, None, None)
        worker.register_dispatch_info(mesh, 0, True)
        worker.module = module.to(device)
        if optim is not None:
            worker.optimizer = build_optimizer(worker.module.parameters(), optim)
            worker.lr_scheduler = build_lr_scheduler(worker.optimizer, optim, 2)
        worker._init_roles()
        return worker

    arr = config.actor_rollout_ref
    actor = place(
        ActorRolloutWorker(config, 2), actor_layout(config), load_causal_lm(path), "actor", arr.actor.optim
    )
    ref = place(RefWorker(config, 2), ref_layout(config), load_causal_lm(path), "ref")
    critic = place(
        CriticWorker(config, 2),
        critic_layout(config),
        load_value_model(path, seed=0),
        "critic",
        config.critic.optim,
    )
    rm = RewardModelWorker(config, 2)
    rm_config = AutoConfig.from_pretrained(path, num_labels=1)
    rm.device, rm.module = device, AutoModelForSequenceClassification.from_config(rm_config).to(device).eval()
    rm.use_remove_padding = (
        False  # as the other roles here: the padded forward (packed: test_reward_model.py)
    )

    out: dict = {"outputs_on_cpu": {}}
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, 200, (4, 6), generator=g)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": prompt_ids,
            "attention_mask": torch.ones_like(prompt_ids),
            "position_ids": torch.arange(6).expand(4, 6).clone(),
        },
        meta_info={"eos_token_id": [2], "pad_token_id": 0, "global_steps": 1},
    )
    gen = actor.generate_sequences(prompts)
    out["outputs_on_cpu"]["generate_sequences"] = _on_cpu(gen)
    batch = DataProto.from_dict(
        tensors={
            k: gen.batch[k]
            for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
        meta_info={"global_steps": 1, "global_batch_size": 4},
    )
    batch.batch["token_level_rewards"] = torch.randn(4, 4, generator=g) * batch.batch["response_mask"]
    old = actor.compute_log_prob(batch)
    ref_lp = ref.compute_ref_log_prob(batch)
    scores = rm.compute_rm_score(batch)
    values = critic.compute_values(batch)
    batch.union(old.select(batch_keys=["old_log_probs"], meta_info_keys=[]))
    batch.union(ref_lp)
    adv = critic.compute_advantage(batch, values)
    critic_metrics = critic.update_critic(batch, adv)
    actor_metrics = actor.update_actor(batch, adv)
    for name, result in {
        "compute_log_prob": old,
        "compute_ref_log_prob": ref_lp,
        "compute_rm_score": scores,
        "compute_values": values,
        "compute_advantage": adv,
    }.items():
        out["outputs_on_cpu"][name] = _on_cpu(result)
    out["metrics"] = {**critic_metrics.meta_info["metrics"], **actor_metrics.meta_info["metrics"]}
    out["input_untouched"] = _on_cpu(batch)  # the caller's batch is not moved under its feet
    out["models_stay_lazy"] = all(_params_on(w.module, LAZY) for w in (actor, ref, critic, rm))
    # reward_model.model.fsdp_config.param_offload: weights in host memory, on the device only to score
    rm.module.to("cpu")
    rm.offload = True
    offloaded = rm.compute_rm_score(batch)
    out["rm_offload"] = {
        "params_on_cpu_after": _params_on(rm.module, "cpu"),
        "scores_equal": torch.allclose(offloaded.batch["rm_scores"], scores.batch["rm_scores"], atol=1e-6),
        "output_on_cpu": _on_cpu(offloaded),
    }
    out["advantages"] = adv.batch["advantages"]
    return out


@pytest.mark.timeout(600)
def test_every_data_method_moves_its_batch_to_the_worker_device_once():
    out = spawn_workers(_worker, 1)[0]
    assert out["outputs_on_cpu"] == {name: True for name in out["outputs_on_cpu"]}
    assert set(out["outputs_on_cpu"]) == {
        "generate_sequences",
        "compute_log_prob",
        "compute_ref_log_prob",
        "compute_rm_score",
        "compute_values",
        "compute_advantage",
    }
    assert out["input_untouched"] and out["models_stay_lazy"]
    assert out["rm_offload"] == {"params_on_cpu_after": True, "scores_equal": True, "output_on_cpu": True}
    metrics = out["metrics"]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert np.isfinite(metrics[key]), key
    # GAE advantages whitened over the batch's valid tokens: mean 0 (scale 1)
    assert abs(metrics["critic/advantages/mean"]) < 1e-4
