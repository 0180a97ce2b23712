"""TRL's side of `bench_ppo_step.py`: the programs that run TRL's ``GRPOTrainer`` and ``PPOTrainer`` on the
bench's models, prompts and geometry, each in its own process (``python -c PROGRAM SPEC_JSON``), and the
check that a TRL with the needed trainer is importable."""

from __future__ import annotations

import os
import subprocess
import sys

TRL_RUNNER = r"""
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from rlflow.data.tasks import ensure_task_files
from rlflow.reward.default import default_compute_score

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
import pandas as pd
train, _ = ensure_task_files("arithmetic")
frame = pd.read_parquet(train)
rows = [{"prompt": list(r["prompt"]), "ground_truth": r["reward_model"]["ground_truth"],
         "data_source": r["data_source"]} for _, r in frame.iterrows()]
dataset = Dataset.from_list(rows)

def reward(prompts, completions, ground_truth, data_source, **kw):
    return [float(default_compute_score(s, c[0]["content"], g)["score"]) for c, g, s in
            zip(completions, ground_truth, data_source)]

class Timer(TrainerCallback):
    def __init__(self): self.times, self.t = [], None
    def on_step_begin(self, *a, **k): self.t = time.perf_counter()
    def on_step_end(self, *a, **k): self.times.append(time.perf_counter() - self.t)

config = GRPOConfig(
    output_dir=spec["out"], per_device_train_batch_size=spec["prompts"] * spec["n"],
    num_generations=spec["n"], max_completion_length=spec["response_length"],
    max_steps=spec["steps"], learning_rate=1e-4, logging_steps=1, report_to=[], save_strategy="no",
    use_cpu=True, bf16=spec["bf16"], gradient_accumulation_steps=1, dataloader_num_workers=0,
    disable_tqdm=True, seed=1, temperature=1.0,
)
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa")
timer = Timer()
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                      processing_class=tokenizer, callbacks=[timer])
trainer.train()
print("TRL_STEP_TIMES " + json.dumps(timer.times))
"""


TRL_PPO_RUNNER = r"""
import json, sys, time
import torch
from datasets import Dataset
from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
                          TrainerCallback)
try:
    from trl.experimental.ppo import PPOConfig, PPOTrainer
except ImportError:
    from trl import PPOConfig, PPOTrainer

from rlflow.data.tasks import ensure_task_files

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
import pandas as pd
train, _ = ensure_task_files("arithmetic")
frame = pd.read_parquet(train)
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
rows = [{"input_ids": tokenizer.apply_chat_template(list(r["prompt"]), add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)}
        for _, r in frame.iterrows()]
dataset = Dataset.from_list([r for r in rows if len(r["input_ids"]) <= spec["max_prompt_length"]])

class Timer(TrainerCallback):  # PPOTrainer calls no on_step_begin: time between step ends
    def __init__(self): self.ends = []
    def on_train_begin(self, *a, **k): self.ends.append(time.perf_counter())
    def on_step_end(self, *a, **k): self.ends.append(time.perf_counter())

config = PPOConfig(
    output_dir=spec["out"], per_device_train_batch_size=spec["prompts"], num_mini_batches=1,
    num_ppo_epochs=1, gradient_accumulation_steps=1, local_rollout_forward_batch_size=spec["prompts"],
    response_length=spec["response_length"], total_episodes=spec["prompts"] * spec["steps"],
    learning_rate=1e-4, temperature=1.0, stop_token="eos", num_sample_generations=0,
    report_to=[], save_strategy="no", use_cpu=True, bf16=spec["bf16"], dataloader_num_workers=0,
    disable_tqdm=True, seed=1,
)
policy = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa")
ref = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa")
value = AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=1,
                                                           attn_implementation="sdpa")
reward_model = AutoModelForSequenceClassification.from_pretrained(spec["reward"], num_labels=1,
                                                                  attn_implementation="sdpa")
timer = Timer()
trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=ref,
                     reward_model=reward_model, train_dataset=dataset, value_model=value,
                     callbacks=[timer])
trainer.train()
print("TRL_STEP_TIMES " + json.dumps([b - a for a, b in zip(timer.ends, timer.ends[1:])]))
"""


def trl_available(ppo: bool = False, path: str | None = None) -> bool:
    """TRL importable (with ``path`` first on ``sys.path``); for ``ppo``, one that still has ``PPOTrainer``
    (TRL <= 0.29: ``trl.experimental.ppo``; TRL 1.x removed it)."""
    probe = "try:\n    import trl.experimental.ppo\nexcept ImportError:\n    from trl import PPOTrainer"
    code = probe if ppo else "import trl"
    return (
        subprocess.run([sys.executable, "-c", code], env=trl_env(path), capture_output=True).returncode == 0
    )


def trl_env(path: str | None) -> dict[str, str]:
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1")
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    return env
