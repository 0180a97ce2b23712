"""GSM8K preprocessing: local jsonl / parquet -> verl schema with the instruction suffix."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from rlflow.data.gsm8k import GSM8K_INSTRUCTION, convert_gsm8k_file, gsm8k_ground_truth
from rlflow.data.io import read_rows, write_parquet

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "data" / "gsm8k.py"
RECORDS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 twice. Total?", "answer": "2 * 1200 = 2400\n#### 2,400"},
]


def test_ground_truth_extraction():
    assert gsm8k_ground_truth("work\n#### 7") == "7"
    assert gsm8k_ground_truth("#### 1 #### 1,234,567") == "1234567"
    assert gsm8k_ground_truth("#### -3") == "-3"
    with pytest.raises(ValueError, match="row 4: GSM8K answer must be a string containing '####'"):
        gsm8k_ground_truth("no marker", "row 4")


def test_convert_jsonl_and_parquet(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = read_rows(convert_gsm8k_file(src, tmp_path / "out" / "train.parquet", "train"))
    assert GSM8K_INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert out[1] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": RECORDS[1]["question"] + " " + GSM8K_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2400"},
        "extra_info": {
            "split": "train",
            "index": 1,
            "answer": RECORDS[1]["answer"],
            "question": RECORDS[1]["question"],
        },
    }
    parquet_src = write_parquet(RECORDS, tmp_path / "test-00000-of-00001.parquet")
    out2 = read_rows(convert_gsm8k_file(parquet_src, tmp_path / "out" / "test.parquet", "test"))
    assert [r["reward_model"]["ground_truth"] for r in out2] == ["7", "2400"]
    assert out2[0]["extra_info"]["split"] == "test"


def test_bad_record_names_file_and_row(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({"question": "q", "answer": 5}) + "\n")
    with pytest.raises(ValueError, match=f"file '{src}', row 1, key 'answer': expected a string, got int"):
        convert_gsm8k_file(src, tmp_path / "o.parquet", "train")


def test_script(tmp_path, monkeypatch, capsys):
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    argv = ["gsm8k.py", "--train_file", str(src), "--test_file", str(src), "--local_dir", str(tmp_path / "o")]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(SCRIPT), run_name="__main__")
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "o" / "train.parquet"),
        str(tmp_path / "o" / "test.parquet"),
    ]
    assert len(read_rows(tmp_path / "o" / "test.parquet")) == 2
