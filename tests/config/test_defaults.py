"""The two shipped starting points: ``ppo_trainer.yaml`` (the schema, with verl's defaults) and ``demo.yaml``
(the embedded CPU demo's own values on top of it)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlflow.config import PPOTrainerConfig, load_config, need_critic, need_reference_policy, validate_config
from tests.config.keys import ACTOR, HEADS, ROLLOUT

# verl's defaults (its ``ppo_trainer.yaml``) for the keys both have: rlflow's base config keeps them.
VERL_DEFAULTS = {
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "data.dataloader_num_workers": 8,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.use_remove_padding": True,
    f"{ACTOR}.ppo_mini_batch_size": 256,
    f"{ACTOR}.ppo_max_token_len_per_gpu": 16384,
    f"{ACTOR}.clip_ratio": 0.2,
    f"{ACTOR}.entropy_coeff": 0.0,
    f"{ACTOR}.kl_loss_coef": 0.001,
    f"{ACTOR}.kl_loss_type": "low_var_kl",
    f"{ACTOR}.optim.lr": 1e-6,
    f"{ACTOR}.optim.weight_decay": 0.01,
    f"{ACTOR}.optim.lr_warmup_steps": -1,
    f"{ROLLOUT}.mode": "async",
    f"{ROLLOUT}.temperature": 1.0,
    f"{ROLLOUT}.gpu_memory_utilization": 0.5,
    f"{ROLLOUT}.val_kwargs.temperature": 0.0,
    "critic.optim.lr": 1e-5,
    "critic.optim.weight_decay": 0.01,
    "critic.model.enable_gradient_checkpointing": True,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.cliprange_value": 0.5,
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.val_before_train": True,
    "trainer.critic_warmup": 0,
}

# What config/demo.yaml sets for the embedded CPU demo (README main job, learning tests, baselines).
DEMO_VALUES = {
    "data.max_prompt_length": 32,
    "data.max_response_length": 8,
    "data.train_batch_size": 16,
    "data.filter_overlong_prompts": True,
    "data.dataloader_num_workers": 0,
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    f"{ACTOR}.ppo_mini_batch_size": 4,
    f"{ACTOR}.use_dynamic_bsz": True,
    f"{ACTOR}.optim.lr": 1e-4,
    f"{ACTOR}.optim.weight_decay": 0.0,
    "critic.model.enable_gradient_checkpointing": False,
    "critic.optim.lr": 1e-3,
    "critic.optim.weight_decay": 0.0,
    "trainer.experiment_name": "tiny_ppo",
    "trainer.n_gpus_per_node": 1,
    "trainer.cpus_per_worker": None,
    "trainer.total_epochs": 1000,
    "trainer.total_training_steps": 100,
    "trainer.test_freq": 10,
    "trainer.cpu_linear_kernel": "aten",
}


def _leaves(cfg, prefix: str = "") -> dict:
    """Leaf key path → value, interpolations unresolved (so ``${...}`` strings compare as written)."""
    out = {}
    for key in cfg:
        node = cfg._get_node(key)
        if OmegaConf.is_dict(node):
            out.update(_leaves(node, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = node._value()
    return out


def test_the_base_config_is_the_schema_with_verls_defaults():
    cfg = load_config()
    # The YAML and the dataclass defaults are one tree (the YAML only adds comments).
    assert cfg == OmegaConf.structured(PPOTrainerConfig)
    assert OmegaConf.get_type(cfg.critic).__name__ == "CriticConfig"
    leaves = _leaves(cfg)
    assert {key: leaves[key] for key in VERL_DEFAULTS} == VERL_DEFAULTS
    # Where rlflow keeps its own default (docs/migrating_from_verl.md, "Defaults that differ"):
    assert leaves[f"{ROLLOUT}.name"] == "hf" and leaves["trainer.device"] == "auto"
    assert list(cfg.trainer.logger) == ["console", "jsonl"]
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    assert cfg.algorithm.adv_estimator == "gae" and cfg.custom_reward_function.name == "compute_score"
    assert cfg.algorithm.custom_advantage_function.name is None
    assert cfg.algorithm.rollout_correction.bypass_mode is None  # verl: false
    assert need_critic(cfg) and not need_reference_policy(cfg)


def test_the_demo_config_changes_exactly_its_own_keys():
    base, demo = _leaves(load_config()), _leaves(load_config(config_name="demo"))
    changed = {key: demo[key] for key in demo if demo[key] != base[key]}
    assert changed == DEMO_VALUES
    assert sorted(demo) == sorted(base)
    assert demo["data.task"] == "repeat" and demo["data.train_files"] is None


def test_the_two_rank_demo_is_the_demo_in_its_earlier_layout():
    demo, two = _leaves(load_config(config_name="demo")), _leaves(load_config(config_name="demo_two_ranks"))
    assert {key: two[key] for key in two if two[key] != demo[key]} == {
        "trainer.n_gpus_per_node": 2,
        "trainer.cpus_per_worker": 1.0,
        f"{ACTOR}.use_dynamic_bsz": False,
        f"{ACTOR}.ppo_max_token_len_per_gpu": 2048,
        "critic.ppo_max_token_len_per_gpu": 2048,
    }


def test_verls_defaults_on_this_machine_say_how_to_run_the_demo():
    cfg = load_config(["ray_init.num_cpus=2"])
    with pytest.raises(ValueError, match=r"8 × 1 = 8 CPUs.*--config-name demo") as err:
        validate_config(cfg, **HEADS)
    assert "trainer.n_gpus_per_node" in str(err.value)
    validate_config(load_config(["ray_init.address=ray://head:10001"]), **HEADS)  # a cluster: Ray places them


def test_cpus_per_worker_null_shares_the_cpus_evenly_among_the_ranks(monkeypatch):
    """The demo's ``cpus_per_worker: null``: the local Ray's CPUs / (nnodes × n_gpus_per_node), at least 1;
    the placement group fits exactly, and more ranks than CPUs are refused as with an explicit 1."""
    import ray

    from rlflow.config import to_typed
    from rlflow.trainer.worker_groups import cpus_per_worker

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # no running Ray: ray_init.num_cpus counts
    for ranks, cpus, share in ((1, 2, 2.0), (2, 2, 1.0), (1, 6, 6.0), (2, 5, 2.5)):
        cfg = load_config(
            [f"trainer.n_gpus_per_node={ranks}", f"ray_init.num_cpus={cpus}"], config_name="demo"
        )
        validate_config(cfg, **HEADS)
        assert cpus_per_worker(to_typed(cfg)) == share
    cfg = load_config(["trainer.n_gpus_per_node=4", "ray_init.num_cpus=2"], config_name="demo")
    with pytest.raises(ValueError, match=r"4 × 1 = 4 CPUs for the placement group, but the local Ray has 2"):
        validate_config(cfg, **HEADS)
    explicit = load_config(["trainer.cpus_per_worker=0.5", "ray_init.num_cpus=2"], config_name="demo")
    assert cpus_per_worker(to_typed(explicit)) == 0.5
    with pytest.raises(ValueError, match=r"trainer.cpus_per_worker=0.0 must be > 0"):
        validate_config(load_config(["trainer.cpus_per_worker=0"], config_name="demo"), **HEADS)
