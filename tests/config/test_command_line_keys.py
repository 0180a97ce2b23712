"""Command-line keys: unknown ones refused before composition with the closest keys, wrong types at
composition, and verl's spellings rewritten to rlflow's (fast: no Ray, no model)."""

from __future__ import annotations

import re

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from rlflow.config import PPOTrainerConfig, load_config, validate_config
from rlflow.config.suggest import check_override_keys
from tests.config.keys import ACTOR


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.nnode=2", "unknown config key 'trainer.nnode' (did you mean 'trainer.nnodes'?)"),
        ("critic.optim.lrr=1.0", "unknown config key 'critic.optim.lrr' (did you mean 'critic.optim.lr'"),
        # a key typed under the wrong section: the keys that end the same way come first
        ("critic.sharding.param_offload=true", "(did you mean 'critic.fsdp_config.param_offload' or"),
        (
            "trainer.quantum_entanglement_factor=300",
            "unknown config key 'trainer.quantum_entanglement_factor' — every key",
        ),
    ],
)
def test_unknown_override_key_is_refused_with_the_closest_keys(override: str, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config([override], config_name="demo_two_ranks")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.rollout.quantization=torchao", "null or fp8 (verl's FP8 rollout"),
        (
            "reward_model.sandbox_fusion_url=ftp://x",  # verl's older key of reward_model.sandbox_fusion.url
            "reward_model.sandbox_fusion.url='ftp://x' must be an http:// or https:// URL",
        ),
        (
            "actor_rollout_ref.model.lora_adapter_path=/adapter",
            "actor_rollout_ref.model.lora_adapter_path='/adapter': not a PEFT adapter directory",
        ),
        (
            "actor_rollout_ref.rollout.load_format=nonsense",
            "actor_rollout_ref.rollout.load_format='nonsense' must be one of",
        ),
        (
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 x",  # world 2 (Megatron's rule)
        ),
        (
            "actor_rollout_ref.ref.fsdp_config.offload_policy=true",
            "offload_policy=true without actor_rollout_ref.ref.fsdp_config.param_offload=true",
        ),
        (
            "actor_rollout_ref.ref.fsdp_config.fsdp_size=3",
            "ref.fsdp_config.fsdp_size=3 must divide the world",
        ),
        (
            "critic.fsdp_config.model_dtype=fp16",
            "critic.fsdp_config.model_dtype='fp16': the weights the role keeps (and its optimizer updates)",
        ),
        (
            "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1000000",
            "size-based wrapping is not supported",
        ),
        (
            "critic.fsdp_config.offload_policy=true",
            "critic.fsdp_config.offload_policy=true without critic.fsdp_config.param_offload=true",
        ),
        ("trainer.npu_profile.options.depth=2", "not an option of verl's NPU profiler section"),
        ("data.trust_remote_code=true", "set it to true as well"),  # the workers' switch is the model's
        ("+data.sampling_ratios=[0.5,0.5]", "per-file sampling ratios are not supported"),
        ("reward_model.strategy=fsdp", "the reward model runs as one full copy per rank"),
        (
            "actor_rollout_ref.ref.strategy=fsdp",
            "actor_rollout_ref.ref.strategy='fsdp': the reference shards like",
        ),
    ],
)
def test_verl_keys_rlflow_lacks_are_refused_with_what_to_do(override: str, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_config(load_config([override], config_name="demo_two_ranks"))


def test_more_verl_spellings_are_aliases():
    cfg = load_config(
        [
            "actor_rollout_ref.actor.optim.clip_grad=0.3",
            "critic.optim.clip_grad=0.7",
            "trainer.val_generations_to_log_to_wandb=3",
            "+data.enable_thinking=False",
            "actor_rollout_ref.ref.strategy=fsdp2",  # the actor's: accepted
            "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
            "actor_rollout_ref.ref.param_offload=true",
            "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",  # rlflow's only path: dropped
            "actor_rollout_ref.ref.entropy_checkpointing=false",
            "actor_rollout_ref.ref.fsdp_config.fsdp_size=1",  # the reference's own sharding (HSDP here)
            "actor_rollout_ref.ref.fsdp_config.reshard_after_forward=false",
            "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params=0",
            "actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer]",
            "actor_rollout_ref.model.use_shm=true",  # load / sync speed-ups of verl: dropped, logged
            "critic.model.use_shm=false",
            "actor_rollout_ref.rollout.layered_summon=true",
            "actor_rollout_ref.rollout.multi_stage_wake_up=true",  # SGLang's staged wake-up: dropped
            "actor_rollout_ref.rollout.load_format=safetensors",
            "trainer.logger=console",  # one name: verl's tracker wraps it in a list
        ],
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    assert list(cfg.trainer.logger) == ["console"]
    assert list(load_config(["trainer.logger='jsonl'"], config_name="demo_two_ranks").trainer.logger) == [
        "jsonl"
    ]
    assert "use_shm" not in cfg.actor_rollout_ref.model and "load_format" not in cfg.actor_rollout_ref.rollout
    assert "multi_stage_wake_up" not in cfg.actor_rollout_ref.rollout
    assert (cfg.actor_rollout_ref.actor.grad_clip, cfg.critic.grad_clip) == (0.3, 0.7)
    assert cfg.trainer.log_val_generations == 3
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert cfg.actor_rollout_ref.ref.fsdp_config.forward_prefetch is True  # follows the actor's
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    from rlflow.config.loading import to_typed
    from rlflow.workers.role_setup import ref_layout

    ref = ref_layout(to_typed(cfg)).fsdp
    assert (ref.fsdp_size, ref.reshard_after_forward, ref.forward_prefetch) == (1, False, True)
    with pytest.raises(ValueError, match="entropy_checkpointing"):
        load_config(["actor_rollout_ref.actor.entropy_checkpointing=maybe"], config_name="demo_two_ranks")


@pytest.mark.parametrize("role", ["actor_rollout_ref.actor", "critic"])
def test_megatron_strategy_on_the_command_line_runs_fsdp2(role: str):
    """verl's Megatron scripts (tests/config/test_megatron_layout.py has their other keys)."""
    cfg = load_config([f"{role}.strategy=megatron"], config_name="demo_two_ranks")
    assert OmegaConf.select(cfg, f"{role}.strategy") == "fsdp2"


def test_override_key_check_lets_valid_forms_through():
    # verl spellings (rewritten first), free-form sections, hydra keys, '+'/'~' forms and flags
    load_config(
        [
            "critic.model.fsdp_config.param_offload=true",
            "hydra.run.dir=/tmp/x",
            "+custom_reward_function.reward_kwargs.bonus=0.5",
            "data.train_batch_size=8",
        ],
        config_name="demo_two_ranks",
    )
    check_override_keys(["--cfg", "job", "~trainer.logger"], PPOTrainerConfig)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.nnodes=abc", "trainer.nnodes"),
        (f"{ACTOR}.use_dynamic_bsz=maybe", f"{ACTOR}.use_dynamic_bsz"),
    ],
)
def test_wrong_type_fails_at_composition(override: str, key: str):
    with pytest.raises(ConfigCompositionException, match=re.escape(key)):
        load_config([override], config_name="demo_two_ranks")


def test_command_line_refuses_an_unknown_key_before_anything_starts():
    import subprocess
    import sys

    for module, override, meant in [
        ("rlflow.trainer.main_ppo", "trainer.total_epoch=3", "'trainer.total_epochs'"),
        ("rlflow.trainer.main_sft", "optim.lrr=1", "'optim.lr'"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", module, override], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode != 0
        assert f"unknown config key {override.split('=')[0]!r} (did you mean {meant}" in proc.stderr, (
            proc.stderr
        )


def test_verl_use_gpg_loss_flag_stands_for_the_gpg_loss_mode():
    assert (
        load_config(
            [f"{ACTOR}.use_gpg_loss=True"], config_name="demo_two_ranks"
        ).actor_rollout_ref.actor.policy_loss.loss_mode
        == "gpg"
    )
    assert (
        load_config(
            [f"{ACTOR}.use_gpg_loss=false"], config_name="demo_two_ranks"
        ).actor_rollout_ref.actor.policy_loss.loss_mode
        == "vanilla"
    )
    with pytest.raises(
        ValueError, match=r"use_gpg_loss=True means .*loss_mode=gpg.*also sets .*loss_mode=gspo"
    ):
        load_config(
            [f"{ACTOR}.use_gpg_loss=True", f"{ACTOR}.policy_loss.loss_mode=gspo"],
            config_name="demo_two_ranks",
        )
    with pytest.raises(ValueError, match="expected true or false"):
        load_config([f"{ACTOR}.use_gpg_loss=maybe"], config_name="demo_two_ranks")


def test_verl_key_aliases_are_rewritten(tmp_path):
    from rlflow.config.aliases import rewrite_critic_file_keys, rewrite_overrides

    assert rewrite_overrides(
        [
            "critic.model.fsdp_config.param_offload=true",
            "+critic.model.fsdp_config.fsdp_size=2",
            "critic.model.path=x",  # not an alias: the critic's model keys stay
            "--cfg",
            "job",
        ]
    ) == [
        "critic.fsdp_config.param_offload=true",
        "+critic.fsdp_config.fsdp_size=2",
        "critic.model.path=x",
        "--cfg",
        "job",
    ]
    cfg = load_config(["critic.model.fsdp_config.optimizer_offload=true"], config_name="demo_two_ranks")
    assert cfg.critic.fsdp_config.optimizer_offload is True
    # newer verl's spellings (critic engine config, reward-model engine, Ray options), and older verl's
    cfg = load_config(
        [
            "critic.fsdp.param_offload=true",
            "reward_model.rollout.prompt_length=64",
            "reward_model.model_path=/rm",
            "ray_kwargs.ray_init.num_cpus=3",
            "trainer.use_legacy_worker_impl=False",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
            "reward_model.model.use_rmpad=False",
        ],
        config_name="demo_two_ranks",
    )
    assert cfg.actor_rollout_ref.rollout.update_weights_bucket_megabytes == 64
    assert cfg.reward_model.model.use_remove_padding is False
    assert cfg.critic.fsdp_config.param_offload is True and cfg.reward_model.inference.prompt_length == 64
    assert cfg.reward_model.model.path == "/rm" and cfg.ray_init.num_cpus == 3
    assert rewrite_overrides(["critic.fsdp_config.fsdp_size=2"]) == ["critic.fsdp_config.fsdp_size=2"]
    validate_config(load_config(["trainer.use_legacy_worker_impl=False"], config_name="demo_two_ranks"))
    assert rewrite_critic_file_keys(
        {"model": {"fsdp_config": {"param_offload": True}, "path": "p"}, "world_size": 1}
    ) == {
        "model": {"path": "p"},
        "fsdp_config": {"param_offload": True},
        "world_size": 1,
    }
    path = tmp_path / "critic.yaml"
    path.write_text("model:\n  fsdp_config:\n    param_offload: true\n")
    assert (
        load_config(
            [f"critic.config_path={path}"], config_name="demo_two_ranks"
        ).critic.fsdp_config.param_offload
        is True
    )


def test_append_on_a_key_the_config_has_is_the_plain_assignment():
    """Older verl scripts append keys verl added later (``+trainer.val_before_train=False``); Hydra's ``+``
    fails on an existing key, so rlflow applies it as ``key=value``. Under a free-form section the ``+``
    stays (it adds an entry there)."""
    from rlflow.config.schema import PPOTrainerConfig
    from rlflow.config.suggest import drop_append_on_known_keys

    overrides = [
        "+trainer.val_before_train=False",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "++trainer.test_freq=3",
        "~trainer.resume_path",
    ]
    assert drop_append_on_known_keys(overrides, PPOTrainerConfig) == [
        "trainer.val_before_train=False",
        *overrides[1:],
    ]
    cfg = load_config(overrides[:3], config_name="demo_two_ranks")
    assert cfg.trainer.val_before_train is False and cfg.trainer.test_freq == 3
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.0


def test_early_verl_kl_sections_set_the_coefficients_and_their_switches():
    """verl's early-2025 ``actor.kl_loss.{type,coef}`` and ``algorithm.in_reward_kl.{type,coef,kl_ctrl}``
    had no on/off switch (coefficient 0 = off): the switches follow the coefficients."""
    cfg = load_config(
        [
            "actor_rollout_ref.actor.kl_loss.type=low_var_kl",
            "actor_rollout_ref.actor.kl_loss.coef=0.001",
            "algorithm.in_reward_kl.type=kl",
            "algorithm.in_reward_kl.kl_ctrl.type=fixed",
            "algorithm.in_reward_kl.coef=0",
        ],
        config_name="demo_two_ranks",
    )
    actor, algorithm = cfg.actor_rollout_ref.actor, cfg.algorithm
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.001 and actor.kl_loss_type == "low_var_kl"
    assert algorithm.use_kl_in_reward is False and algorithm.kl_ctrl.kl_coef == 0
    assert algorithm.kl_penalty == "kl" and algorithm.kl_ctrl.type == "fixed"
    on = load_config(["algorithm.in_reward_kl.coef=0.05"], config_name="demo_two_ranks").algorithm
    assert on.use_kl_in_reward is True and on.kl_ctrl.kl_coef == 0.05
    with pytest.raises(ValueError, match="expected a number"):
        load_config(["algorithm.in_reward_kl.coef=high"], config_name="demo_two_ranks")


def test_nccl_timeout_sets_each_roles_process_group_timeout():
    """verl's ``actor_rollout_ref.nccl_timeout`` (seconds) reaches the actor's and the reference's
    process groups, and the critic's unless ``critic.nccl_timeout`` is set (the timeout itself reaching
    ``init_process_group``: tests/parallel/test_spawn.py)."""
    from rlflow.config.loading import to_typed
    from rlflow.workers.role_setup import actor_layout, critic_layout, ref_layout

    cfg = load_config(["actor_rollout_ref.nccl_timeout=1200"], config_name="demo_two_ranks")
    validate_config(cfg)
    cfg = to_typed(cfg)
    assert [f(cfg).timeout_s for f in (actor_layout, ref_layout, critic_layout)] == [1200, 1200, 1200]
    cfg = to_typed(load_config(["critic.nccl_timeout=45"], config_name="demo_two_ranks"))
    assert [f(cfg).timeout_s for f in (actor_layout, ref_layout, critic_layout)] == [600, 600, 45]
    for key in ("actor_rollout_ref.nccl_timeout", "critic.nccl_timeout"):
        with pytest.raises(ValueError, match=re.escape(key)):
            validate_config(load_config([f"{key}=0"], config_name="demo_two_ranks"))


def test_verls_newer_reward_section_and_engine_strategy_are_aliases(tmp_path):
    """verl's ``reward.*`` section (its reward manager, kwargs, score function, pool, sandbox and reward
    model) and the engine config's ``fsdp_config.strategy`` / ``ulysses_sequence_parallel_size`` land on
    rlflow's keys."""
    score = tmp_path / "score.py"
    score.write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    cfg = load_config(
        [
            "reward.reward_manager.name=dapo",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward.reward_kwargs.overlong_buffer_cfg.len=2",
            "reward.custom_reward_function.path=" + str(score),
            "reward.custom_reward_function.name=my_score",
            "reward.num_workers=2",
            "reward.sandbox_fusion.max_concurrent=8",
            "reward.reward_model.enable=False",
            "reward.reward_model.rollout.name=hf",
            "reward.reward_manager.source=register",  # the off values of what rlflow lacks: dropped
            "reward.reward_model.enable_resource_pool=False",
            "reward.compute_score_kwargs={}",
            "reward.reward_manager.module.path=null",
            "reward.reward_model.n_gpus_per_node=8",
            "actor_rollout_ref.actor.fsdp_config.strategy=fsdp",
            "actor_rollout_ref.ref.fsdp_config.strategy=fsdp",
            "critic.model.fsdp_config.strategy=fsdp",
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
            "critic.model.fsdp_config.ulysses_sequence_parallel_size=2",
        ],
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    rm = cfg.reward_model
    assert (rm.reward_manager, rm.reward_kwargs.overlong_buffer_cfg.len, rm.num_workers) == ("dapo", 2, 2)
    assert (rm.sandbox_fusion.max_concurrent, rm.enable, rm.inference.name) == (8, False, "hf")
    assert (cfg.custom_reward_function.path, cfg.custom_reward_function.name) == (str(score), "my_score")
    assert (
        cfg.actor_rollout_ref.actor.strategy
        == cfg.actor_rollout_ref.ref.strategy
        == cfg.critic.strategy
        == "fsdp"
    )
    assert "strategy" not in cfg.critic.fsdp_config
    assert (
        cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size
        == cfg.critic.ulysses_sequence_parallel_size
        == 2
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.reward_manager.source=importlib", "register it with rlflow.reward.register_reward_manager"),
        ("reward.reward_model.enable_resource_pool=true", "shares the placement group"),
        ("reward.compute_score_kwargs={method:flexible}", "wrap the scorer"),
    ],
)
def test_verls_newer_reward_switches_rlflow_lacks_are_refused(override, message):
    key = override.split("=", 1)[0]
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}=.*{re.escape(message)}"):
        load_config([override], config_name="demo_two_ranks")


def test_verls_rollout_correction_loss_type_names_the_policy_gradient_switch():
    for value, flag in (("reinforce", True), ("ppo_clip", False)):
        cfg = load_config([f"algorithm.rollout_correction.loss_type={value}"], config_name="demo_two_ranks")
        assert cfg.algorithm.rollout_correction.use_policy_gradient is flag
    with pytest.raises(ValueError, match=r"^algorithm\.rollout_correction\.loss_type='pg' must be one of"):
        load_config(["algorithm.rollout_correction.loss_type=pg"], config_name="demo_two_ranks")


def test_verls_offload_policy_is_accepted_beside_param_offload():
    """verl's scripts set FSDP2's offload_policy together with param_offload, rlflow's switch for it."""
    cfg = load_config(
        [
            "actor_rollout_ref.actor.fsdp_config.offload_policy=True",
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "actor_rollout_ref.ref.fsdp_config.offload_policy=False",
            "actor_rollout_ref.ref.fsdp_config.param_offload=False",
        ],
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is True


def test_more_of_verls_current_script_spellings():
    """``+actor.policy_loss.tau_*`` (a SAPO script), vLLM's ``+rollout.enable_sleep_mode`` and FSDP1's
    ``use_orig_params`` (either value: FSDP1's flat and original parameters give the same AdamW updates;
    rlflow keeps the original ones), vLLM's ``quantization`` at its off value (null; fp8 refused)."""
    cfg = load_config(
        [
            "+actor_rollout_ref.actor.policy_loss.tau_pos=0.9",
            "+actor_rollout_ref.actor.policy_loss.tau_neg=1.2",
            "+actor_rollout_ref.rollout.enable_sleep_mode=False",
            "actor_rollout_ref.actor.fsdp_config.use_orig_params=True",
            "critic.model.fsdp_config.use_orig_params=true",
            "actor_rollout_ref.ref.fsdp_config.optimizer_offload=True",  # no optimizer: dropped
        ],
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    actor = cfg.actor_rollout_ref.actor
    assert (actor.tau_pos, actor.tau_neg, cfg.actor_rollout_ref.rollout.free_cache_engine) == (
        0.9,
        1.2,
        False,
    )
    validate_config(
        load_config(
            [
                "actor_rollout_ref.ref.fsdp_config.use_orig_params=false",  # verl's default
                "actor_rollout_ref.actor.fsdp_config.use_orig_params=False",
                "actor_rollout_ref.rollout.quantization=null",
                "actor_rollout_ref.rollout.quantization_config_file=null",
            ],
            config_name="demo_two_ranks",
        )
    )
    # verl's FP8 rollout is a key of rlflow's ('+' accepted), a quantization config file is not
    assert (
        load_config(["+actor_rollout_ref.rollout.quantization=fp8"], config_name="demo_two_ranks")[
            "actor_rollout_ref"
        ]["rollout"]["quantization"]
        == "fp8"
    )
    with pytest.raises(
        ValueError,
        match=r"^actor_rollout_ref\.rollout\.quantization_config_file='q\.json': a quantization config",
    ):
        load_config(
            ["+actor_rollout_ref.rollout.quantization_config_file=q.json"], config_name="demo_two_ranks"
        )


def test_verls_prefix_tree_trainer_v1_and_vision_keys():
    """verl's prefix-tree packing is rlflow's shared-prompt packing (the same log-probs, a prompt's samples
    sharing one copy of it); its kernel, the V1 trainer switch and the vision patch size are dropped."""
    cfg = load_config(
        [
            "actor_rollout_ref.model.use_prefix_tree=True",
            "actor_rollout_ref.model.prefix_tree_attention=magi",
            "trainer.use_v1=False",
            "trainer.v1.trainer_mode=sync",
            "data.image_patch_size=16",
            "+data.continuous_token.enable=False",
            "trainer.balance_keep_minibatch=True",
        ],
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    assert cfg.actor_rollout_ref.model.use_shared_prompts is True
    assert cfg.trainer.balance_keep_minibatch is True
    assert cfg.data.continuous_token.enable is False  # a key of rlflow's (tests/data/test_prompt_builders.py)
    for override, message in (
        ("trainer.v1.trainer_mode=colocate_async", "verl's asynchronous trainers"),
        ("actor_rollout_ref.model.prefix_tree_attention=sdpa", "must be one of ['flex', 'magi']"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            load_config([override], config_name="demo_two_ranks")
    with pytest.raises(
        ValueError, match=re.escape("use_prefix_tree=True means actor_rollout_ref.model.use_shared")
    ):
        load_config(
            [
                "actor_rollout_ref.model.use_shared_prompts=false",
                "actor_rollout_ref.model.use_prefix_tree=True",
            ]
        )
