"""Mean score of the random-init tiny model on the easy task's validation split (the PPO baseline).

    python scripts/baseline_easy_task.py [--seed 0] [--response-length 8] [--sample-seeds 0 1 2]

Plain Hugging Face ``generate`` on the left-padded prompts of ``RLHFDataset`` (``max_prompt_length=32``),
responses cut at the first eos, scored by ``NaiveRewardManager`` with ``default_compute_score``. Prints the
greedy score and the temperature-1.0 sampling score (pure sampling: ``top_k=0``, ``top_p=1``) per sampling
seed. The numbers are recorded in ``docs/baselines.md``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rlflow.data.rl_dataset import RLHFDataset, collate_fn
from rlflow.data.tasks import EASY_TASK, ensure_task_files
from rlflow.models.loader import load_causal_lm, load_tokenizer
from rlflow.models.tiny import get_tiny_model_path
from rlflow.protocol import DataProto
from rlflow.reward import NaiveRewardManager


def response_mask(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """(bs, response_len) 1 up to and including the first eos, 0 after it."""
    is_eos = (responses == eos_token_id).to(torch.long)
    after_eos = (torch.cumsum(is_eos, dim=-1) - is_eos) > 0
    return (~after_eos).to(torch.long)


def rollout_scores(model, tokenizer, batch: dict, response_length: int, do_sample: bool, seed: int) -> dict:
    """Generate responses for a collated batch and score them; returns per-sample score and acc arrays."""
    torch.manual_seed(seed)
    prompts = batch["input_ids"]
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts,
            attention_mask=batch["attention_mask"],
            max_new_tokens=response_length,
            do_sample=do_sample,
            temperature=1.0 if do_sample else None,
            top_k=0 if do_sample else None,
            top_p=1.0 if do_sample else None,
            eos_token_id=None,  # always generate response_length tokens; cut at the first eos below
            pad_token_id=tokenizer.pad_token_id,
        )
    responses = out[:, prompts.shape[1] :]
    mask = response_mask(responses, tokenizer.eos_token_id)
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, tokenizer.pad_token_id))
    data = DataProto.from_single_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": torch.cat([batch["attention_mask"], mask], dim=-1),
            "data_source": batch["data_source"],
            "reward_model": batch["reward_model"],
            "extra_info": batch["extra_info"],
        }
    )
    result = NaiveRewardManager(tokenizer, num_examine=0)(data, return_dict=True)
    info = result["reward_extra_info"]
    return {"score": np.array(info["score"]), "acc": np.array(info["acc"]), "len": mask.sum(-1).float()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0, help="tiny-model weight seed")
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--sample-seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = get_tiny_model_path(seed=args.seed)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, attn_implementation="sdpa").eval()
    _, val_file = ensure_task_files(EASY_TASK)
    dataset = RLHFDataset([val_file], tokenizer, {"max_prompt_length": 32})
    batch = collate_fn([dataset[i] for i in range(len(dataset))])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {path} ({n_params} parameters), task {EASY_TASK} val ({len(dataset)} prompts)")
    greedy = rollout_scores(model, tokenizer, batch, args.response_length, do_sample=False, seed=0)
    print(f"greedy: mean score {greedy['score'].mean():.4f}, acc {greedy['acc'].mean():.4f}")
    for seed in args.sample_seeds:
        r = rollout_scores(model, tokenizer, batch, args.response_length, do_sample=True, seed=seed)
        print(
            f"temperature 1.0, sampling seed {seed}: mean score {r['score'].mean():.4f}, "
            f"acc {r['acc'].mean():.4f}, mean response tokens {r['len'].mean():.2f}"
        )


if __name__ == "__main__":
    main()
