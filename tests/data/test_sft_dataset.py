"""``SFTDataset`` and ``collate_sft``: token layout checked by hand on the byte-level tiny tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlflow.config.loading import load_sft_config, to_typed_sft
from rlflow.data.io import write_parquet
from rlflow.data.sft_dataset import SFTDataset, collate_sft, lookup
from rlflow.models.tiny import build_tiny_tokenizer

TOK = build_tiny_tokenizer()
PAD, BOS, EOS = 0, 1, 2


def _bytes(text: str) -> list[int]:
    return [3 + b for b in text.encode()]


def _prompt_ids(content: str) -> list[int]:
    # ChatML: <|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n
    return [BOS, *_bytes("user\n" + content), EOS, *_bytes("\n"), BOS, *_bytes("assistant\n")]


def _data(**overrides) -> object:
    return to_typed_sft(load_sft_config([f"data.{k}={v}" for k, v in overrides.items()])).data


def _write(tmp_path: Path, rows: list[dict], name: str = "d.parquet") -> str:
    return write_parquet(rows, tmp_path / name)


def test_rows_are_templated_tokenized_and_end_with_eos(tmp_path: Path):
    rows = [
        {"prompt": [{"role": "user", "content": "repeat a x2"}], "reward_model": {"ground_truth": "aa"}},
        {"prompt": "hi", "reward_model": {"ground_truth": "b"}},  # a string prompt is one user message
    ]
    path = tmp_path / "mixed.jsonl"  # parquet cannot mix list and string prompts in one column; jsonl can
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ds = SFTDataset(str(path), TOK, _data())
    assert ds[0] == {"prompt_ids": _prompt_ids("repeat a x2"), "response_ids": [*_bytes("aa"), EOS]}
    assert ds[1] == {"prompt_ids": _prompt_ids("hi"), "response_ids": [*_bytes("b"), EOS]}


def test_collate_lays_the_batch_out_as_after_a_rollout():
    batch = collate_sft(
        [
            {"prompt_ids": [5, 6, 7], "response_ids": [8, EOS]},
            {"prompt_ids": [9], "response_ids": [10, 11, EOS]},
        ],
        pad_token_id=PAD,
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, EOS, PAD], [PAD, PAD, 9, 10, 11, EOS]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]]
    assert batch["responses"].tolist() == [[8, EOS, PAD], [10, 11, EOS]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]


def test_dotted_keys_and_verl_dict_keys(tmp_path: Path):
    rows = [{"extra_info": {"question": "q?", "answer": "42"}}]
    path = _write(tmp_path, rows)
    verl_style = _data(prompt_key="extra_info", response_key="extra_info")
    verl_style.prompt_dict_keys, verl_style.response_dict_keys = ["question"], ["answer"]
    dotted = _data(prompt_key="extra_info.question", response_key="extra_info.answer")
    assert SFTDataset(path, TOK, verl_style)[0] == SFTDataset(path, TOK, dotted)[0]
    assert SFTDataset(path, TOK, dotted)[0]["response_ids"] == [*_bytes("42"), EOS]
    with pytest.raises(
        ValueError, match=r"here: no 'answer' in 'extra_info'\['question', 'answer'\] \(found: str\)"
    ):
        lookup(rows[0], "extra_info", ["question", "answer"], "here")


def test_truncation_modes(tmp_path: Path):
    path = _write(tmp_path, [{"prompt": "abcdefgh", "reward_model": {"ground_truth": "xyz"}}])
    full_p, full_r = _prompt_ids("abcdefgh"), [*_bytes("xyz"), EOS]
    limit = len(full_p) + 2  # two tokens too many
    with pytest.raises(
        ValueError, match=r"d\.parquet', row 0: prompt \+ response \+ eos is 31 tokens > data\.max_length=29"
    ):
        SFTDataset(path, TOK, _data(max_length=limit))
    left = SFTDataset(path, TOK, _data(max_length=limit, truncation="left"))[0]
    assert left == {"prompt_ids": full_p[2:], "response_ids": full_r}
    right = SFTDataset(path, TOK, _data(max_length=limit, truncation="right"))[0]
    assert right == {"prompt_ids": full_p, "response_ids": full_r[:2]}
    with pytest.raises(ValueError, match="leave no response token"):
        SFTDataset(path, TOK, _data(max_length=len(full_p), truncation="right"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "q"}, r"row 1, key 'reward_model\.ground_truth': no 'reward_model'"),
        ({"prompt": "q", "reward_model": {"ground_truth": "  "}}, "the response must be a non-empty string"),
        ({"prompt": [], "reward_model": {"ground_truth": "a"}}, r"row 1, key 'prompt': empty prompt"),
    ],
)
def test_bad_rows_name_file_row_and_key(tmp_path: Path, row: dict, message: str):
    path = tmp_path / "bad.jsonl"
    good = {"prompt": "q", "reward_model": {"ground_truth": "a"}}
    path.write_text("\n".join(json.dumps(r) for r in (good, row)))
    with pytest.raises(ValueError, match=message):
        SFTDataset(str(path), TOK, _data())


def test_collated_ids_match_the_dataset(tmp_path: Path):
    rows = [{"prompt": "p" * n, "reward_model": {"ground_truth": "r" * (4 - n)}} for n in (1, 2, 3)]
    ds = SFTDataset(_write(tmp_path, rows), TOK, _data())
    batch = collate_sft([ds[i] for i in range(3)], PAD)
    for i in range(3):
        valid = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert valid == ds[i]["prompt_ids"] + ds[i]["response_ids"]
        assert batch["responses"][i][batch["response_mask"][i].bool()].tolist() == ds[i]["response_ids"]
    assert torch.equal(batch["input_ids"][:, -batch["responses"].shape[1] :], batch["responses"])
