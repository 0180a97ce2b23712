"""``main_sft`` end to end: world-size invariance, exact resume, checkpoints a PPO run takes, and the
config checks (real FSDP2 over gloo, real tiny model, the embedded task's parquet files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from rlflow.config import load_config
from rlflow.config.loading import load_sft_config
from rlflow.config.sft_validate import validate_sft_config
from rlflow.trainer.main_sft import run_sft


def _overrides(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=4",
        "optim.warmup_steps_ratio=0.25",
        f"trainer.default_local_dir={tmp_path / name / 'ckpt'}",
        f"trainer.log_dir={tmp_path / name / 'logs'}",
        "trainer.logger=[jsonl]",
        *extra,
    ]


def _losses(tmp_path: Path, name: str) -> dict[int, float]:
    rows = [
        json.loads(line) for line in (tmp_path / name / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    return {r["step"]: r["train/loss"] for r in rows}


@pytest.mark.timeout(600)
def test_two_ranks_give_the_losses_of_one(tmp_path: Path):
    """Two ranks with token-budget micro-batches and a tiled MLP compute one rank's losses."""
    run_sft(load_sft_config(_overrides(tmp_path, "one")))
    run_sft(
        load_sft_config(
            _overrides(
                tmp_path,
                "two",
                "trainer.n_gpus_per_node=2",
                "data.use_dynamic_bsz=true",
                "model.tiled_mlp.enabled=true",  # and the MLP in pieces: the same losses
                "model.tiled_mlp.num_shards=3",
            )
        )
    )
    one, two = _losses(tmp_path, "one"), _losses(tmp_path, "two")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    assert one[4] < one[1] - 0.5  # it learns (the losses start near ln 272 = 5.6)
    for step in one:  # token-mean NLL over the whole batch, whatever the split: fp32 summation noise only
        assert two[step] == pytest.approx(one[step], rel=1e-5), step


@pytest.mark.timeout(600)
def test_resume_continues_exactly_and_the_checkpoint_feeds_ppo(tmp_path: Path, ray_session):
    mirror = tmp_path / "mirror"
    result = run_sft(
        load_sft_config(
            _overrides(tmp_path, "run", "trainer.save_freq=2", f"trainer.default_hdfs_dir={mirror}")
        )
    )
    ckpt = tmp_path / "run" / "ckpt"
    assert result["hf_dir"] == str(ckpt / "global_step_4" / "huggingface")
    # trainer.default_hdfs_dir: every saved step copied byte for byte, with its own pointer file.
    local = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    assert {p.relative_to(mirror): p.read_bytes() for p in mirror.rglob("*") if p.is_file()} == local
    assert (mirror / "latest_checkpointed_iteration.txt").read_text() == "4"
    straight = _losses(tmp_path, "run")
    # Pretend the run died after step 2: the pointer names step 2, step 4 is gone.
    import shutil

    shutil.rmtree(ckpt / "global_step_4")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    resumed_result = run_sft(load_sft_config(_overrides(tmp_path, "run", "trainer.save_freq=2")))
    resumed = _losses(tmp_path, "run")  # the jsonl keeps the last line of a step: the resumed ones
    assert resumed_result["global_step"] == 4
    for step in (3, 4):  # same weights, optimizer, schedule and data position: bitwise the same steps
        assert resumed[step] == straight[step], step
    hf_dir = resumed_result["hf_dir"]
    assert AutoModelForCausalLM.from_pretrained(hf_dir).num_parameters() > 0

    from rlflow.trainer.main_ppo import run_ppo

    ppo = run_ppo(
        load_config(
            [
                f"actor_rollout_ref.model.path={hf_dir}",
                "trainer.total_training_steps=1",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.logger=[]",
                f"trainer.default_local_dir={tmp_path / 'ppo'}",
            ],
            config_name="demo_two_ranks",
        )
    )
    assert ppo["final"]["actor/grad_norm"] > 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "data.micro_batch_size=4",
            "data.micro_batch_size=4 is not supported .* set data.micro_batch_size_per_gpu",
        ),
        ("data.multiturn.enable=true", "data.multiturn.enable=True is not supported"),
        ("model.lora_rank=8", "model.lora_rank=8 is not supported .* LoRA"),
        ("model.use_liger=true", "model.use_liger=True is not supported"),
        ("data.balance_dp_token=false", "always divided by the response tokens of all ranks"),
        ("model.fsdp_config.model_dtype=bf16", "mixed_precision.param_dtype=bf16"),
        (
            "data.train_batch_size=7",
            r"data\.train_batch_size=7 must be divisible by the data-parallel size 2",
        ),
        (
            "ulysses_sequence_parallel_size=2",
            r"ulysses_sequence_parallel_size=2 > 1 needs use_remove_padding",
        ),
        ("optim.lr_scheduler=linear", r"optim\.lr_scheduler='linear'"),
        ("data.truncation=middle", r"data\.truncation='middle'"),
        ("data.train_files=/nope.parquet", r"data\.train_files: no such file '/nope\.parquet'"),
        ("trainer.resume_mode=resume_path", "needs trainer.resume_from_path"),
    ],
)
def test_bad_configs_name_the_key(override: str, message: str):
    extra = ["trainer.n_gpus_per_node=2"]
    if override.startswith("ulysses"):
        extra.append("use_remove_padding=false")
    with pytest.raises(ValueError, match=message):
        validate_sft_config(load_sft_config([*extra, override]))


def test_default_config_is_valid_and_matches_the_schema():
    from omegaconf import OmegaConf

    from rlflow.config.sft_schema import SFTConfig

    cfg = load_sft_config([])
    validate_sft_config(cfg)
    assert OmegaConf.to_container(cfg, resolve=False) == OmegaConf.to_container(
        OmegaConf.structured(SFTConfig), resolve=False
    )
