"""verl's example command lines run on rlflow with only environment edits.

The override lists are in `tests/trainer/verl_scripts/`, one file per trainer family (facts: each script's
keys and values, the edits the environment dictates marked ``# env``). Every list composes and passes every pre-Ray check; one script
per trainer family (PPO, GRPO, REINFORCE++, RLOO, ReMax, GPG, GMPO, DAPO, verl's Megatron scripts and its VeOmni
engine) runs 2 steps
(``trainer.total_training_steps=2`` added) and shows the metrics that family is about.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.config import load_config
from rlflow.trainer.main_ppo import prepare_config, run_ppo
from tests.tiny_hybrid_model import save_tiny_hybrid_model
from tests.tiny_moe_model import save_tiny_moe_model
from tests.tiny_reward_model import save_tiny_reward_model

from . import verl_scripts
from .verl_scripts import (
    DAPO_7B_MATH,
    DEEPSEEK7B_SP2,
    GMPO_QWEN3_8B,
    GPG_QWEN2_7B_MATH,
    GRPO_MISTRAL31_24B,
    GRPO_NEMOTRON_35_LIGHTNING_MEGATRON,
    GRPO_QWEN2_7B_MATH_MEGATRON,
    GRPO_QWEN2_7B_SEQ_BALANCE,
    GRPO_QWEN3_8B_NPU,
    GRPO_QWEN3_VL_30B_FSDP2,
    GRPO_QWEN3_VL_30B_MEGATRON,
    PPO_MOONLIGHT16B_A3B_MEGATRON,
    PPO_QWEN2_7B_RM_SEQ_BALANCE_FUSED,
    PPO_QWEN3_30B_VEOMNI,
    REINFORCE_PP_QWEN2_7B_MATH,
    REMAX_QWEN25_3B_SEQ_BALANCE,
    RLOO_QWEN2_7B,
    SAPO_QWEN3_30B,
)

PORTS = {name: value for name, value in vars(verl_scripts).items() if name.isupper()}


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory) -> str:
    """A tiny sequence-classification reward model with the policy's tokenizer (the RM script's model)."""
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory) -> str:
    """A tiny mixture-of-experts causal LM (the Megatron MoE scripts' model)."""
    return save_tiny_moe_model(tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def hybrid_model_dir(tmp_path_factory) -> str:
    """A tiny Nemotron-H (Mamba, attention, MoE layers) with a multi-token-prediction layer in its checkpoint."""
    return save_tiny_hybrid_model(tmp_path_factory.mktemp("hybrid"), with_mtp=True)


def _environment(
    overrides: list[str], reward_model_dir: str, moe_model_dir: str = "", hybrid_model_dir: str = ""
) -> list[str]:
    return [
        o.replace("{reward_model_dir}", reward_model_dir)
        .replace("{moe_model_dir}", moe_model_dir)
        .replace("{hybrid_model_dir}", hybrid_model_dir)
        for o in overrides
    ]


def _config_name(name: str) -> str:
    """verl's Megatron scripts name its Megatron config (``--config-name ppo_megatron_trainer``)."""
    return "ppo_megatron_trainer" if name.endswith("_MEGATRON") else "ppo_trainer"


@pytest.mark.parametrize("name", sorted(PORTS))
def test_port_composes_and_passes_every_check(name, reward_model_dir, moe_model_dir, hybrid_model_dir):
    overrides = _environment(PORTS[name], reward_model_dir, moe_model_dir, hybrid_model_dir)
    cfg = load_config(overrides, config_name=_config_name(name))
    prepare_config(cfg, build_warm_start=False)


def test_verls_async_rollout_mode_is_accepted_and_logged():
    """verl's default ``rollout.mode=async`` (and the older ``sync``) compose and validate; the trainer's
    log says which mode runs and that it is rlflow's single-turn engine. Other values are refused."""
    from rlflow.config import to_typed
    from rlflow.trainer.main_ppo import rollout_summary

    for mode, said in (("async", "served-engine mode"), ("sync", "one engine call per batch")):
        cfg = prepare_config(
            load_config([*GRPO_QWEN2_7B_SEQ_BALANCE, f"actor_rollout_ref.rollout.mode={mode}"]),
            build_warm_start=False,
        )
        line = rollout_summary(to_typed(cfg))
        assert f"mode={mode}" in line and said in line and "n=5" in line
    with pytest.raises(ValueError, match=r"rollout\.mode='server': expected one of \['sync', 'async'\]"):
        prepare_config(
            load_config([*GRPO_QWEN2_7B_SEQ_BALANCE, "actor_rollout_ref.rollout.mode=server"]),
            build_warm_start=False,
        )


def _steps(history: list[dict]) -> list[dict]:
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    return steps


def _local(tmp_path) -> list[str]:
    return [
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        f"trainer.log_dir={tmp_path / 'logs'}",
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_deepseek7b_llm_sp2_runs_two_steps(tmp_path):
    cfg = load_config([*DEEPSEEK7B_SP2, *_local(tmp_path)])
    assert cfg.critic.fsdp_config.param_offload is False  # verl's critic.model.fsdp_config.* alias
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        for key in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
            assert math.isfinite(h[key]), key
        assert 0 < h["perf/mfu/critic"] < 1 and 0 < h["perf/mfu/actor"] < 1
    assert "val-core/rlflow/repeat/reward/mean@1" in steps[-1]  # test_freq=5: validated at the last step


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_veomni_port_runs_two_steps_on_fsdp2(tmp_path):
    """verl's VeOmni engine keys (``model_engine=veomni``, ``actor.veomni.*``) read onto FSDP2: offloaded
    parameters and optimizer, FSDP over the 2 ranks, Ulysses SP 2; GRPO with its KL loss."""
    cfg = load_config([*PPO_QWEN3_30B_VEOMNI, *_local(tmp_path)])
    actor, ref = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert actor.fsdp_config.fsdp_size == 2 and actor.ulysses_sequence_parallel_size == 2
    assert ref.fsdp_config.param_offload and actor.strategy == "fsdp2"
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isfinite(h[key]), key
        assert h["actor/kl_coef"] == pytest.approx(0.001)
    # one mini-batch per step: step 1's KL loss is taken before any update, where the actor is the
    # reference (0 up to float noise); step 2's after one update at lr 5e-7 (a little, and >= 0)
    assert abs(steps[0]["actor/kl_loss"]) < 1e-6
    assert 0 <= steps[1]["actor/kl_loss"] < 1e-3
    assert "val-core/rlflow/repeat/reward/mean@1" in history[0]  # val_before_train=True


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_fused_kernels_reward_model_seq_balance_port_runs_two_steps(tmp_path, reward_model_dir):
    """The fused LM head (actor), dynamic batch sizes for actor, critic and the reward model, and the
    reward model's weights offloaded: two steps with finite losses and reward-model scores. With the
    rollout's log-probs reported, the old-log-prob pass (the fused head, in chunks from the hidden states)
    must give the generation replica's log-probs (a plain output layer) to float precision."""
    overrides = _environment(PPO_QWEN2_7B_RM_SEQ_BALANCE_FUSED, reward_model_dir)
    cfg = load_config([*overrides, *_local(tmp_path), "actor_rollout_ref.rollout.calculate_log_probs=true"])
    assert cfg.actor_rollout_ref.model.use_fused_kernels and cfg.reward_model.use_dynamic_bsz
    for h in _steps(run_ppo(cfg)["history"]):
        assert h["training/rollout_probs_diff_max"] < 1e-4
        for key in (
            "actor/pg_loss",
            "actor/entropy",
            "critic/vf_loss",
            "actor/grad_norm",
            "critic/score/mean",
        ):
            assert math.isfinite(h[key]), key
        assert h["actor/entropy"] > 0


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_gpg_qwen2_7b_math_runs_two_steps(tmp_path):
    cfg = load_config([*GPG_QWEN2_7B_MATH, *_local(tmp_path)])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gpg"  # verl's use_gpg_loss flag
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert "critic/vf_loss" not in h
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean"):
            assert math.isfinite(h[key]), key
        assert h["actor/pg_clipfrac"] == 0.0  # GPG has no ratio to clip


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_sapo_port_in_verls_newer_layout_runs_two_steps(tmp_path):
    """verl's newer spellings: ``reward.reward_manager.name`` / ``reward.reward_kwargs.*`` (the DAPO manager
    with its overlong buffer) and ``actor.fsdp_config.strategy``; SAPO's loss with Ulysses SP 2."""
    cfg = load_config([*SAPO_QWEN3_30B, *_local(tmp_path)])
    assert (
        cfg.reward_model.reward_manager == "dapo"
        and cfg.reward_model.reward_kwargs.overlong_buffer_cfg.len == 4
    )
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "sapo"
    history = run_ppo(cfg)["history"]
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
            assert math.isfinite(h[key]), key
        assert h["actor/pg_clipfrac"] == 0.0  # SAPO's gate clips nothing


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_grpo_and_reinforce_pp_ports_run_two_steps_with_their_kl_losses(tmp_path):
    """The GRPO port also runs FSDP2 with forward prefetch on the actor and the reference."""
    for name, overrides, kl_type in (
        ("grpo", GRPO_QWEN3_8B_NPU, "low_var_kl"),
        ("rf++", REINFORCE_PP_QWEN2_7B_MATH, "mse"),
    ):
        cfg = load_config([*overrides, *_local(tmp_path / name)])
        assert cfg.actor_rollout_ref.actor.kl_loss_type == kl_type
        assert cfg.actor_rollout_ref.ref.fsdp_config.forward_prefetch is (name == "grpo")
        for h in _steps(run_ppo(cfg)["history"]):
            assert "critic/vf_loss" not in h
            # both estimators are >= 0 per token; the actor moved away from the reference (lr 1e-6: a little)
            assert 0 <= h["actor/kl_loss"] < 1e-3, name
            assert h["actor/kl_coef"] == pytest.approx(0.001), name


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_bf16_weights_and_activation_offload_ports_run_two_steps(tmp_path):
    """Mistral-Small-3.1's script keeps the actor's and the reference's weights in bf16, offloaded;
    Qwen3-VL-30B's offloads activations with gradient checkpointing, Ulysses SP 2 and parameter and
    optimizer offload on FSDP2 (the text-only rows of the embedded task stand in for their images)."""
    for name, overrides in (("mistral", GRPO_MISTRAL31_24B), ("qwen3-vl", GRPO_QWEN3_VL_30B_FSDP2)):
        cfg = load_config([*overrides, *_local(tmp_path / name)])
        assert cfg.actor_rollout_ref.actor.fsdp_config.model_dtype == (
            "bfloat16" if name == "mistral" else "fp32"
        )
        assert cfg.actor_rollout_ref.model.enable_activation_offload is (name == "qwen3-vl")
        first, second = _steps(run_ppo(cfg)["history"])
        for h in (first, second):
            for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
                assert math.isfinite(h[key]), (name, key)
            assert h["actor/grad_norm"] > 0, name
        # step 1: the actor is the reference; their forwards differ in micro-batching and SP layout only
        # (fp32 summation order: 2e-6 for qwen3-vl, with and without the offload), far below a step's KL
        assert 0 <= first["actor/kl_loss"] < 1e-5, name


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_megatron_ports_run_two_steps_on_fsdp2(tmp_path):
    """verl's Megatron scripts (PP 2 layouts, full recompute, Megatron's offloads) run on FSDP2: GRPO with a
    KL loss, and PPO with a critic whose Megatron section is read onto its own FSDP2 keys."""
    from rlflow.config import to_typed
    from rlflow.trainer.main_ppo import megatron_summaries

    for name, overrides in (("grpo", GRPO_QWEN2_7B_MATH_MEGATRON), ("ppo", PPO_MOONLIGHT16B_A3B_MEGATRON)):
        cfg = load_config([*overrides, *_local(tmp_path / name)], config_name="ppo_megatron_trainer")
        assert cfg.actor_rollout_ref.actor.strategy == cfg.critic.strategy == "fsdp2"
        assert cfg.actor_rollout_ref.actor.megatron.pipeline_model_parallel_size == 2
        lines = megatron_summaries(to_typed(prepare_config(cfg, build_warm_start=False)))
        assert [line.split(":")[0] for line in lines] == (
            ["actor_rollout_ref.actor.megatron", "actor_rollout_ref.ref.megatron"]
            if name == "grpo"
            else ["actor_rollout_ref.actor.megatron", "critic.megatron"]
        )
        first, second = _steps(run_ppo(cfg)["history"])
        for h in (first, second):
            assert math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["actor/grad_norm"]), name
        if name == "grpo":  # step 1: actor == reference; their forwards differ in micro-batching only
            assert 0 <= first["actor/kl_loss"] < 1e-5 and 0 <= second["actor/kl_loss"] < 1e-3
        else:  # GAE gives every response a non-zero advantage: both roles get gradients
            for h in (first, second):
                assert h["actor/grad_norm"] > 0 and h["critic/grad_norm"] > 0
                assert math.isfinite(h["critic/vf_loss"])


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("replay", ["R3", "R2", "R3-fp8-qat"])
def test_megatron_moe_port_runs_two_steps_with_its_router_losses_and_routing_replay(
    tmp_path, moe_model_dir, replay
):
    """Qwen3-VL-30B-A3B's Megatron script on a tiny Qwen3-MoE: the router losses it sets (load balancing
    0.01, z-loss 0.001) are in the actor's loss (tests/engine/test_router_losses.py checks their gradient),
    with the routing replay of verl's DeepSeek-V4 Megatron scripts (``megatron.router_replay.mode``) on its
    two mini-batches, recomputation and dynamic micro-batches (tests/models/test_router_replay.py checks
    what is replayed): R3 replays the rollout's routing, R2 the old-log-prob pass's. The micro-batch sizes
    are verl's null defaults (the token budgets size the micro-batches). ``R3-fp8-qat`` adds the FP8
    training, FP8 rollout and MXFP4 expert QAT of verl's DeepSeek-V4 QAT scripts, in their spelling
    (tests/models/test_fp8.py and test_qat.py check the numerics, tests/workers/test_role_setup.py which
    layers each role quantizes): the old-log-prob pass still reproduces the rollout's log-probs."""
    overrides = _environment(GRPO_QWEN3_VL_30B_MEGATRON, "", moe_model_dir)
    fp8 = replay.endswith("-fp8-qat")
    replay = replay.removesuffix("-fp8-qat")
    overrides += [
        f"actor_rollout_ref.actor.megatron.router_replay.mode={replay}",
        f"actor_rollout_ref.rollout.enable_rollout_routing_replay={replay == 'R3'}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        # verl's null defaults, with the dynamic batching the script turns on for every pass
        *(
            f"actor_rollout_ref.{k}_micro_batch_size_per_gpu=null"
            for k in ("actor.ppo", "rollout.log_prob", "ref.log_prob")
        ),
    ]
    if fp8:
        overrides += [
            '+actor_rollout_ref.actor.megatron.override_transformer_config.fp8="hybrid"',
            '+actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe="blockwise"',
            '+actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe="blockwise"',
            "+actor_rollout_ref.rollout.quantization=fp8",
            "++actor_rollout_ref.actor.megatron.qat.enable=True",
            "++actor_rollout_ref.actor.megatron.qat.mode=mxfp4_experts",
            "++actor_rollout_ref.actor.megatron.qat.bypass_te_fp8_assert=True",
            "++actor_rollout_ref.rollout.qat.enable=False",
        ]
    cfg = load_config([*overrides, *_local(tmp_path)], config_name="ppo_megatron_trainer")
    actor = cfg.actor_rollout_ref.actor
    assert (actor.fsdp_config.fp8.format, cfg.actor_rollout_ref.rollout.quantization, actor.qat.enable) == (
        ("hybrid", "fp8", True) if fp8 else (None, None, False)
    )
    assert (actor.moe_aux_loss_coef, actor.moe_z_loss_coef) == (0.01, 0.001)
    assert actor.router_replay.mode == replay
    steps = _steps(run_ppo(cfg)["history"])
    # step 1: the reference computes as the actor does (FP8 and QAT included), with the same weights
    assert 0 <= steps[0]["actor/kl_loss"] < 1e-4
    for h in steps:
        # two MoE layers: each load-balancing term is 1 for an even router (2 here), at most E = 4
        assert 1.0 < h["actor/moe_aux_loss"] < 8.0 and h["actor/moe_z_loss"] > 0
        assert math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["actor/grad_norm"])
        # the old-log-prob pass reproduces the rollout's log-probs (fp32, same experts; with FP8 on both sides
        # the same quantization: 2e-6 seen, where a token's activation rounds to a neighbouring FP8 value)
        assert h["training/rollout_probs_diff_max"] < 1e-4
        # the second mini-batch replays experts chosen before the first optimizer step
        assert 0.0 <= h["actor/router_replay_mismatch"] < 0.05
        assert 0 < h["perf/mfu/actor"] < 1  # MoE FLOPs: the tokens' routers and chosen experts
        if replay == "R3":  # the same weights and fp32 numerics: the trainer picks the rollout's experts
            assert 0.0 <= h["actor/router_replay_rollout_mismatch"] < 0.01


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_nemotron_mtp_port_trains_the_mtp_layer_and_exports_it(tmp_path, hybrid_model_dir):
    """Nemotron 3.5 Lightning's script on a tiny Nemotron-H with an MTP layer (tests/models/test_mtp.py checks
    its loss against a hand-written forward): the repeated ``*E`` layer runs 2 depths, its loss (weight 0.3,
    encoder detached) is in the actor's update, the rollout decodes without it, and the actor's checkpoint
    exports it in Nemotron-H's names."""
    from safetensors.torch import load_file

    from rlflow.models.tiny import TinyModelConfig

    overrides = _environment(GRPO_NEMOTRON_35_LIGHTNING_MEGATRON, "", "", hybrid_model_dir)
    overrides += [
        "trainer.save_freq=2",  # env: 50
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        "actor_rollout_ref.actor.optim.lr=1e-3",  # env: 1e-6, so that two steps move the weights
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",  # env: 10
    ]
    cfg = load_config([*overrides, *_local(tmp_path)], config_name="ppo_megatron_trainer")
    mtp = cfg.actor_rollout_ref.model.mtp
    assert (mtp.num_layers, mtp.use_repeated_layer, mtp.mtp_loss_scaling_factor) == (2, True, 0.3)
    steps = _steps(run_ppo(cfg)["history"])
    uniform = math.log(TinyModelConfig().vocab_size)  # 5.61: the cross-entropy of a uniform guess
    for h in steps:
        # the test checkpoint's MTP layer is random and the tiny model's logits small: a near-uniform guess
        for key in ("actor/mtp_loss", "actor/mtp_loss/depth_1", "actor/mtp_loss/depth_2"):
            assert abs(h[key] - uniform) < 0.3, key
        assert h["actor/mtp_loss"] == pytest.approx(
            (h["actor/mtp_loss/depth_1"] + h["actor/mtp_loss/depth_2"]) / 2
        )
        # the MTP layer does not touch the main model's log-probs (bf16 forwards on both sides)
        assert h["training/rollout_probs_diff_max"] < 0.05
    hf = tmp_path / "ckpt" / "global_step_2" / "actor" / "huggingface"
    exported, original = (
        load_file(hf / "model-mtp.safetensors"),
        load_file(f"{hybrid_model_dir}/model-mtp.safetensors"),
    )
    assert sorted(exported) == sorted(original)
    # trained: 4 AdamW steps (2 steps x 2 mini-batches) of lr 1e-3, each moving a weight by about lr at
    # most, plus weight decay (0.1 lr |w|): 4.08e-3 seen
    key = "mtp.layers.0.eh_proj.weight"
    assert 1e-3 < float((exported[key].float() - original[key].float()).abs().max()) < 4.5e-3
    main = load_file(hf / "model.safetensors")
    assert not any(k.startswith("mtp.") for k in main)
    # the merger (verl's model_merger) writes the same tensors from the sharded checkpoint
    from rlflow.model_merger import merge_checkpoint

    merged = merge_checkpoint(tmp_path / "ckpt" / "global_step_2" / "actor", tmp_path / "merged")
    again = load_file(f"{merged}/model-mtp.safetensors")
    assert all(torch.equal(again[k], exported[k]) for k in exported)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_rloo_and_remax_ports_run_two_steps_with_kl_in_the_reward(tmp_path):
    for name, overrides in (("rloo", RLOO_QWEN2_7B), ("remax", REMAX_QWEN25_3B_SEQ_BALANCE)):
        first, second = _steps(run_ppo(load_config([*overrides, *_local(tmp_path / name)]))["history"])
        assert first["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6), name
        assert second["actor/reward_kl_penalty"] > 0, name
        assert second["critic/rewards/mean"] < second["critic/score/mean"], name
    assert "reward/baseline/mean" in second and "timing_s/gen_baseline" in second  # ReMax's greedy baseline


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_gmpo_port_runs_two_steps(tmp_path):
    cfg = load_config([*GMPO_QWEN3_8B, *_local(tmp_path)])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "geo_mean"
    for h in _steps(run_ppo(cfg)["history"]):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
            assert math.isfinite(h[key]), key
        assert 0.0 <= h["actor/pg_clipfrac"] <= 1.0
        assert h["timing_s/update_weights"] > 0  # the FSDP shards gathered into the generation replica


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_dapo_port_runs_two_steps_with_dynamic_sampling_and_the_overlong_buffer(tmp_path, capsys):
    cfg = load_config([*DAPO_7B_MATH, *_local(tmp_path)])
    assert cfg.reward_model.reward_kwargs["overlong_buffer_cfg"]["len"] == 4
    assert dict(cfg.actor_rollout_ref.model.override_config) == {"max_position_embeddings": 32768}
    steps = _steps(run_ppo(cfg)["history"])
    for h in steps:
        # rounds of 12 prompts until 4 have responses that differ in acc; the step trains on 4 x 4
        assert 1 <= h["train/num_gen_batches"] <= 10
        assert 0 < h["train/informative_prompt_fraction"] <= 1
        assert h["response_length/mean"] > 0 and math.isfinite(h["actor/pg_loss"])
    # validated before training (trainer.log_val_generations=10 prints 10 samples)
    out = capsys.readouterr().out
    assert "validation generations at step 0:" in out
    block = out.split("validation generations at step 0:")[1].splitlines()[1:11]
    assert all(line.startswith("  [score ") for line in block)


def test_the_reward_loop_script_keeps_its_reward_model_settings(reward_model_dir):
    cfg = prepare_config(
        load_config(_environment(verl_scripts.PPO_QWEN2_7B_RM, reward_model_dir)), build_warm_start=False
    )
    rm = cfg.reward_model
    assert rm.enable and rm.use_reward_loop and rm.model.path == reward_model_dir
    assert (rm.inference.prompt_length, rm.inference.response_length) == (2048, 1024)
    assert rm.inference.gpu_memory_utilization == pytest.approx(0.8) and rm.num_workers == 8
    # verl's older spelling of the path (a stored version of the same script) is an alias
    older = [
        o.replace("reward_model.model.path=", "reward_model.model_path=")
        for o in verl_scripts.PPO_QWEN2_7B_RM
    ]
    assert load_config(_environment(older, reward_model_dir)).reward_model.model.path == reward_model_dir
    # the served engine of the script, and reward-model limits shorter than the data, are refused by name
    for override, message in (
        (
            "reward_model.inference.name=vllm",
            r"reward_model\.inference\.name='vllm'.*set reward_model\.inference\.name=hf",
        ),
        ("reward_model.inference.tensor_model_parallel_size=2", r"tensor_model_parallel_size=2.*set it to 1"),
        (
            "reward_model.inference.response_length=4",
            r"response_length=4 is shorter than data\.max_response_length=8",
        ),
        (
            "reward_model.inference.gpu_memory_utilization=0",
            r"gpu_memory_utilization=0.* must be in \(0, 1\]",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            prepare_config(
                load_config([*_environment(verl_scripts.PPO_QWEN2_7B_RM, reward_model_dir), override]),
                build_warm_start=False,
            )


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_kl_cov_and_clip_cov_run_two_steps_on_a_grpo_port(tmp_path):
    """verl's entropy-mechanism losses on a GRPO port with two mini-batches per step and dynamic batch
    sizes over 2 ranks: each mini-batch's tokens are chosen over both ranks with the weights of that
    mini-batch (the second after the first's optimizer step). KL-Cov with the entropy recipe's settings
    (kl_cov_ratio 0.002, ppo_kl_coef 1, clip_ratio_c 10) penalises max(1, 0.2 % of the tokens): at least
    one; Clip-Cov with its covariance interval opened to (-5, 5) cuts max(1, 5 % of the tokens)."""
    actor = "actor_rollout_ref.actor"
    for mode, settings in (
        ("kl_cov", ["kl_cov_ratio=0.002", "ppo_kl_coef=1.0"]),
        ("clip_cov", ["clip_cov_ratio=0.05", "clip_cov_lb=-5.0", "clip_cov_ub=5.0"]),
    ):
        overrides = [
            *GRPO_QWEN2_7B_SEQ_BALANCE,
            *_local(tmp_path / mode),
            f"{actor}.clip_ratio_c=10.0",
            f"{actor}.policy_loss.loss_mode={mode}",
            *[f"{actor}.policy_loss.{s}" for s in settings],
        ]
        for h in _steps(run_ppo(load_config(overrides))["history"]):
            for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
                assert math.isfinite(h[key]), (mode, key)
            # 8 prompts x 5 responses of up to 8 tokens, two mini-batches: a share of <= 160 tokens each
            assert 1 / 160 <= h["actor/pg_clipfrac"] <= (0.1 if mode == "clip_cov" else 0.05), (mode, h)
