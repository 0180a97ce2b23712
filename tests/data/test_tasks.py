"""Synthetic tasks: schema, seeded splits, cached files, prompt lengths."""

from __future__ import annotations

import os

import pytest

from rlflow.data import tasks
from rlflow.data.io import read_rows
from rlflow.models.tiny import CACHE_DIR_ENV, build_tiny_tokenizer


def test_repeat_rows_schema_and_answers():
    rows = tasks.make_rows("repeat", "train", n=200, seed=0)
    assert rows[0].keys() == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for i, r in enumerate(rows):
        info = r["extra_info"]
        assert r["data_source"] == "rlflow/repeat"
        assert r["prompt"] == [{"role": "user", "content": f"repeat {info['letter']} x{info['count']}"}]
        assert r["reward_model"] == {"style": "rule", "ground_truth": info["letter"] * info["count"]}
        assert info["split"] == "train" and info["index"] == i
    assert {r["extra_info"]["letter"] for r in rows} == set("abcde")
    assert {r["extra_info"]["count"] for r in rows} == {2, 3, 4, 5}


def test_arithmetic_rows():
    rows = tasks.make_rows("arithmetic", "val", n=100, seed=0)
    for r in rows:
        a, b, op = r["extra_info"]["a"], r["extra_info"]["b"], r["extra_info"]["op"]
        assert 0 <= a < 1000 and 0 <= b < 1000
        assert r["reward_model"]["ground_truth"] == str({"+": a + b, "-": a - b, "*": a * b}[op])
        assert r["prompt"][0]["content"].startswith(f"What is {a} {op} {b}? ")
    assert {r["extra_info"]["op"] for r in rows} == {"+", "-", "*"}


def test_splits_are_seeded():
    assert tasks.make_rows("repeat", "train", 50, seed=0) == tasks.make_rows("repeat", "train", 50, seed=0)
    assert tasks.make_rows("repeat", "train", 50, seed=0) != tasks.make_rows("repeat", "val", 50, seed=0)
    assert tasks.make_rows("repeat", "train", 50, seed=0) != tasks.make_rows("repeat", "train", 50, seed=1)
    with pytest.raises(ValueError, match="split='test' must be one of"):
        tasks.make_rows("repeat", "test")
    with pytest.raises(ValueError, match="unknown synthetic task 'sort'"):
        tasks.make_rows("sort", "train")


def test_ensure_task_files_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    train, val = tasks.ensure_task_files("repeat", train_size=64, val_size=16)
    assert os.path.dirname(train).startswith(str(tmp_path / "data" / "repeat-"))
    assert read_rows(train) == tasks.make_rows("repeat", "train", 64, seed=0)
    assert read_rows(val) == tasks.make_rows("repeat", "val", 16, seed=0)
    mtime = os.stat(train).st_mtime_ns
    assert tasks.ensure_task_files("repeat", train_size=64, val_size=16) == (train, val)
    assert os.stat(train).st_mtime_ns == mtime
    assert tasks.ensure_task_files("repeat", train_size=64, val_size=16, seed=1)[0] != train
    out = tasks.ensure_task_files("arithmetic", out_dir=tmp_path / "arith", train_size=8, val_size=4)
    assert out == (str(tmp_path / "arith" / "train.parquet"), str(tmp_path / "arith" / "val.parquet"))
    assert len(read_rows(out[1])) == 4


def test_repeat_prompts_fit_32_tokens():
    tok = build_tiny_tokenizer()
    rows = tasks.make_rows("repeat", "val", seed=0)
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    lengths = {len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]}
    # every prompt is "repeat X xN": 19 template tokens + 11 characters (one token per byte)
    assert lengths == {30}
    longest_answer = max(len(r["reward_model"]["ground_truth"]) for r in rows)
    assert longest_answer + 1 <= tasks.RepeatTask().response_length  # answer + eos fits in 8 tokens
