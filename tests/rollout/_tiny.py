"""Shared helpers for the rollout tests: a tiny fp32 Qwen2 model and left-padded prompt batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlflow.config import config_section
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.protocol import DataProto

PAD_ID = 0
TINY = TinyModelConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.2,  # peaked next-token distributions: greedy margins far above fp noise
)


def rollout_config(**overrides):
    """The default ``actor_rollout_ref.rollout`` section with ``overrides`` (``val_kwargs__n=2``)."""
    return config_section("actor_rollout_ref.rollout", **overrides)


def tiny_model(seed: int = 0) -> torch.nn.Module:
    """The tiny Qwen2 (vocab 272, fp32, eval mode) used by every rollout test."""
    return build_tiny_model(TINY, seed=seed)


def make_prompts(
    token_lists: Sequence[Sequence[int]],
    width: int,
    meta_info: dict | None = None,
    non_tensors: dict | None = None,
) -> DataProto:
    """Left-pad each token list to ``width``; positions count from 0 at each row's first real token."""
    rows = len(token_lists)
    ids = torch.full((rows, width), PAD_ID, dtype=torch.int64)
    mask = torch.zeros((rows, width), dtype=torch.int64)
    for i, toks in enumerate(token_lists):
        ids[i, width - len(toks) :] = torch.tensor(list(toks))
        mask[i, width - len(toks) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        non_tensors=non_tensors,
        meta_info={"pad_token_id": PAD_ID, **(meta_info or {})},
    )


def random_token_lists(lengths: Sequence[int], seed: int) -> list[list[int]]:
    """Byte-range token ids (3..258) for prompts of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 259, (n,), generator=gen).tolist() for n in lengths]


def full_forward_logits(model: torch.nn.Module, out: DataProto) -> torch.Tensor:
    """Logits of the response tokens from one fresh forward over a rollout's whole sequences:
    (bs, resp_len, vocab), float32."""
    b = out.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    prompt_len = b["prompts"].shape[1]
    return logits[:, prompt_len - 1 : -1].float()
