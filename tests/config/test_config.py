"""The trainer config's validation: each error names its key (fast: no Ray, no model). Composition and the
critic config file: test_composition.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlflow.config import (
    PPOTrainerConfig,
    load_config,
    validate_config,
)
from tests.config.keys import ACTOR, HEADS, ROLLOUT

REWARD_PY = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)

NOT_CALLABLE = 3
"""

ADVANTAGE_PY = """
def my_advantage(token_level_rewards, response_mask, values, index, config, **kwargs):
    return token_level_rewards, token_level_rewards
"""


@pytest.fixture
def user_files(tmp_path: Path) -> dict[str, str]:
    """Files the parametrized cases refer to as ``{name}``."""
    (tmp_path / "reward.py").write_text(REWARD_PY)
    (tmp_path / "advantage.py").write_text(ADVANTAGE_PY)
    (tmp_path / "train.parquet").write_bytes(b"")
    (tmp_path / "ckpt").mkdir()
    return {
        "reward": str(tmp_path / "reward.py"),
        "advantage": str(tmp_path / "advantage.py"),
        "train": str(tmp_path / "train.parquet"),
        "ckpt": str(tmp_path / "ckpt"),
        "missing": str(tmp_path / "missing.parquet"),
    }


# --------------------------------------------------------------------------- validation

D = ACTOR  # short alias in the table below
C = "critic"

BAD_CONFIGS = [
    # keys appended with '+' that no code reads
    (["+trainer.foo=1"], {}, "trainer.foo is not a config key (appended with '+'?)"),
    (["+critic.optim.bar=[1]"], {}, "critic.optim.bar is not a config key"),
    # world size and critic world size
    (["trainer.n_gpus_per_node=0"], {}, "trainer.n_gpus_per_node=0 must be >= 1"),
    (["trainer.nnodes=0"], {}, "trainer.nnodes=0 must be >= 1"),
    (["critic.world_size=3"], {}, "critic.world_size=3 must be <= the actor world size 2"),
    (["critic.world_size=0"], {}, "critic.world_size=0 must be >= 1"),
    # what the vLLM rollout cannot do
    ([f"{ROLLOUT}.name=vllm", "trainer.device=cpu"], {}, f"{ROLLOUT}.name=vllm with trainer.device=cpu"),
    (
        [f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.tensor_model_parallel_size=2"],
        {},
        f"{ROLLOUT}.tensor_model_parallel_size=2: the vLLM rollout runs one engine per actor rank",
    ),
    # checkpoint contents (verl's save_contents / load_contents)
    (
        [f"{D}.checkpoint.save_contents=[optimizer,extra]"],
        {},
        f"{D}.checkpoint.save_contents=['optimizer', 'extra'] lacks 'model': every checkpoint holds",
    ),
    (["critic.checkpoint.load_contents=[model,optimizer,extra,tokenizer]"], {}, "['tokenizer'] not among"),
    (
        [f"{D}.checkpoint.load_contents=[optimizer]"],
        {},
        "lacks 'model': every checkpoint holds and restores the model",
    ),
    (
        ["critic.checkpoint.async_save=true"],
        {},
        "critic.checkpoint.async_save=true: rlflow saves checkpoints",
    ),
    (
        [f"{ROLLOUT}.data_parallel_size=2"],
        {},
        f"{ROLLOUT}.data_parallel_size=2: each actor rank runs its own engine",
    ),
    ([f"{ROLLOUT}.expert_parallel_size=8"], {}, f"{ROLLOUT}.expert_parallel_size=8: rlflow shards models"),
    (
        [f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.calculate_log_probs=true", f"{ROLLOUT}.top_p=0.9"],
        {},
        f"{ROLLOUT}.calculate_log_probs=true with top_k/top_p on",
    ),
    # batch divisibility, actor
    (["data.train_batch_size=15"], {}, "data.train_batch_size=15 × actor_rollout_ref.rollout.n=1 = 15"),
    ([f"{D}.ppo_mini_batch_size=32"], {}, f"{D}.ppo_mini_batch_size=32 must be <= data.train_batch_size=16"),
    (
        [f"{D}.ppo_mini_batch_size=6"],
        {},
        f"{D}.ppo_mini_batch_size=6 must be <= data.train_batch_size=16 and",
    ),
    ([f"{D}.ppo_mini_batch_size=1"], {}, f"{D}.ppo_mini_batch_size=1 × {ROLLOUT}.n=1 = 1 responses"),
    (
        [f"{D}.ppo_mini_batch_size=16", f"{D}.ppo_micro_batch_size_per_gpu=3"],
        {},
        f"{D}.ppo_micro_batch_size_per_gpu=3 must divide the 8",
    ),
    (
        [f"{D}.use_dynamic_bsz=true", f"{D}.ppo_max_token_len_per_gpu=16"],
        {},
        f"{D}.ppo_max_token_len_per_gpu=16 (× ulysses size 1) must be >= the longest sequence",
    ),
    # batch divisibility, critic (dp 4 while the actor has dp 2)
    (
        [
            "trainer.n_gpus_per_node=4",
            f"{D}.ulysses_sequence_parallel_size=2",
            "data.train_batch_size=2",
            f"{D}.ppo_mini_batch_size=2",
            f"{D}.ppo_micro_batch_size_per_gpu=1",
        ],
        {},
        "data.train_batch_size=2 × actor_rollout_ref.rollout.n=1 = 2 responses must be divisible by the "
        "data-parallel size 4 of critic",
    ),
    (
        [f"{D}.ppo_mini_batch_size=16", f"{C}.ppo_micro_batch_size_per_gpu=3"],
        {},
        f"{C}.ppo_micro_batch_size_per_gpu=3 must divide the 8",
    ),
    ([f"{C}.ppo_mini_batch_size=1"], {}, f"{C}.ppo_mini_batch_size=1 × {ROLLOUT}.n=1"),
    # Ulysses sizes, fsdp sizes
    (
        [f"{D}.ulysses_sequence_parallel_size=3"],
        {},
        f"{D}.ulysses_sequence_parallel_size=3 must divide the world",
    ),
    ([f"{D}.ulysses_sequence_parallel_size=2"], {"num_attention_heads": 3}, "num_attention_heads=3"),
    (
        [f"{D}.ulysses_sequence_parallel_size=2"],
        {"num_key_value_heads": 3},
        f"{D}.ulysses_sequence_parallel_size=2 must divide the model's num_key_value_heads=3",
    ),
    ([f"{C}.ulysses_sequence_parallel_size=3"], {}, f"{C}.ulysses_sequence_parallel_size=3 must divide"),
    ([f"{C}.ulysses_sequence_parallel_size=2"], {"num_attention_heads": 5}, f"{C}.ulysses_sequence_parallel"),
    ([f"{D}.fsdp_config.fsdp_size=3"], {}, f"{D}.fsdp_config.fsdp_size=3 must divide the world size 2"),
    (
        [f"{D}.fsdp_config.mixed_precision.param_dtype=fp8"],
        {},
        f"{D}.fsdp_config.mixed_precision.param_dtype",
    ),
    # known names
    ([f"{D}.loss_agg_mode=token-sum"], {}, f"{D}.loss_agg_mode='token-sum' is not one of"),
    ([f"{C}.loss_agg_mode=token-sum"], {}, f"{C}.loss_agg_mode='token-sum'"),
    (["algorithm.adv_estimator=ppo"], {}, "algorithm.adv_estimator='ppo' is not one of"),
    (["algorithm.kl_penalty=kl2"], {}, "algorithm.kl_penalty='kl2' is not a KL estimator"),
    ([f"{D}.use_kl_loss=true", f"{D}.kl_loss_type=full"], {}, f"{D}.kl_loss_type='full'"),
    (["algorithm.kl_ctrl.type=pid"], {}, "algorithm.kl_ctrl.type='pid'"),
    (
        ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0"],
        {},
        "algorithm.kl_ctrl.target_kl=0",
    ),
    ([f"{D}.optim.warmup_style=linear"], {}, f"{D}.optim.warmup_style='linear'"),
    ([f"{C}.optim.warmup_style=linear"], {}, f"{C}.optim.warmup_style='linear'"),
    ([f"{D}.strategy=ddp"], {}, f"{D}.strategy='ddp' is not one of ['fsdp', 'fsdp2']"),
    ([f"{C}.strategy=ddp"], {}, f"{C}.strategy='ddp'"),
    ([f"{D}.policy_loss.loss_mode=magic"], {}, f"{D}.policy_loss.loss_mode='magic'"),
    ([f"{ROLLOUT}.name=sglang"], {}, f"{ROLLOUT}.name='sglang' is not one of"),
    (["data.truncation=cut"], {}, "data.truncation='cut' is not one of"),
    (["data.task=chess"], {}, "data.task='chess'"),
    (["trainer.resume_mode=latest"], {}, "trainer.resume_mode='latest'"),
    (["trainer.logger=[console,clearml]"], {}, "trainer.logger[1]='clearml'"),
    (
        ["actor_rollout_ref.model.attn_implementation=flash"],
        {},
        "actor_rollout_ref.model.attn_implementation",
    ),
    # the critic: needed iff gae
    (["critic.enable=false"], {}, "critic.enable=false but algorithm.adv_estimator=gae needs a critic"),
    (
        ["algorithm.adv_estimator=grpo", "trainer.critic_warmup=2"],
        {},
        "trainer.critic_warmup=2 needs a critic",
    ),
    # numbers
    (["trainer.critic_warmup=-1"], {}, "trainer.critic_warmup=-1 must be >= 0"),
    (["trainer.total_training_steps=0"], {}, "trainer.total_training_steps=0 must be >= 1"),
    (["trainer.total_epochs=0"], {}, "trainer.total_epochs=0 must be >= 1"),
    (["trainer.save_freq=0"], {}, "trainer.save_freq=0 must be -1 (never) or >= 1"),
    ([f"{D}.optim.lr=0"], {}, f"{D}.optim.lr=0.0 must be > 0"),
    ([f"{C}.optim.lr=-1e-4"], {}, f"{C}.optim.lr=-0.0001 must be > 0"),
    ([f"{D}.optim.betas=[0.9,1.0]"], {}, f"{D}.optim.betas[1]=1.0 must be in [0.0, 1.0)"),
    ([f"{D}.clip_ratio=0"], {}, f"{D}.clip_ratio=0.0 must be > 0"),
    ([f"{D}.clip_ratio_low=1.5"], {}, f"{D}.clip_ratio_low=1.5 must be < 1"),
    ([f"{D}.clip_ratio_high=-0.1"], {}, f"{D}.clip_ratio_high=-0.1 must be > 0"),
    ([f"{D}.clip_ratio_c=1.0"], {}, f"{D}.clip_ratio_c=1.0 must be > 1"),
    ([f"{C}.cliprange_value=0"], {}, f"{C}.cliprange_value=0.0 must be > 0"),
    (
        [f"{ROLLOUT}.temperature=0"],
        {},
        f"{ROLLOUT}.temperature=0.0 must be > 0 when {ROLLOUT}.do_sample=true",
    ),
    ([f"{ROLLOUT}.val_kwargs.do_sample=true"], {}, f"{ROLLOUT}.val_kwargs.temperature=0.0 must be > 0"),
    ([f"{ROLLOUT}.top_p=0"], {}, f"{ROLLOUT}.top_p=0.0 must be in (0, 1]"),
    ([f"{ROLLOUT}.n=0"], {}, f"{ROLLOUT}.n=0 must be >= 1"),
    (
        [f"{ROLLOUT}.n=2", f"{ROLLOUT}.do_sample=false", f"{ROLLOUT}.temperature=0"],
        {},
        f"{ROLLOUT}.n=2 with {ROLLOUT}.do_sample=false",
    ),
    ([f"{ROLLOUT}.top_k=-2"], {}, f"{ROLLOUT}.top_k=-2 must be >= -1"),
    ([f"{ROLLOUT}.response_length=0"], {}, f"{ROLLOUT}.response_length=0 must be >= 1"),
    ([f"{ROLLOUT}.micro_batch_size=0"], {}, f"{ROLLOUT}.micro_batch_size=0 must be >= 1"),
    ([f"{ROLLOUT}.val_kwargs.n=0"], {}, f"{ROLLOUT}.val_kwargs.n=0 must be >= 1"),
    (
        [f"{ACTOR}.optim.lr_scheduler_type=linear"],
        {},
        f"{ACTOR}.optim.lr_scheduler_type='linear' is not one of",
    ),
    (
        [f"{ACTOR}.optim.warmup_style=cosine", f"{ACTOR}.optim.lr_scheduler_type=constant"],
        {},
        f"{ACTOR}.optim.lr_scheduler_type='constant' and {ACTOR}.optim.warmup_style='cosine' disagree",
    ),
    ([f"{ACTOR}.optim.num_cycles=0"], {}, f"{ACTOR}.optim.num_cycles=0.0 must be > 0"),
    ([f"{ACTOR}.tis_imp_ratio_cap=0"], {}, f"{ACTOR}.tis_imp_ratio_cap=0.0 must be -1 (off) or > 0"),
    ([f"{ACTOR}.tis_imp_ratio_cap=2"], {}, f"{ACTOR}.tis_imp_ratio_cap=2.0 needs the rollout's log-probs"),
    # algorithm.rollout_correction
    (
        ["algorithm.rollout_correction.rollout_is=token"],
        {},
        "algorithm.rollout_correction.rollout_is needs the rollout's log-probs",
    ),
    (
        ["algorithm.rollout_correction.bypass_mode=true"],
        {},
        "algorithm.rollout_correction.bypass_mode needs the rollout's log-probs",
    ),
    (
        ["algorithm.rollout_correction.rollout_token_veto_threshold=1e-4"],
        {},
        "algorithm.rollout_correction.rollout_token_veto_threshold needs the rollout's log-probs",
    ),
    (
        ["algorithm.rollout_correction.rollout_is=seq"],
        {},
        "algorithm.rollout_correction.rollout_is='seq' is not one of ['token', 'sequence'] or null",
    ),
    (
        ["algorithm.rollout_correction.rollout_rs=mask"],
        {},
        "algorithm.rollout_correction.rollout_rs='mask' is not one of",
    ),
    (
        ["algorithm.rollout_correction.rollout_is_threshold=0"],
        {},
        "algorithm.rollout_correction.rollout_is_threshold=0.0 must be > 0",
    ),
    (
        [
            "algorithm.rollout_correction.rollout_rs=token",
            "algorithm.rollout_correction.rollout_rs_threshold=1.5",
            "algorithm.rollout_correction.rollout_rs_threshold_lower=2.0",
        ],
        {},
        "algorithm.rollout_correction.rollout_rs_threshold_lower=2.0 must be below the upper bound 1.5",
    ),
    (
        ["algorithm.rollout_correction.rollout_token_veto_threshold=2"],
        {},
        "algorithm.rollout_correction.rollout_token_veto_threshold=2.0 must be in (0, 1)",
    ),
    (
        ["algorithm.rollout_correction.use_policy_gradient=true", f"{ROLLOUT}.calculate_log_probs=true"],
        {},
        "use_policy_gradient=true is the policy-gradient loss of bypass mode (verl reads it only then): set "
        "algorithm.rollout_correction.bypass_mode=true",
    ),
    *[
        (
            [
                "algorithm.rollout_correction.use_policy_gradient=true",
                "algorithm.rollout_correction.bypass_mode=true",
                f"{ROLLOUT}.calculate_log_probs=true",
                extra,
            ],
            {},
            message,
        )
        for extra, message in [
            (
                "algorithm.rollout_correction.rollout_is_batch_normalize=true",
                "so algorithm.rollout_correction.rollout_is_batch_normalize=true would normalise them by a "
                "micro-batch's mean",
            ),
            (
                f"{ACTOR}.policy_loss.loss_mode=gspo",
                "replaces the policy loss by REINFORCE, so actor_rollout_ref.actor.policy_loss.loss_mode='gspo' "
                "would be ignored",
            ),
            (
                f"{ACTOR}.tis_imp_ratio_cap=2",
                "and actor_rollout_ref.actor.tis_imp_ratio_cap=2.0 both weight the policy loss",
            ),
        ]
    ],
    (
        [
            "algorithm.rollout_correction.rollout_is=token",
            f"{ROLLOUT}.calculate_log_probs=true",
            f"{ACTOR}.tis_imp_ratio_cap=2",
        ],
        {},
        "both weight the policy loss: keep one",
    ),
    ([f"{ROLLOUT}.prompt_length=16"], {}, f"{ROLLOUT}.prompt_length=16 must be >= data.max_prompt_length=32"),
    (["algorithm.gamma=1.5"], {}, "algorithm.gamma=1.5 must be in [0.0, 1.0]"),
    (["reward_model.enable=true"], {}, "reward_model.model.path must be set"),
    # files and user code
    (["data.train_files={missing}"], {}, "data.train_files: no such file '{missing}'"),
    (["data.val_files=[{train},{missing}]"], {}, "data.val_files[1]: no such file '{missing}'"),
    (["actor_rollout_ref.model.path={missing}"], {}, "actor_rollout_ref.model.path='{missing}'"),
    (["critic.model.path={missing}"], {}, "critic.model.path='{missing}'"),
    (["trainer.resume_mode=resume_path"], {}, "trainer.resume_from_path must be set"),
    (
        ["trainer.resume_mode=resume_path", "trainer.resume_from_path={missing}"],
        {},
        "trainer.resume_from_path='{missing}': no such directory",
    ),
    (["custom_reward_function.path={missing}"], {}, "custom_reward_function"),
    # LoRA on the actor
    (["actor_rollout_ref.model.lora_rank=-1"], {}, "actor_rollout_ref.model.lora_rank=-1 must be >= 0"),
    (
        ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=0"],
        {},
        "actor_rollout_ref.model.lora_alpha=0.0 must be > 0",
    ),
    (
        ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[]"],
        {},
        "actor_rollout_ref.model.target_modules=[] must be all-linear, a non-empty list",
    ),
    (
        ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.exclude_modules=all-linear"],
        {},
        "actor_rollout_ref.model.exclude_modules='all-linear': give module-name suffixes",
    ),
    (
        ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.ref.sync_ref_model=true"],
        {},
        "actor_rollout_ref.ref.sync_ref_model=true with LoRA adapters on the actor "
        "(actor_rollout_ref.model.lora_rank=8)",
    ),
    (  # an existing path that is not the policy's tokenizer (it was accepted, and the driver used it)
        ["data.tokenizer={train}"],
        {},
        "data.tokenizer='{train}': the prompts must be tokenized with the policy's tokenizer",
    ),
    # the tiled MLP
    (
        ["actor_rollout_ref.model.tiled_mlp.num_shards=0"],
        {},
        "actor_rollout_ref.model.tiled_mlp.num_shards=0 must be >= 1",
    ),
    (["critic.model.tiled_mlp.num_shards=-1"], {}, "critic.model.tiled_mlp.num_shards=-1 must be >= 1"),
    # LoRA on the critic
    (["critic.model.lora_rank=-2"], {}, "critic.model.lora_rank=-2 must be >= 0"),
    (
        ["critic.model.lora_rank=8", "critic.model.lora_alpha=-1"],
        {},
        "critic.model.lora_alpha=-1.0 must be > 0",
    ),
    (
        ["critic.model.lora_rank=8", "critic.model.target_modules=''"],
        {},
        "critic.model.target_modules='': give module-name suffixes",
    ),
    (
        ["custom_reward_function.path={reward}", "custom_reward_function.name=nope"],
        {},
        "custom_reward_function",
    ),
    (
        ["custom_reward_function.path={reward}", "custom_reward_function.name=NOT_CALLABLE"],
        {},
        "not callable",
    ),
    (
        ["algorithm.custom_advantage_function.path={advantage}"],
        {},
        "algorithm.custom_advantage_function.path and algorithm.custom_advantage_function.name must be set",
    ),
    (["algorithm.custom_advantage_function.name=f"], {}, "must be set together"),
    (
        ["algorithm.custom_advantage_function.path={missing}", "algorithm.custom_advantage_function.name=f"],
        {},
        "algorithm.custom_advantage_function.path",
    ),
    (
        [
            "algorithm.custom_advantage_function.path={advantage}",
            "algorithm.custom_advantage_function.name=f",
        ],
        {},
        "algorithm.custom_advantage_function.name",
    ),
]


@pytest.mark.parametrize(("overrides", "heads", "message"), BAD_CONFIGS, ids=lambda v: None)
def test_validation_error_names_the_key(user_files, overrides, heads, message):
    cfg = load_config([o.format(**user_files) for o in overrides], config_name="demo_two_ranks")
    with pytest.raises(ValueError, match=re.escape(message.format(**user_files))):
        validate_config(cfg, **{**HEADS, **heads})


def test_optional_flag_takes_bools_and_null_and_says_what_null_means():

    from rlflow.config.checks import optional_flag

    cfg = OmegaConf.create({"critic": {"enable": None, "on": True, "bad": "sometimes"}})
    assert optional_flag(cfg, "critic.enable") is None and optional_flag(cfg, "critic.on") is True
    with pytest.raises(
        ValueError, match=re.escape("critic.bad='sometimes' must be true, false or null (null: auto)")
    ):
        optional_flag(cfg, "critic.bad", "auto")


GOOD_CONFIGS = [
    [f"{D}.use_dynamic_bsz=true", f"{D}.ppo_micro_batch_size_per_gpu=3"],  # micro size unused
    [f"{ROLLOUT}.temperature=0", f"{ROLLOUT}.do_sample=false"],
    ["trainer.total_training_steps=null", "critic.world_size=1"],
    ["algorithm.adv_estimator=grpo", f"{ROLLOUT}.n=4", f"{C}.ppo_micro_batch_size_per_gpu=3"],  # no critic
    [f"{D}.ulysses_sequence_parallel_size=2", f"{D}.ppo_micro_batch_size_per_gpu=16"],  # dp 1: 16 per rank
    # critic SP 4 > 2 kv heads: each kv head is repeated
    [
        "trainer.n_gpus_per_node=4",
        "ray_init.num_cpus=4",
        f"{D}.ppo_micro_batch_size_per_gpu=4",
        f"{C}.ulysses_sequence_parallel_size=4",
    ],
    [
        "data.train_files={train}",
        "data.val_files=[{train}]",
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path={ckpt}",
    ],
    ["custom_reward_function.path={reward}"],
    [
        "algorithm.custom_advantage_function.path={advantage}",
        "algorithm.custom_advantage_function.name=my_advantage",
    ],
    ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"],  # a hub id is not checked on disk
    [f"{D}.use_kl_loss=true", f"{D}.kl_loss_type=k3+", "algorithm.kl_penalty=low_var_kl"],
    # vLLM: top-k sampling without rollout log-probs; rollout log-probs without truncation
    [f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.top_k=20"],
    [f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.calculate_log_probs=true"],
    # verl's rollout-correction presets
    [
        f"{ROLLOUT}.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_rs=sequence",
    ],
    [
        f"{ROLLOUT}.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_rs=geometric",
        "algorithm.rollout_correction.rollout_rs_threshold=1.001",
        "algorithm.rollout_correction.rollout_rs_threshold_lower=0.999",
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
    ],
    [
        f"{ROLLOUT}.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.bypass_mode=true",
    ],
    [  # verl's pg_is / pg_rs presets: REINFORCE in bypass mode
        f"{ROLLOUT}.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.use_policy_gradient=true",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_rs=geometric",
        "algorithm.rollout_correction.rollout_rs_threshold=1.001",
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
    ],
]


@pytest.mark.parametrize("overrides", GOOD_CONFIGS, ids=lambda v: None)
def test_valid_configs_pass(user_files, overrides):
    validate_config(
        load_config([o.format(**user_files) for o in overrides], config_name="demo_two_ranks"), **HEADS
    )


def test_registered_estimator_names_are_accepted(monkeypatch: pytest.MonkeyPatch):
    core_algos = pytest.importorskip("rlflow.trainer.ppo.core_algos")
    cfg = load_config(["algorithm.adv_estimator=my_est"], config_name="demo_two_ranks")
    with pytest.raises(ValueError, match=re.escape("algorithm.adv_estimator='my_est'")):
        validate_config(cfg)
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "my_est", lambda **kw: None)
    validate_config(cfg)


def test_cuda_device_needs_local_gpus(monkeypatch: pytest.MonkeyPatch):
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(
        ValueError,
        match=re.escape("trainer.device=cuda with trainer.nnodes × trainer.n_gpus_per_node = 2 ranks"),
    ):
        validate_config(load_config(["trainer.device=cuda"], config_name="demo_two_ranks"))
    validate_config(
        load_config(["trainer.device=cuda", "ray_init.address=auto"], config_name="demo_two_ranks")
    )  # a remote cluster


def test_validate_accepts_a_dataclass_and_raises_no_assert():
    good = PPOTrainerConfig()
    good.ray_init.address = "ray://head:10001"  # verl's 8 ranks: as on a cluster
    validate_config(good, **HEADS)
    bad = PPOTrainerConfig()
    bad.trainer.critic_warmup = -3
    with pytest.raises(ValueError, match=re.escape("trainer.critic_warmup=-3")):
        validate_config(bad)


def test_remax_validates_now_that_the_trainer_generates_baselines():
    cfg = load_config(["algorithm.adv_estimator=remax", f"{ROLLOUT}.n=2"], config_name="demo_two_ranks")
    validate_config(cfg, num_attention_heads=4, num_key_value_heads=2)


def test_greedy_validation_with_several_responses_is_accepted_with_a_warning(
    caplog: pytest.LogCaptureFixture,
):
    # verl's DeepSeek-V4 example validates with val_kwargs.n=16 and do_sample left false: wasteful, not wrong
    # (training with n > 1 and no sampling stays refused: every group's advantages would be 0)
    cfg = load_config([f"{ROLLOUT}.val_kwargs.n=4"], config_name="demo_two_ranks")
    with caplog.at_level("WARNING", logger="rlflow.config.rollout_checks"):
        validate_config(cfg, **HEADS)
    assert f"{ROLLOUT}.val_kwargs.n=4 with {ROLLOUT}.val_kwargs.do_sample=false" in caplog.text
    assert "identical" in caplog.text
