"""Every accepted config key is read by the code or refused by validation (nothing accepted and ignored).

Two real runs (PPO with every role and most options on, then GRPO) record which keys rlflow code reads, in
the driver and in every worker (`rlflow.config.reads`, ``RLFLOW_TRACK_CONFIG_READS=1``); the vLLM engine
options are read by the function that maps them to ``vllm.LLM`` (no vLLM here). Every schema key must be
read, refused (a non-default value raises ``ValueError`` naming it), or read while composing the config.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlflow.config import load_config, to_typed, validate_config
from rlflow.config.global_sizes import GLOBAL_MICRO_BATCH_KEYS
from rlflow.config.reads import ENV_VAR, config_reads
from rlflow.config.schema import PPOTrainerConfig
from rlflow.trainer.main_ppo import build_tracker, build_trainer
from tests.tiny_reward_model import save_tiny_reward_model

REFUSED = {
    "actor_rollout_ref.actor.router_replay.record_file": "/tmp/routing.pt",
    "actor_rollout_ref.actor.router_replay.replay_file": "/tmp/routing.pt",
    "reward_model.reward_manager": "batch",
    "reward_model.reward_kwargs.max_resp_len": 8,  # (appended with '+') the naive manager takes none
    "data.custom_options.cis": 1,  # (appended with '+') read by a custom dataset class, refused without one
    "reward_model.launch_reward_fn_async": True,
    "actor_rollout_ref.rollout.mode": "server",
    "actor_rollout_ref.rollout.data_parallel_size": 2,
    **{
        f"{role}.fsdp_config.offload_policy": True
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    },
    **{
        f"{role}.fsdp_config.wrap_policy.min_num_params": 100
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    },
    "actor_rollout_ref.actor.checkpoint.async_save": True,
    "critic.checkpoint.async_save": True,
    "actor_rollout_ref.rollout.expert_parallel_size": 2,
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.multi_turn.format": "llama3_json",
    "trainer.use_legacy_worker_impl": "enable",
    "reward_model.inference.name": "vllm",
    "reward_model.inference.tensor_model_parallel_size": 2,
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "triton",
    "actor_rollout_ref.hybrid_engine": False,
    "data.continuous_token.custom_builder_module": "my.builder",  # verl's builder classes
    "actor_rollout_ref.actor.qat.activation_observer": "minmax",  # verl's w4a4 only (refused)
    "actor_rollout_ref.actor.qat.quantization_config_path": "/tmp/quant.json",  # verl's vLLM config
    "actor_rollout_ref.actor.fsdp_config.grad_offload": True,
    "critic.fsdp_config.grad_offload": True,
    # MTP speculative decoding in the rollout engine (refused) and its draft settings
    "actor_rollout_ref.model.mtp.enable_rollout": True,
    "actor_rollout_ref.model.mtp.method": "eagle",
    "actor_rollout_ref.model.mtp.num_speculative_tokens": 2,
    "actor_rollout_ref.model.mtp.speculative_algorithm": "NEXTN",
    "actor_rollout_ref.model.mtp.speculative_eagle_topk": 2,
    "actor_rollout_ref.model.mtp.speculative_num_draft_tokens": 8,
    "actor_rollout_ref.model.mtp.speculative_num_steps": 2,
}
"""Keys kept for verl compatibility whose other values rlflow refuses, with such a value."""

READ_ON_RESUME = {
    f"{role}.checkpoint.load_contents": "read by the worker's load_checkpoint (a resume: tests/trainer/test_e2e.py)"
    for role in ("actor_rollout_ref.actor", "critic")
}
"""Keys this test's runs (which save, never resume) cannot reach."""

READ_WHILE_COMPOSING = {
    **{
        key: "verl's global micro-batch size, turned into the *_per_gpu key before the config is typed"
        for key in GLOBAL_MICRO_BATCH_KEYS
    },
    "critic.config_path": "names the critic file merged into the config before it is typed",
    "data.task": "selects the embedded task files, filled in before the config is typed",
}

ADVANTAGE = """
def centred(token_level_rewards, response_mask, values, index, config, **kwargs):
    scores = (token_level_rewards * response_mask).sum(-1, keepdim=True)
    return (scores - scores.mean()) * response_mask, scores * response_mask
"""

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str[:1] == ground_truth[:1]) + bonus
"""


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        tp = f.type if isinstance(f.type, type) else None
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) or (tp is not None and dataclasses.is_dataclass(tp)):
            keys += _leaf_keys(type(default) if default is not None else tp, path)
        else:
            keys.append(path)
    return keys


def _interpolation_sources(reads: set[str]) -> set[str]:
    """Keys whose value another key follows (``${a.b}``) count as read when that key is read."""
    tree = OmegaConf.to_container(load_config([], config_name="demo_two_ranks"), resolve=False)
    out: set[str] = set()

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(value, path)
            elif isinstance(value, str) and value.startswith("${") and value.endswith("}") and path in reads:
                out.add(value[2:-1])

    walk(tree, "")
    return out


def _run_and_collect(overrides: list[str]) -> set[str]:
    trainer = build_trainer(load_config(overrides, config_name="demo_two_ranks"))
    trainer.tracker = build_tracker(trainer.config)  # the labelled typed config, as run_ppo does
    try:
        trainer.fit()
        trainer.tracker.finish()
        reads = set(config_reads())
        for group in trainer.groups.all():
            for rank_reads in group.execute_fn(lambda worker: config_reads()):
                reads |= rank_reads
    finally:
        trainer.shutdown()
    return reads


def _common(tmp_path: Path, name: str) -> list[str]:
    return [
        "trainer.total_training_steps=2",
        "trainer.logger=[jsonl]",
        f"trainer.log_dir={tmp_path / name}",
        f"trainer.default_local_dir={tmp_path / name / 'ckpt'}",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_every_key_is_read_or_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    advantage = tmp_path / "adv.py"
    advantage.write_text(ADVANTAGE)
    ppo = [
        *_common(tmp_path, "ppo"),
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        "trainer.max_actor_ckpt_to_keep=1",
        "trainer.max_critic_ckpt_to_keep=1",
        f"trainer.default_hdfs_dir={tmp_path / 'copies'}",
        f"trainer.validation_data_dir={tmp_path / 'gens'}",
        "data.val_batch_size=64",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.model.use_fused_kernels=true",  # actor and reference, entropy in the loss
        "actor_rollout_ref.ref.sync_ref_model=true",  # then the checkpoint at step 2 holds ref/ too
        "actor_rollout_ref.ref.ref_model_sync_steps=1",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "reward_model.enable=true",
        f"reward_model.model.path={save_tiny_reward_model(tmp_path / 'rm')}",
        "reward_model.num_workers=1",
        "reward_model.timeout_s=30",
        "+critic.model.override_config.attention_dropout=0.0",
        f"custom_reward_function.path={reward}",
        "+custom_reward_function.reward_kwargs.bonus=0.5",
        f"algorithm.custom_advantage_function.path={advantage}",
        "algorithm.custom_advantage_function.name=centred",
        "trainer.profile_steps=[2]",  # every role's profile keys are read on a profiled step
        "critic.profile_ranks=[0]",
    ]
    reads = _run_and_collect(ppo)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # MLflow's file store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    grpo = [
        *[o for o in _common(tmp_path, "grpo") if not o.startswith("trainer.logger=")],
        "trainer.logger=[jsonl,mlflow]",
        "trainer.log_system_metrics=true",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score",
        "algorithm.use_pf_ppo=true",
        "algorithm.pf_ppo.reweight_method=max_random",
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "trainer.log_val_generations=2",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        "algorithm.rollout_correction.rollout_rs=token",
        "algorithm.rollout_correction.rollout_rs_threshold=3.0",
        "algorithm.rollout_correction.rollout_rs_threshold_lower=0.2",
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
        "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",  # its two keys
    ]
    reads |= _run_and_collect(grpo)
    import mlflow

    SYS = "system/cpu_utilization_percentage"
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("rlflow").experiment_id])
    assert run.data.params["algorithm/adv_estimator"] == "grpo"
    steps = {
        k: [m.step for m in client.get_metric_history(run.info.run_id, k)] for k in ("actor/pg_loss", SYS)
    }
    assert steps == {"actor/pg_loss": [1, 2], SYS: [0, 1, 2]}  # step 0: the validation before training

    from rlflow.rollout.vllm import vllm_engine_kwargs

    typed = to_typed(load_config([], config_name="demo_two_ranks"))  # labelled: tracking is on
    vllm_engine_kwargs(typed.actor_rollout_ref.rollout, "model")  # the vLLM-only keys
    from rlflow.algos.cov_losses import select_cov_tokens

    ones = torch.ones(2, 3)  # Clip-Cov's keys (the runs above use vanilla and KL-Cov)
    select_cov_tokens("clip_cov", ones, -ones, -ones, ones, typed.actor_rollout_ref.actor)
    from rlflow.algos.pg_variants import compute_policy_loss_sapo

    compute_policy_loss_sapo(ones, ones, ones, ones, "token-mean", typed.actor_rollout_ref.actor)  # tau_*
    reads |= config_reads()
    reads |= _interpolation_sources(reads)

    refused = set()
    for key, value in REFUSED.items():
        section = key.removesuffix(".max_resp_len").removesuffix(
            ".cis"
        )  # a free-form section's key: appended
        override = f"{'+' if section != key else ''}{key}={value}".replace("True", "true")
        with pytest.raises(ValueError, match=section.replace(".", r"\.")):
            validate_config(load_config([override], config_name="demo_two_ranks"))
        refused.add(section)
    unread = sorted(
        set(_leaf_keys(PPOTrainerConfig)) - reads - refused - set(READ_WHILE_COMPOSING) - set(READ_ON_RESUME)
    )
    assert not unread, f"accepted config keys that no code read and validation does not refuse: {unread}"
