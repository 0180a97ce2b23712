"""``SFTDataset``: prompt/response pairs from parquet/jsonl, chat-templated, tokenized, in PPO's layout.

It reads these keys of the ``data`` section (`rlflow.config.sft_schema.SFTDataConfig`, verl's names):
``prompt_key`` / ``prompt_dict_keys``, ``response_key`` / ``response_dict_keys``, ``max_length``,
``truncation``, ``apply_chat_template_kwargs``.

Each row gives a prompt (chat messages, or a string sent as one user message) and a response (a string).
The prompt goes through the tokenizer's chat template with the generation prompt; the response is
tokenized as it is and gets the eos token, so the model learns to stop. Every row is read, checked and
tokenized when the dataset is built: a bad row fails at once with a ``ValueError`` naming the file, the
row (0-based) and the key. A sample longer than ``max_length`` raises (``truncation=error``), keeps its
last tokens (``left``: the prompt is cut first) or its first (``right``: the response is cut; a sample
left with no response token raises).

:func:`collate_sft` lays a batch out exactly as a PPO batch after the rollout, so the SFT loss runs
through the same forward (`rlflow.models.forward.forward_micro_batch`, remove-padding, Ulysses, dynamic
batching) as the PPO actor: ``input_ids = [left-padded prompt | right-padded response]`` with
``responses`` and ``response_mask`` (the loss mask) for the response part.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from rlflow.data.io import read_rows
from rlflow.data.rl_dataset import _check_messages, _where

if TYPE_CHECKING:
    from rlflow.config.sft_schema import SFTDataConfig

__all__ = ["SFT_TRUNCATION_MODES", "SFTDataset", "collate_sft", "lookup"]

logger = logging.getLogger(__name__)

SFT_TRUNCATION_MODES = ("error", "left", "right")


def lookup(row: Mapping[str, Any], key: str, dict_keys: Sequence[str] | None, where: str) -> Any:
    """The value at ``key`` (dots reach into nested mappings), then at each of ``dict_keys`` in turn.

    Raises:
        ValueError: naming ``where`` and the missing part.
    """
    value: Any = row
    for part in [*key.split("."), *(dict_keys or [])]:
        if not isinstance(value, Mapping) or part not in value:
            have = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise ValueError(f"{where}: no {part!r} in {key!r}{list(dict_keys or [])} (found: {have})")
        value = value[part]
    return value


class SFTDataset(Dataset):
    """Tokenized prompt/response pairs (see the module docstring).

    Args:
        data_files: one path or a list of ``.parquet`` / ``.jsonl`` files.
        tokenizer: a transformers tokenizer with a chat template, a pad and an eos token.
        config: the ``data`` section.
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        config: SFTDataConfig,
    ) -> None:
        if config.truncation not in SFT_TRUNCATION_MODES:
            raise ValueError(
                f"data.truncation={config.truncation!r} must be one of {list(SFT_TRUNCATION_MODES)}"
            )
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("SFTDataset: the tokenizer needs a pad and an eos token")
        self.config, self.tokenizer = config, tokenizer
        files = [data_files] if isinstance(data_files, str | os.PathLike) else list(data_files)
        if not files:
            raise ValueError("SFTDataset: data_files is empty")
        self.data_files = [str(f) for f in files]
        self.prompts: list[list[int]] = []
        self.responses: list[list[int]] = []
        self.num_truncated = 0
        for file in self.data_files:
            rows = read_rows(file)
            if not rows:
                logger.warning("SFTDataset: %s has no rows", file)
            for i, row in enumerate(rows):
                self._add(row, file, i)
        if not self.prompts:
            raise ValueError(f"SFTDataset: no rows in {', '.join(self.data_files)}")
        if self.num_truncated:
            logger.warning(
                "SFTDataset: truncated %d of %d samples to data.max_length=%d (data.truncation=%s)",
                self.num_truncated,
                len(self.prompts),
                config.max_length,
                config.truncation,
            )

    def _prompt_ids(self, prompt: Any, where: str) -> list[int]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        messages = _check_messages(messages, where)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.config.apply_chat_template_kwargs
            )
        except Exception as exc:
            raise ValueError(f"{where}: apply_chat_template failed: {type(exc).__name__}: {exc}") from exc
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _add(self, row: Mapping[str, Any], file: str, i: int) -> None:
        cfg = self.config
        prompt = lookup(row, cfg.prompt_key, cfg.prompt_dict_keys, _where(file, i, cfg.prompt_key))
        response = lookup(row, cfg.response_key, cfg.response_dict_keys, _where(file, i, cfg.response_key))
        if not isinstance(response, str | int | float) or not str(response).strip():
            raise ValueError(
                f"{_where(file, i, cfg.response_key)}: the response must be a non-empty string, "
                f"got {response!r}"
            )
        p = self._prompt_ids(prompt, _where(file, i, cfg.prompt_key))
        r = [
            *self.tokenizer(str(response), add_special_tokens=False)["input_ids"],
            self.tokenizer.eos_token_id,
        ]
        excess = len(p) + len(r) - cfg.max_length
        if excess > 0:
            if cfg.truncation == "error":
                raise ValueError(
                    f"{_where(file, i)}: prompt + response + eos is {len(p) + len(r)} tokens > data.max_length="
                    f"{cfg.max_length} with data.truncation='error' (raise max_length, or truncation='left'/'right')"
                )
            self.num_truncated += 1
            if cfg.truncation == "left":  # keep the end: the prompt's start goes first
                cut_prompt = min(excess, len(p))
                p, r = p[cut_prompt:], r[excess - cut_prompt :]
            else:  # right: keep the start
                r = r[: max(0, len(r) - excess)]
                if not r:
                    raise ValueError(
                        f"{_where(file, i)}: the prompt alone fills data.max_length={cfg.max_length}; "
                        "truncation='right' would leave no response token to learn from"
                    )
        self.prompts.append(p)
        self.responses.append(r)

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, item: int) -> dict[str, list[int]]:
        return {"prompt_ids": self.prompts[item], "response_ids": self.responses[item]}


def collate_sft(items: Sequence[Mapping[str, Sequence[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Lay a batch out like a PPO batch after the rollout (P = longest prompt, R = longest response).

    Args:
        items: ``{"prompt_ids", "response_ids"}`` per sample.
        pad_token_id: id on the pads.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``: (bs, P + R); ``responses``, ``response_mask``:
        (bs, R) — prompts left-padded, responses right-padded; positions 0 on the left pads, then 0, 1, ...
        from each sample's first token, continuing over the right pads (as after a rollout).
    """
    if not items:
        raise ValueError("collate_sft: empty batch")
    width_p = max(len(x["prompt_ids"]) for x in items)
    width_r = max(len(x["response_ids"]) for x in items)
    bs = len(items)
    prompts = torch.full((bs, width_p), pad_token_id, dtype=torch.long)
    responses = torch.full((bs, width_r), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((bs, width_p), dtype=torch.long)
    response_mask = torch.zeros((bs, width_r), dtype=torch.long)
    for b, x in enumerate(items):
        p, r = list(x["prompt_ids"]), list(x["response_ids"])
        if p:
            prompts[b, width_p - len(p) :] = torch.tensor(p)
            prompt_mask[b, width_p - len(p) :] = 1
        responses[b, : len(r)] = torch.tensor(r)
        response_mask[b, : len(r)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    response_pos = prompt_mask.sum(-1, keepdim=True) + torch.arange(width_r)[None]  # as a rollout's
    position_ids = torch.cat([prompt_pos, response_pos], dim=1)
    return {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": response_mask,
    }
