"""LoRA training end to end: verl's LoRA GRPO script on 2 FSDP2 ranks with remove-padding and gradient
checkpointing (`tests/trainer/verl_scripts/grpo.py::GRPO_QWEN25_3B_LORA`).

The rollout engine decodes with the merged weights: its log-probs agree with the trainer's after the
adapters have moved; the checkpoint's HF copy equals what the model merger builds from the shards,
differs from the base model where adapters are and equals it everywhere else; a resume from step 1
reproduces step 2; and FSDP1 with Ulysses SP 2 and dynamic micro-batches computes step 1's losses and
gradient norm as FSDP2 does (the adapters start at zero, so both layouts see the same responses; the
gradient is the adapters' alone).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo
from tests.trainer.test_e2e import _comparable
from tests.trainer.verl_scripts import GRPO_QWEN25_3B_LORA

# Test-only edits, on top of the script's environment edits: a learning rate at which 2 steps move the
# adapters far enough for a wrong merge to show in the log-prob agreement (the script's 3e-6 would not),
# one optimizer step per training step (so step 1's numbers are all taken before any update and two
# layouts can be compared), the rollout's own log-probs, and a checkpoint with a Hugging Face copy after
# every step.
EDITS = [
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "trainer.total_training_steps=2",
    "trainer.save_freq=1",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_lora_port_trains_the_adapters_merges_them_everywhere_and_resumes_exactly(tmp_path):
    from transformers import AutoModelForCausalLM

    from rlflow.model_merger import merge_checkpoint
    from rlflow.workers.role_setup import model_path

    def run(name: str, *extra: str) -> tuple[dict, list[dict]]:
        cfg = load_config(
            [
                *GRPO_QWEN25_3B_LORA,
                *EDITS,
                f"trainer.default_local_dir={tmp_path / name / 'ckpt'}",
                f"trainer.log_dir={tmp_path / name / 'logs'}",
                *extra,
            ]
        )
        return cfg, run_ppo(cfg)["history"]

    cfg, full = run("full", "trainer.resume_mode=disable")
    assert cfg.actor_rollout_ref.model.lora_rank == 64
    steps = {h["step"]: h for h in full if h["step"] > 0}
    assert sorted(steps) == [1, 2]
    for h in steps.values():
        assert math.isfinite(h["actor/pg_loss"]) and h["actor/grad_norm"] > 0
        # rollout (merged weights, replica) vs trainer (adapters in the forward): the same log-probs
        assert h["training/rollout_probs_diff_max"] < 1e-4, h["step"]

    step_dir = tmp_path / "full" / "ckpt" / "global_step_2" / "actor"
    hf = AutoModelForCausalLM.from_pretrained(step_dir / "huggingface").state_dict()
    merged = AutoModelForCausalLM.from_pretrained(
        merge_checkpoint(step_dir, tmp_path / "merged")
    ).state_dict()
    base = AutoModelForCausalLM.from_pretrained(model_path(cfg.actor_rollout_ref.model)).state_dict()
    assert hf.keys() == merged.keys() == base.keys()  # the base model's keys: no adapter tensors
    for key in hf:
        assert torch.equal(hf[key], merged[key]), key
        moved = (hf[key] - base[key]).abs().max().item()
        if key.endswith("proj.weight"):  # every linear layer of the decoder is adapted (all-linear)
            assert moved > 1e-4, key
        else:  # embeddings, norms, biases and the LM head are frozen
            assert moved == 0, key

    # The adapters in PEFT's format beside the shards: PEFT on the base model gives the HF copy's logits.
    from peft import PeftModel

    base_dir = model_path(cfg.actor_rollout_ref.model)
    adapter = step_dir / "lora_adapter"
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter).eval()
    hf_model = AutoModelForCausalLM.from_pretrained(step_dir / "huggingface").eval()
    ids = torch.randint(0, hf_model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(peft_model(ids).logits, hf_model(ids).logits, rtol=0, atol=1e-4)

    # Training continues from that adapter (verl's lora_adapter_path): the actor starts away from the
    # reference (the base model), where a fresh run starts on it, and the rollout decodes with it merged.
    _, continued = run(
        "continued",
        "trainer.resume_mode=disable",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        f"actor_rollout_ref.model.lora_adapter_path={adapter}",
    )
    (start,) = [h for h in continued if h["step"] == 1]
    assert steps[1]["actor/kl_loss"] < 1e-7  # fresh adapters (B = 0): actor == reference
    assert start["actor/kl_loss"] > 1e-3, start["actor/kl_loss"]
    assert start["training/rollout_probs_diff_max"] < 1e-4

    _, resumed = run(
        "resumed",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'full' / 'ckpt' / 'global_step_1'}",
    )
    got = {h["step"]: _comparable(h) for h in resumed if h["step"] > 0}
    assert sorted(got) == [2]
    want = _comparable(steps[2])
    assert got[2].keys() == want.keys()
    for key, value in want.items():
        assert got[2][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key

    # Another layout: FSDP1, Ulysses SP 2 (dp 1), dynamic micro-batches, no gradient checkpointing.
    _, other = run(
        "layout",
        "trainer.resume_mode=disable",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    )
    (first,) = [h for h in other if h["step"] == 1]
    for key in ("actor/grad_norm", "actor/kl_loss", "actor/entropy"):
        assert first[key] == pytest.approx(steps[1][key], rel=1e-4, abs=1e-7), key
    scale = max(abs(steps[1]["critic/advantages/max"]), abs(steps[1]["critic/advantages/min"]))
    assert first["actor/pg_loss"] == pytest.approx(steps[1]["actor/pg_loss"], abs=1e-4 * scale)
