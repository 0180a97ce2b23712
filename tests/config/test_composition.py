"""Composition of every shipped YAML, the interpolations that follow the actor, and the critic config file
(fast: no Ray, no model). Validation errors: test_config.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from rlflow.config import (
    apply_critic_config_file,
    config_dir,
    load_config,
    need_critic,
    need_reference_policy,
    update_is_on_policy,
    validate_config,
)
from rlflow.config.loading import load_sft_config
from rlflow.config.sft_validate import validate_sft_config
from tests.config.keys import ACTOR, HEADS, ROLLOUT

# --------------------------------------------------------------------------- composition


def _shipped_yamls() -> list[Path]:
    return sorted(config_dir().rglob("*.yaml"))


def test_config_dir_holds_the_main_config():
    assert (config_dir() / "ppo_trainer.yaml").is_file()
    assert config_dir().is_absolute()


@pytest.mark.parametrize("path", _shipped_yamls(), ids=lambda p: str(p.relative_to(config_dir())))
def test_every_shipped_yaml_composes(path: Path):
    """Top-level YAMLs compose as configs; examples/critic_*.yaml apply as critic config files."""
    rel = path.relative_to(config_dir())
    if rel == Path("sft_trainer.yaml"):
        sft = load_sft_config()
        OmegaConf.to_container(sft, resolve=True)
        validate_sft_config(sft)
        return
    if rel.parent == Path("."):
        # verl's defaults ask for 8 ranks: validated as on a cluster (the local-resource check is tested below)
        cfg = load_config(["ray_init.address=ray://head:10001"], config_name=path.stem)
    elif rel.parent == Path("examples") and rel.name.startswith("critic_"):
        cfg = load_config(
            [f"critic.config_path={rel}", "trainer.n_gpus_per_node=2"], config_name="demo_two_ranks"
        )
        assert cfg.critic.config_path == str(path)
    else:
        pytest.fail(f"shipped YAML {rel} is not covered by this test: add its kind here")
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    validate_config(cfg, **HEADS)


def test_grpo_composes_without_critic():
    cfg = load_config(["algorithm.adv_estimator=grpo"], config_name="demo_two_ranks")
    validate_config(cfg, **HEADS)
    assert not need_critic(cfg)
    assert need_critic(
        load_config(["algorithm.adv_estimator=grpo", "critic.enable=true"], config_name="demo_two_ranks")
    )
    assert need_reference_policy(load_config([f"{ACTOR}.use_kl_loss=true"], config_name="demo_two_ranks"))


@pytest.mark.parametrize(
    ("overrides", "on_policy"),
    [
        ([], False),  # 4 mini-batches of the 16 prompts
        ([f"{ACTOR}.ppo_mini_batch_size=16"], True),
        ([f"{ACTOR}.ppo_mini_batch_size=16", f"{ACTOR}.ppo_epochs=2"], False),
        ([f"{ACTOR}.ppo_mini_batch_size=16", "algorithm.use_kl_in_reward=true"], False),  # the KL reads them
        ([f"{ACTOR}.ppo_mini_batch_size=16", f"{ROLLOUT}.calculate_log_probs=true"], False),
    ],
)
def test_on_policy_rule_for_skipping_the_old_log_prob_pass(overrides, on_policy):
    assert update_is_on_policy(load_config(overrides, config_name="demo_two_ranks")) is on_policy


def test_interpolations_follow_the_actor():
    cfg = load_config(
        [
            "actor_rollout_ref.model.path='rlflow://tiny?seed=3'",  # quoted: the value holds '='
            f"{ACTOR}.ppo_mini_batch_size=8",
            f"{ACTOR}.use_dynamic_bsz=true",
            "data.max_response_length=12",
            "trainer.experiment_name=exp",
        ],
        config_name="demo_two_ranks",
    )
    assert cfg.critic.model.path == "rlflow://tiny?seed=3"
    assert cfg.critic.ppo_mini_batch_size == 8
    assert cfg.critic.use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.rollout.response_length == 12
    assert cfg.critic.forward_micro_batch_size_per_gpu == 8  # follows critic.ppo_micro_batch_size_per_gpu
    assert cfg.trainer.default_local_dir == "checkpoints/rlflow/exp"
    # An explicit value breaks the link.
    assert load_config(["critic.model.path=/x"], config_name="demo_two_ranks").critic.model.path == "/x"


def test_load_config_inside_a_hydra_app_keeps_the_app_hydra():
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        app_hydra = GlobalHydra.instance().hydra
        cfg = load_config(["data.train_batch_size=8"], config_name="demo_two_ranks")
        assert GlobalHydra.instance().hydra is app_hydra
    assert cfg.data.train_batch_size == 8


# --------------------------------------------------------------------------- critic config file


def test_critic_config_file_overrides_the_critic_group(tmp_path: Path):
    path = tmp_path / "critic.yaml"
    path.write_text("world_size: 1\nulysses_sequence_parallel_size: 1\noptim:\n  lr: 2.0e-4\n")
    cfg = load_config(
        [f"critic.config_path={path}", "critic.optim.lr=0.5", "critic.grad_clip=0.25"],
        config_name="demo_two_ranks",
    )
    assert cfg.critic.world_size == 1
    assert cfg.critic.optim.lr == pytest.approx(2.0e-4, abs=0)  # the file wins over the command line
    assert cfg.critic.grad_clip == pytest.approx(0.25, abs=0)  # untouched by the file
    assert cfg.critic.optim.warmup_style == "constant"  # a nested merge, not a replacement
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1.0e-4, abs=0)
    assert apply_critic_config_file(cfg) == cfg  # idempotent


def test_example_critic_file_gives_a_different_layout():
    cfg = load_config(["critic.config_path=examples/critic_sp2.yaml"], config_name="demo_two_ranks")
    assert cfg.critic.ulysses_sequence_parallel_size == 2
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 1
    assert cfg.critic.use_dynamic_bsz is True and cfg.actor_rollout_ref.actor.use_dynamic_bsz is False
    assert cfg.critic.forward_max_token_len_per_gpu == 256  # interpolation follows the file's value


def test_critic_config_file_relative_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "mine.yaml").write_text("cliprange_value: 0.2\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(["critic.config_path=mine.yaml"], config_name="demo_two_ranks")
    assert cfg.critic.cliprange_value == pytest.approx(0.2, abs=0)
    assert cfg.critic.config_path == str(tmp_path / "mine.yaml")


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("ulysses_sequence_paralel_size: 2\n", "unknown key 'critic.ulysses_sequence_paralel_size'"),
        ("optim:\n  lrr: 1.0\n", "unknown key 'critic.optim.lrr'"),
        ("ppo_epochs: many\n", "bad value for 'critic.ppo_epochs'"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("config_path: other.yaml\n", "sets critic.config_path itself"),
    ],
)
def test_critic_config_file_errors_name_file_and_key(tmp_path: Path, content: str, pattern: str):
    path = tmp_path / "bad_critic.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(pattern)) as info:
        load_config([f"critic.config_path={path}"], config_name="demo_two_ranks")
    assert str(path) in str(info.value) and "critic.config_path" in str(info.value)


def test_missing_critic_config_file(tmp_path: Path):
    with pytest.raises(ValueError, match=r"critic\.config_path='nope\.yaml': no such file"):
        load_config(["critic.config_path=nope.yaml"], config_name="demo_two_ranks")
