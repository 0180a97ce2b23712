"""``python -m rlflow.trainer.check_config``: the whole pre-Ray validation of a command line, nothing started."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rlflow.trainer.check_config import check_config, main, summary


def test_summary_names_the_estimator_roles_and_geometry():
    assert summary(check_config([], "demo")) == (
        "config OK: gae; roles: actor+rollout, critic; 1 x 1 ranks; 16 prompts x 1 responses per step; steps: 100"
    )
    grpo = summary(check_config(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"], "demo"))
    assert grpo.startswith("config OK: grpo; roles: actor+rollout; ") and "16 prompts x 4 responses" in grpo


def test_problems_exit_1_with_the_key(capsys):
    assert main(["trainer.total_epoch=3"]) == 1
    assert "(did you mean 'trainer.total_epochs'?)" in capsys.readouterr().err
    assert main(["-cn", "demo", "actor_rollout_ref.actor.ppo_mini_batch_size=5"]) == 1  # validate_config
    assert (
        "ppo_mini_batch_size=5 must be <= data.train_batch_size=16 and divide it" in capsys.readouterr().err
    )
    assert main(["trainer.nnodes=abc"]) == 1  # a wrong type, from composition
    assert "trainer.nnodes" in capsys.readouterr().err
    # an override Hydra cannot parse (verl's run_qwen2-7b_rm_on_air.sh splits a list on its space)
    assert main(["trainer.logger=['console',", "'mlflow']"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlflow.trainer.check_config: ") and "Traceback" not in err


def test_print_shows_the_resolved_config(capsys):
    args = ["--print", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    assert main(["--config-name=demo", *args]) == 0
    out = capsys.readouterr().out
    assert "train_batch_size: 8" in out and out.rstrip().endswith("steps: 100")


def test_starts_no_ray_and_builds_no_warm_start(tmp_path):
    code = (
        "import sys; from rlflow.trainer.check_config import main; rc = main(['--config-name', 'demo']); "
        "assert rc == 0; assert 'ray' not in sys.modules, 'ray imported'"
    )
    env = {"RLFLOW_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "config OK: gae" in proc.stdout
    built = sorted(p.name for p in tmp_path.iterdir())
    assert not any(name.startswith("tiny-sft") for name in built), built  # only the base model and task files


def test_verls_defaults_name_the_demo_config_and_a_cluster_validates_them(capsys):
    assert main(["ray_init.num_cpus=2"]) == 1  # ppo_trainer.yaml: verl's 8 ranks on a 2-CPU local Ray
    err = capsys.readouterr().err
    assert "trainer.n_gpus_per_node" in err and "--config-name demo" in err
    assert main(["ray_init.address=ray://head:10001"]) == 0
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith("1 x 8 ranks; 1024 prompts x 1 responses per step; steps: from total_epochs")
    )
    assert main(["--config-name"]) == 1
    assert "--config-name needs a config name" in capsys.readouterr().err


def test_lora_target_modules_that_select_nothing_fail_before_ray_naming_the_role():
    """Each role's LoRA selection is matched against its architecture (built on ``meta``) before Ray
    starts; the value head is never adapted (it trains in full), so targeting it selects nothing."""
    for overrides, message in (
        (
            ["critic.model.lora_rank=4", "critic.model.target_modules=[score]"],
            "critic.model.target_modules=('score',) (exclude_modules=None) matches no linear layer of "
            "Qwen2ForTokenClassification; linear layers: ['down_proj', 'gate_proj', 'k_proj', 'o_proj', "
            "'q_proj', 'up_proj', 'v_proj'] (the output layer 'score' is never adapted)",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[qproj]"],
            "actor_rollout_ref.model.target_modules=('qproj',) (exclude_modules=None) matches no linear "
            "layer of Qwen2ForCausalLM",
        ),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_config(overrides, "demo")
    # a selection that matches is accepted, and a critic that does not run is not checked
    check_config(["critic.model.lora_rank=4", "critic.model.target_modules=[q_proj,v_proj]"], "demo")
    check_config(
        ["critic.model.lora_rank=4", "critic.model.target_modules=[nothing]", "algorithm.adv_estimator=grpo"],
        "demo",
    )


def test_a_tiled_mlp_on_a_mixture_of_experts_model_fails_before_ray(tmp_path):
    from tests.tiny_moe_model import save_tiny_moe_model

    moe = save_tiny_moe_model(tmp_path / "moe")
    overrides = [f"actor_rollout_ref.model.path={moe}", "algorithm.adv_estimator=grpo"]
    with pytest.raises(
        ValueError, match=r"^actor_rollout_ref\.model\.tiled_mlp\.enabled=true: \w+ is a mixture"
    ):
        check_config([*overrides, "actor_rollout_ref.model.tiled_mlp.enabled=true"], "demo")
    assert summary(check_config([*overrides, "critic.model.tiled_mlp.enabled=true"], "demo")).startswith(
        "config OK: grpo"
    )  # no critic runs: its tiled MLP is not built


def test_routing_replay_settings_are_checked_before_ray(tmp_path):
    from tests.tiny_moe_model import save_tiny_moe_model

    moe = save_tiny_moe_model(tmp_path / "moe")
    base = [f"actor_rollout_ref.model.path={moe}", "algorithm.adv_estimator=grpo"]
    key = "actor_rollout_ref.actor.router_replay"
    r3 = [f"{key}.mode=R3", "actor_rollout_ref.rollout.enable_rollout_routing_replay=true"]
    assert summary(check_config([*base, *r3], "demo")).startswith("config OK")
    assert summary(check_config([*base, f"{key}.mode=R2"], "demo")).startswith("config OK")
    refused = {
        rf"^{key}\.mode='R4' is not one of": [f"{key}.mode=R4"],
        r"mode=R3 with .*enable_rollout_routing_replay=false: R3 replays": [f"{key}.mode=R3"],
        r"mode=disabled with .*enable_rollout_routing_replay=true": r3[1:],
        rf"^{key}\.record_file: rlflow does not write": [*r3, f"{key}.record_file=/tmp/r.pt"],
        r"mode=R2 records the routing in the old-log-prob pass": [
            f"{key}.mode=R2",
            "algorithm.rollout_correction.bypass_mode=true",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
        ],
        r"only the actor replays routing": ["actor_rollout_ref.ref.megatron.router_replay.mode=R2"],
    }
    for pattern, extra in refused.items():
        with pytest.raises(ValueError, match=pattern):
            check_config([*base, *extra], "demo")
    with pytest.raises(ValueError, match=r"mode=R2: the actor's model \(Qwen2Config\) is not a mixture"):
        check_config(["algorithm.adv_estimator=grpo", f"{key}.mode=R2"], "demo")
    # a config that claims experts over a dense architecture: the built model has no router to replay
    claims = [
        f"+actor_rollout_ref.model.override_config.{k}"
        for k in ("num_experts_per_tok=2", "output_router_logits=false")
    ]
    with pytest.raises(ValueError, match=r"mode=R2: Qwen2ForCausalLM has no router module"):
        check_config(["algorithm.adv_estimator=grpo", f"{key}.mode=R2", *claims], "demo")
    # verl's Megatron spelling is the actor's key; the reference's "disabled" is dropped
    megatron = [
        "actor_rollout_ref.actor.megatron.router_replay.mode=R3",
        "actor_rollout_ref.ref.megatron.router_replay.mode=disabled",
        "actor_rollout_ref.ref.megatron.router_replay.record_file=null",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
    ]
    assert check_config([*base, *megatron], "demo").actor_rollout_ref.actor.router_replay.mode == "R3"
    # verl's generated config lists the reference's replay keys at their defaults
    ref = [
        f"actor_rollout_ref.ref.router_replay.{k}"
        for k in ("mode=disabled", "record_file=null", "replay_file=null")
    ]
    assert summary(check_config([*base, *ref], "demo")).startswith("config OK")
    with pytest.raises(ValueError, match=r"ref\.router_replay\.mode='R3': only the actor replays routing"):
        check_config([*base, *r3, "+actor_rollout_ref.ref.router_replay.mode=R3"], "demo")


def test_r2_keeps_the_old_log_prob_pass_that_records_its_routing(tmp_path):
    """bypass_mode=null would skip the pass (hf engine, fp32, two epochs): R2 needs it to record."""
    from rlflow.config.correction_checks import resolve_bypass_mode
    from tests.tiny_moe_model import save_tiny_moe_model

    base = [
        f"actor_rollout_ref.model.path={save_tiny_moe_model(tmp_path / 'moe')}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.ppo_epochs=2",
    ]
    assert resolve_bypass_mode(check_config(base, "demo"))[0] is True
    bypass, why = resolve_bypass_mode(
        check_config([*base, "actor_rollout_ref.actor.router_replay.mode=R2"], "demo")
    )
    assert bypass is False and "router_replay.mode=R2" in why


def test_verls_null_micro_batch_sizes_go_with_dynamic_batching_and_are_named_without_it():
    """verl's configs default every ``*micro_batch_size_per_gpu`` to null (dynamic batching or the
    deprecated global size sets the micro-batches); a ported null must compose, and without either it
    must name the key."""
    keys = {
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "actor_rollout_ref.actor.use_dynamic_bsz",
        "critic.ppo_micro_batch_size_per_gpu": "critic.use_dynamic_bsz",
        "critic.forward_micro_batch_size_per_gpu": "critic.use_dynamic_bsz",
        "reward_model.micro_batch_size_per_gpu": "reward_model.use_dynamic_bsz",
    }
    base = ["algorithm.adv_estimator=gae", "reward_model.enable=false"]
    for key, dynamic in keys.items():
        assert summary(check_config([*base, f"{key}=null", f"{dynamic}=true"], "demo")).startswith(
            "config OK"
        )
    fixed = [*base, "actor_rollout_ref.actor.use_dynamic_bsz=false", "critic.use_dynamic_bsz=false"]
    for key in (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "critic.ppo_micro_batch_size_per_gpu",
    ):
        with pytest.raises(ValueError, match=rf"^{re.escape(key)}=None: fixed micro-batches need a size"):
            check_config([*fixed, f"{key}=null"], "demo")
    # verl's deprecated global size fills a null per-rank size (2 ranks: 8 -> 4)
    cfg = check_config(
        [
            *fixed,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8",
        ],
        "demo_two_ranks",
    )
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4


def test_verls_null_placeholders_keep_rlflows_defaults():
    """verl's generated config writes null for keys it fills in elsewhere (the legacy reward_model.* section,
    which reward.* replaced; warmup_style, which lr_scheduler_type replaced; data.gen_batch_size and
    data.seed, which default to the batch size and 1): a dumped config passed back must compose to the same
    run as without them."""
    nulls = [
        "actor_rollout_ref.actor.optim.warmup_style",
        "critic.optim.warmup_style",
        "data.gen_batch_size",
        "data.seed",
        "reward_model.enable",
        "reward_model.reward_manager",
        "reward_model.num_workers",
        "reward_model.model.trust_remote_code",
        *(
            f"reward_model.rollout.{k}"
            for k in ("name", "gpu_memory_utilization", "tensor_model_parallel_size")
        ),
        *(f"reward_model.rollout.{k}" for k in ("prompt_length", "response_length")),
    ]
    base = ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"]
    plain = check_config(base, "demo")
    ported = check_config([*base, *(f"{key}=null" for key in nulls)], "demo")
    assert ported == plain
    assert ported.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert ported.data.seed == 1 and ported.data.gen_batch_size == ported.data.train_batch_size
    assert check_config([*base, "data.seed=7"], "demo").data.seed == 7  # a value still counts


def test_fp8_and_qat_settings_are_read_onto_rlflows_keys_and_checked_before_ray(tmp_path):
    """verl's DeepSeek-V4 spelling (Megatron's fp8 / fp8_recipe, the optimizer's recipe, the FP8 rollout) maps
    onto ``fsdp_config.fp8`` and ``rollout.quantization``; what rlflow does not emulate is refused naming the key;
    the old-log-prob pass stays whenever one side computes in FP8 and the other does not."""
    from rlflow.config.correction_checks import resolve_bypass_mode

    megatron = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    cfg = check_config(
        [
            f"{megatron}.fp8=hybrid",
            f"{megatron}.fp8_recipe=mxfp8",
            "+actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe=mxfp8",
            "+critic.megatron.override_transformer_config.fp8=e4m3",
            "+critic.megatron.override_transformer_config.fp8_recipe=tensorwise",
        ],
        "demo",
    )
    assert (
        cfg.actor_rollout_ref.actor.fsdp_config.fp8.format,
        cfg.actor_rollout_ref.actor.fsdp_config.fp8.recipe,
    ) == (
        "hybrid",
        "mxfp8",
    )
    assert (cfg.critic.fsdp_config.fp8.format, cfg.critic.fsdp_config.fp8.recipe) == ("e4m3", "tensorwise")

    refused = {
        f"{megatron}.fp8=e4m3": "Megatron's default recipe is delayed",
        f"{megatron}.fp8_recipe=delayed": "delayed scaling",
        "+actor_rollout_ref.ref.megatron.override_transformer_config.fp8=e4m3": "the reference computes in its dtype",
        "actor_rollout_ref.actor.fsdp_config.fp8.format=e5m2": "fp8.format='e5m2'",
        "critic.fsdp_config.fp8.recipe=custom": "fp8.recipe='custom'",
        "actor_rollout_ref.rollout.quantization=int8": "rollout.quantization='int8'",
    }
    for override, message in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            check_config([override], "demo")
    with pytest.raises(ValueError, match="rlflow's FP8 rollout is the hf engine's"):
        check_config(
            ["actor_rollout_ref.rollout.quantization=fp8", "actor_rollout_ref.rollout.name=vllm"], "demo"
        )
    with pytest.raises(ValueError, match="LoRA adapters on the same role"):
        check_config(
            ["actor_rollout_ref.actor.fsdp_config.fp8.format=e4m3", "actor_rollout_ref.model.lora_rank=4"],
            "demo",
        )

    # QAT: verl's three spellings, the DeepSeek-V4 script's Megatron ones among them; w4a4 refused
    from tests.tiny_moe_model import save_tiny_moe_model

    qat = check_config(
        [
            f"actor_rollout_ref.model.path={save_tiny_moe_model(tmp_path / 'moe')}",
            "++actor_rollout_ref.actor.megatron.qat.enable=True",
            "++actor_rollout_ref.actor.megatron.qat.mode=mxfp4_experts",
            "++actor_rollout_ref.actor.megatron.qat.bypass_te_fp8_assert=True",
            "++actor_rollout_ref.rollout.qat.enable=False",
        ],
        "demo",
    ).actor_rollout_ref.actor.qat
    assert (qat.enable, qat.mode) == (True, "mxfp4_experts")
    assert check_config(
        ["actor_rollout_ref.actor.fsdp_config.qat.enable=true"], "demo"
    ).actor_rollout_ref.actor.qat.enable
    for override, message in {
        "actor_rollout_ref.actor.qat.mode=w4a4": "quantizing activations with scales observed",
        "actor_rollout_ref.actor.qat.group_size=32": "NVFP4's block is 16 elements",
        "actor_rollout_ref.actor.qat.activation_observer=minmax": "only w4a4 observes activation scales",
        "actor_rollout_ref.actor.qat.quantization_config_path=q.json": "verl's vLLM quantization config",
        "+actor_rollout_ref.ref.fsdp_config.qat.enable=true": "the reference quantizes its weights as the actor",
        "+actor_rollout_ref.ref.megatron.qat.enable=true": "QAT is the actor's",
    }.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            check_config([override], "demo")
    # on the model, before Ray: mxfp4_experts needs routed experts; NVFP4 cannot reach a tied LM head
    with pytest.raises(ValueError, match="Qwen2ForCausalLM has no routed experts to quantize"):
        check_config(
            ["actor_rollout_ref.actor.qat.enable=true", "actor_rollout_ref.actor.qat.mode=mxfp4_experts"],
            "demo",
        )
    with pytest.raises(ValueError, match="lm_head's weight is tied to the input embeddings"):
        check_config(
            ["actor_rollout_ref.actor.qat.enable=true", "actor_rollout_ref.actor.qat.ignore_patterns=[x]"],
            "demo",
        )
    with pytest.raises(ValueError, match="adapted layers would stay in full precision"):
        check_config(
            ["actor_rollout_ref.actor.qat.enable=true", "actor_rollout_ref.model.lora_rank=4"], "demo"
        )

    # two epochs, fp32, hf engine: bypass_mode=null skips the pass exactly when both sides share the numerics
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_epochs=2"]
    actor_fp8 = "actor_rollout_ref.actor.fsdp_config.fp8.format=e4m3"
    rollout_fp8 = "actor_rollout_ref.rollout.quantization=fp8"
    assert resolve_bypass_mode(check_config([*base, actor_fp8, rollout_fp8], "demo"))[0] is True
    for one_side in (actor_fp8, rollout_fp8):
        bypass, why = resolve_bypass_mode(check_config([*base, one_side], "demo"))
        assert bypass is False and "fsdp_config.fp8 and rollout.quantization differ" in why
