"""A LoRA critic end to end (``critic.model.lora_rank``, from `config/examples/critic_lora.yaml`): 2 FSDP2
ranks, Ulysses SP 2 with gradient checkpointing, remove-padding and token-budget micro-batches.

The adapters start at zero, so at step 1 the LoRA critic computes the full critic's values and value loss
(same layout, same responses); its gradient is the adapters' and the head's alone, and only they move.
The checkpoint holds the sharded adapters, a PEFT ``TOKEN_CLS`` adapter with the value head among its
``modules_to_save`` (PEFT on the untrained value model gives the exported model's values) and the merged
Hugging Face model, which equals what the model merger builds from the shards; a resume from step 1
reproduces step 2.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from rlflow.config import load_config
from rlflow.trainer.main_ppo import prepare_config, run_ppo
from tests.trainer.test_e2e import _comparable

REPO = Path(__file__).resolve().parents[2]
CRITIC_FILE = REPO / "config" / "examples" / "critic_lora.yaml"
COMMON = [
    "trainer.total_training_steps=2",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.logger=[jsonl]",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",  # one optimizer step per training step, both roles
]
# The file's layout and learning rate on the command line, without the adapters (the reference run).
FULL_CRITIC = [
    "critic.ulysses_sequence_parallel_size=2",
    "critic.use_dynamic_bsz=true",
    "critic.ppo_max_token_len_per_gpu=256",
    "critic.model.enable_gradient_checkpointing=true",
    "critic.optim.lr=2e-3",
]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_lora_critic_trains_adapters_and_head_exports_merged_and_peft_and_resumes_exactly(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForTokenClassification

    from rlflow.model_merger import merge_checkpoint
    from rlflow.models.loader import load_value_model

    def run(name: str, *extra: str) -> tuple[object, dict[int, dict]]:
        cfg = load_config(
            [
                *COMMON,
                f"trainer.default_local_dir={tmp_path / name / 'ckpt'}",
                f"trainer.log_dir={tmp_path / name / 'logs'}",
                *extra,
            ],
            config_name="demo_two_ranks",
        )
        history = run_ppo(cfg)["history"]
        return cfg, {h["step"]: h for h in history if h["step"] > 0}

    cfg, lora = run(
        "lora",
        f"critic.config_path={CRITIC_FILE}",
        "trainer.resume_mode=disable",
        "trainer.save_freq=1",
        "critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    )
    assert (cfg.critic.model.lora_rank, cfg.critic.ulysses_sequence_parallel_size) == (16, 2)
    _, full = run("full", *FULL_CRITIC, "trainer.resume_mode=disable", "trainer.total_training_steps=1")
    assert sorted(lora) == [1, 2] and sorted(full) == [1]

    # Step 1: the same responses and, the adapters being zero, the same values and value loss.
    one, ref = lora[1], full[1]
    assert one["response_length/mean"] == ref["response_length/mean"]
    for key in ("critic/values/mean", "critic/values/max", "critic/values/min", "critic/vf_loss"):
        assert one[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    # The gradient is the adapters' and the head's: smaller than the full model's, not zero.
    assert 0 < one["critic/grad_norm"] < ref["critic/grad_norm"]
    assert lora[2]["critic/values/mean"] != pytest.approx(one["critic/values/mean"], abs=1e-6)  # it learned

    # The merged HF copy: the model merger gives the same tensors; only the adapted layers and the head
    # moved away from the value model the critic started from (fresh head seeded by trainer.seed).
    step_dir = tmp_path / "lora" / "ckpt" / "global_step_2" / "critic"
    hf_model = AutoModelForTokenClassification.from_pretrained(step_dir / "huggingface").eval()
    hf = hf_model.state_dict()
    merged = AutoModelForTokenClassification.from_pretrained(
        merge_checkpoint(step_dir, tmp_path / "merged")
    ).state_dict()
    base_dir = str(prepare_config(copy.deepcopy(cfg)).critic.model.path)  # the warm-started tiny model
    start = load_value_model(base_dir, seed=int(cfg.trainer.seed)).state_dict()
    assert hf.keys() == merged.keys() == start.keys()  # the value model's keys: no adapter tensors
    for key in hf:
        assert torch.equal(hf[key], merged[key]), key
        moved = (hf[key] - start[key]).abs().max().item()
        if key.endswith("proj.weight") or key.startswith("score."):  # adapted layers and the head
            assert moved > 1e-5, key
        else:  # embeddings, norms, biases: frozen
            assert moved == 0, key

    # The PEFT adapter beside the shards: PEFT on the untrained value model gives the HF copy's values.
    adapter = step_dir / "lora_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["task_type"], config["modules_to_save"], config["r"]) == ("TOKEN_CLS", ["score"], 16)
    peft_model = PeftModel.from_pretrained(load_value_model(base_dir, seed=int(cfg.trainer.seed)), adapter)
    ids = torch.randint(0, hf_model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(peft_model.eval()(ids).logits, hf_model(ids).logits, rtol=0, atol=1e-5)

    # A resume from step 1 (adapters, head, their optimizer state) reproduces step 2.
    _, resumed = run(
        "resumed",
        f"critic.config_path={CRITIC_FILE}",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'lora' / 'ckpt' / 'global_step_1'}",
    )
    assert sorted(resumed) == [2]
    got, want = _comparable(resumed[2]), _comparable(lora[2])
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
