"""``RLHFDataset``: prompts from parquet/jsonl files, chat-templated, tokenized and left-padded.

It reads these keys of the ``data`` section (`rlflow.config.schema.DataConfig`, verl's names):
``prompt_key``, ``max_prompt_length``, ``filter_overlong_prompts``, ``truncation``, ``return_raw_chat``,
``return_full_prompt``, ``apply_chat_template_kwargs``, ``continuous_token`` (who renders the prompt:
`rlflow.data.prompt_builders`).

All rows are read, checked and tokenized when the dataset is built, so bad input fails at once with a
``ValueError`` naming the file, the row (0-based) and the key. Prompts longer than ``max_prompt_length`` are
dropped (counted and logged) when ``filter_overlong_prompts`` is on; otherwise ``truncation`` decides:
``error`` raises, ``left`` keeps the last tokens, ``right`` the first, ``middle`` both ends.

One item (see :meth:`RLHFDataset.__getitem__`), ``L = max_prompt_length``:

* ``input_ids``: (L,) long, left-padded with ``tokenizer.pad_token_id``;
* ``attention_mask``: (L,) long, 0 on pads;
* ``position_ids``: (L,) long, 0 on pads, then 0, 1, 2, ... from the first real token;
* ``raw_prompt_ids``: list[int], the unpadded (possibly truncated) prompt tokens;
* ``index``: ``extra_info["index"]`` when present, else the row's position in the dataset;
* every other column of the row (``data_source``, ``reward_model``, ``extra_info``, ``ability``, ...);
* ``raw_prompt`` (the chat messages) when ``return_raw_chat``; ``full_prompts`` (the templated text) when
  ``return_full_prompt``.

:func:`collate_fn` stacks tensors and turns everything else into 1-D numpy object arrays, ready for
``DataProto.from_single_dict``. :func:`create_rl_dataloader` gives a resumable, seeded loader
(:mod:`rlflow.data.sampler`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rlflow.data.io import read_rows
from rlflow.data.prompt_builders import prompt_renderer
from rlflow.data.sampler import StatefulDataLoader, StatefulSampler

if TYPE_CHECKING:
    from rlflow.config.schema import DataConfig

__all__ = [
    "TRUNCATION_MODES",
    "RLHFDataset",
    "collate_fn",
    "create_rl_dataloader",
    "left_pad_prompt",
]

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")


def left_pad_prompt(ids: Sequence[int], length: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Left-pad one prompt.

    Args:
        ids: prompt token ids, ``len(ids) <= length``.
        length: padded length ``L``.
        pad_token_id: id written on the pads.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``, each (L,) long; positions are 0 on pads and
        count 0, 1, ... from the first real token.
    """
    n_pad = length - len(ids)
    if n_pad < 0:
        raise ValueError(f"prompt of {len(ids)} tokens does not fit in {length}")
    input_ids = torch.tensor([pad_token_id] * n_pad + list(ids), dtype=torch.long)
    attention_mask = torch.cat([torch.zeros(n_pad, dtype=torch.long), torch.ones(len(ids), dtype=torch.long)])
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def _where(file: str, row: int, key: str | None = None) -> str:
    return f"file {file!r}, row {row}" + (f", key {key!r}" if key else "")


def _check_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """Validate one prompt: a non-empty list of ``{"role": str, "content": str}`` with some content."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise ValueError(
            f"{where}: expected a list of chat messages {{'role', 'content'}}, got {type(value).__name__}"
        )
    if len(value) == 0:
        raise ValueError(f"{where}: empty prompt (no messages)")
    messages = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise ValueError(
                f"{where}: message {i} must be a dict with 'role' and 'content', got {type(msg).__name__}"
            )
        for part in ("role", "content"):
            if not isinstance(msg.get(part), str):
                got = type(msg.get(part)).__name__ if part in msg else "nothing"
                raise ValueError(f"{where}: message {i} needs a string {part!r}, got {got}")
        messages.append(dict(msg))
    if not any(m["content"].strip() for m in messages):
        raise ValueError(f"{where}: empty prompt (every message content is empty)")
    return messages


def _truncate(ids: list[int], length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``length`` tokens: keep the end (left), the start (right) or both ends (middle)."""
    if mode == "left":
        return ids[-length:]
    if mode == "right":
        return ids[:length]
    head = length // 2
    return ids[:head] + ids[len(ids) - (length - head) :]


class RLHFDataset(Dataset):
    """Prompt dataset for RL (see the module docstring for the item layout).

    Args:
        data_files: one path or a list of ``.parquet`` / ``.jsonl`` files.
        tokenizer: a transformers tokenizer with a chat template and a pad token.
        config: the ``data`` section (`rlflow.config.schema.DataConfig`).
        max_samples: > 0 keeps that many rows of the files, before overlong prompts are filtered (verl's
            argument, from ``data.train_max_samples`` / ``val_max_samples``): drawn without replacement with
            ``config.seed`` when ``config.shuffle``, else the first ones; -1 keeps every row.
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        config: DataConfig,
        max_samples: int = -1,
    ):
        if config.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={config.truncation!r} must be one of {list(TRUNCATION_MODES)}")
        self.config = config
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "RLHFDataset: the tokenizer has no pad token (load it with rlflow.models.load_tokenizer)"
            )
        self.tokenizer = tokenizer
        if isinstance(data_files, str | os.PathLike):
            data_files = [data_files]
        self.data_files = [str(f) for f in data_files]
        if not self.data_files:
            raise ValueError("RLHFDataset: data_files is empty")
        self.num_filtered = 0
        self.max_samples = int(max_samples)
        # data.continuous_token: the chat template or the checkpoint's own encoder (rlflow.data.prompt_builders)
        self._render, self._render_family = prompt_renderer(tokenizer, config)
        self._build()

    # ---- building --------------------------------------------------------------------------------------

    def _read_all(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(file, row, row dict) for every row of every file, in order."""
        entries = []
        for file in self.data_files:
            rows = read_rows(file)
            if not rows:
                logger.warning("RLHFDataset: %s has no rows", file)
            entries.extend((file, i, row) for i, row in enumerate(rows))
        if 0 < self.max_samples < len(entries):
            if self.config.shuffle:
                keep = np.random.default_rng(int(self.config.seed)).choice(
                    len(entries), self.max_samples, replace=False
                )
            else:
                keep = np.arange(self.max_samples)
            logger.info(
                "RLHFDataset: %d of the files' %d rows kept (max_samples)", self.max_samples, len(entries)
            )
            entries = [entries[i] for i in keep.tolist()]
        return entries

    def _template(self, messages: list[dict[str, Any]], where: str) -> str:
        try:
            return self._render(messages)
        except Exception as exc:
            what = (
                "apply_chat_template" if self._render_family == "chat_template" else "the DeepSeek-V4 encoder"
            )
            raise ValueError(f"{where}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def _check_text_only(self, data: dict[str, Any], file: str, row: int) -> None:
        for what, name in (("images", "image_key"), ("videos", "video_key")):
            column = getattr(self.config, name)
            value = data.get(column)
            if value is not None and not (hasattr(value, "__len__") and len(value) == 0):
                raise ValueError(
                    f"{_where(file, row, column)}: the row has {what} (column data.{name}={column!r}); rlflow "
                    "trains text-only models and has no multimodal processor: drop the column, or give prompts "
                    "without images"
                )

    def _columns(self, entries: list[tuple[str, int, dict[str, Any]]]) -> list[str]:
        """All non-prompt columns; rows lacking one get None for it (logged once per file and column)."""
        columns = sorted({c for _, _, data in entries for c in data} - {self.config.prompt_key})
        missing: dict[tuple[str, str], int] = {}
        for file, _, data in entries:
            for c in columns:
                if c not in data:
                    missing[(file, c)] = missing.get((file, c), 0) + 1
        for (file, c), count in missing.items():
            logger.warning("RLHFDataset: %d row(s) of %s lack column %r; filled with None", count, file, c)
        return columns

    def _build(self) -> None:
        cfg, key = self.config, self.config.prompt_key
        limit, drop_overlong, truncation = cfg.max_prompt_length, cfg.filter_overlong_prompts, cfg.truncation
        entries = self._read_all()
        messages, texts = [], []
        for file, row, data in entries:
            if key not in data or data[key] is None:
                raise ValueError(f"{_where(file, row)}: missing prompt key {key!r} (columns: {sorted(data)})")
            self._check_text_only(data, file, row)
            messages.append(_check_messages(data[key], _where(file, row, key)))
            texts.append(self._template(messages[-1], _where(file, row, key)))
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        columns = self._columns(entries)
        self._ids, self._rows, self._messages, self._texts = [], [], [], []
        for (file, row, data), msgs, text, ids in zip(entries, messages, texts, encoded):
            ids = list(ids)
            if len(ids) > limit:
                if drop_overlong:
                    self.num_filtered += 1
                    continue
                if truncation == "error":
                    raise ValueError(
                        f"{_where(file, row, key)}: prompt has {len(ids)} tokens > data.max_prompt_length="
                        f"{limit} with data.truncation='error' (set "
                        "data.filter_overlong_prompts=True to drop such prompts, or truncation='left'/'right')"
                    )
                ids = _truncate(ids, limit, truncation)
            self._rows.append({c: data.get(c) for c in columns})
            self._ids.append(ids)
            self._messages.append(msgs)
            self._texts.append(text)
        if self.num_filtered:
            logger.warning(
                "RLHFDataset: filtered %d of %d prompts longer than data.max_prompt_length=%d (%s)",
                self.num_filtered,
                len(entries),
                cfg.max_prompt_length,
                ", ".join(self.data_files),
            )
        logger.info("RLHFDataset: %d prompts from %d file(s)", len(self._ids), len(self.data_files))

    # ---- items -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, item: int) -> dict[str, Any]:
        """One prompt: padded tensors of shape (max_prompt_length,) and the row's other columns."""
        ids = self._ids[item]
        out: dict[str, Any] = left_pad_prompt(ids, self.config.max_prompt_length, self.tokenizer.pad_token_id)
        out["raw_prompt_ids"] = list(ids)
        row = self._rows[item]
        out.update(row)
        extra = row.get("extra_info")
        out["index"] = (
            extra["index"] if isinstance(extra, Mapping) and extra.get("index") is not None else item
        )
        if self.config.return_raw_chat:
            out["raw_prompt"] = [dict(m) for m in self._messages[item]]
        if self.config.return_full_prompt:
            out["full_prompts"] = self._texts[item]
        return out


def collate_fn(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack a list of items into a batch.

    Args:
        samples: items of :class:`RLHFDataset` (same keys).

    Returns:
        Tensors stacked to ``(bs, ...)``; every other key as a 1-D numpy object array of length ``bs``
        (nested lists stay whole), ready for ``DataProto.from_single_dict``.
    """
    if not samples:
        raise ValueError("collate_fn: empty batch")
    keys = list(samples[0])
    for i, sample in enumerate(samples):
        if set(sample) != set(keys):
            raise ValueError(f"collate_fn: sample {i} has keys {sorted(sample)}, sample 0 has {sorted(keys)}")
    batch: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in samples]
        if isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        else:
            arr = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                arr[i] = value
            batch[key] = arr
    return batch


def create_rl_dataloader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = True,
    num_workers: int = 0,
    collate: Any = collate_fn,
) -> StatefulDataLoader:
    """A resumable loader over ``dataset`` (``state_dict`` / ``load_state_dict`` go into checkpoints).

    Args:
        dataset: usually an :class:`RLHFDataset`.
        batch_size: prompts per batch (``data.train_batch_size``).
        shuffle: reshuffle each epoch with a seeded permutation.
        seed: permutation seed.
        drop_last: drop each epoch's incomplete last batch.
        num_workers: loader worker processes.
        collate: batch function (default :func:`collate_fn`).

    Returns:
        A :class:`StatefulDataLoader`.
    """
    sampler = StatefulSampler(len(dataset), shuffle=shuffle, seed=seed)
    return StatefulDataLoader(
        dataset, batch_size, sampler, collate, drop_last=drop_last, num_workers=num_workers
    )
