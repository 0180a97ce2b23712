"""RLHFDataset: exact tensors on hand-made rows, filtering counts, truncation, every error message."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from rlflow.data.io import write_parquet
from rlflow.data.rl_dataset import RLHFDataset, collate_fn, left_pad_prompt
from rlflow.models.tiny import build_tiny_tokenizer
from rlflow.protocol import DataProto

# Chat-templated prompt of a single user message with content c:
# [1] + "user\n" + c + [2] + "\n" + [1] + "assistant\n"  ->  19 + len(c) tokens (one per byte, id = 3 + byte)
HEAD = [1, *[3 + b for b in b"user\n"]]
TAIL = [2, 3 + 10, 1, *[3 + b for b in b"assistant\n"]]


def _cfg(**overrides):
    """The ``data`` section; these tests keep overlong prompts unless they say otherwise."""
    from rlflow.config import config_section

    return config_section("data", **{"filter_overlong_prompts": False, **overrides})


def ids_of(content: str) -> list[int]:
    return HEAD + [3 + b for b in content.encode()] + TAIL


def row(content, index=None, **extra):
    out = {
        "data_source": "rlflow/repeat",
        "prompt": [{"role": "user", "content": content}],
        "ability": "copy",
        "reward_model": {"style": "rule", "ground_truth": content.upper()},
        "extra_info": {"split": "train", "index": index},
    }
    out.update(extra)
    return out


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_left_pad_prompt_exact():
    out = left_pad_prompt([7, 8, 9], 5, pad_token_id=0)
    assert out["input_ids"].tolist() == [0, 0, 7, 8, 9]
    assert out["attention_mask"].tolist() == [0, 0, 1, 1, 1]
    assert out["position_ids"].tolist() == [0, 0, 0, 1, 2]
    assert left_pad_prompt([4], 1, 0)["position_ids"].tolist() == [0]


def test_item_tensors_on_hand_made_rows(tmp_path, tok):
    f = write_parquet([row("ab", index=10), row("hello", index=11)], tmp_path / "a.parquet")
    ds = RLHFDataset([f], tok, _cfg(max_prompt_length=24, return_raw_chat=True, return_full_prompt=True))
    assert len(ds) == 2 and ds.num_filtered == 0
    item = ds[0]
    assert len(ids_of("ab")) == 21
    assert item["input_ids"].tolist() == [0, 0, 0, *ids_of("ab")]
    assert item["attention_mask"].tolist() == [0] * 3 + [1] * 21
    assert item["position_ids"].tolist() == [0, 0, 0, *range(21)]
    assert item["raw_prompt_ids"] == ids_of("ab")
    assert item["input_ids"].dtype == torch.long and item["position_ids"].dtype == torch.long
    assert item["data_source"] == "rlflow/repeat" and item["ability"] == "copy"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "AB"}
    assert item["extra_info"] == {"split": "train", "index": 10} and item["index"] == 10
    assert item["raw_prompt"] == [{"role": "user", "content": "ab"}]
    assert item["full_prompts"] == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    assert "prompt" not in item
    assert ds[1]["input_ids"].tolist() == ids_of("hello")  # 24 tokens: no padding
    assert ds[1]["position_ids"].tolist() == list(range(24))


def test_several_files_and_default_index(tmp_path, tok):
    a = write_jsonl(tmp_path / "a.jsonl", [row("x"), row("yy")])
    b = write_parquet([row("zzz", index=5)], tmp_path / "b.parquet")
    ds = RLHFDataset([a, b], tok, _cfg(max_prompt_length=32))
    assert [len(ds[i]["raw_prompt_ids"]) for i in range(3)] == [20, 21, 22]
    assert [ds[i]["index"] for i in range(3)] == [0, 1, 5]  # extra_info.index when set, else position


def test_filter_overlong_counts_and_logs(tmp_path, tok, caplog):
    f = write_parquet([row("a"), row("abcdefghij"), row("abcde"), row("abcdef")], tmp_path / "f.parquet")
    with caplog.at_level(logging.WARNING, logger="rlflow.data.rl_dataset"):
        ds = RLHFDataset(f, tok, _cfg(max_prompt_length=24, filter_overlong_prompts=True))
    # lengths 20, 29, 24, 25 -> two longer than 24
    assert ds.num_filtered == 2 and len(ds) == 2
    assert [ds[i]["raw_prompt_ids"] for i in range(2)] == [ids_of("a"), ids_of("abcde")]
    assert "filtered 2 of 4 prompts longer than data.max_prompt_length=24" in caplog.text


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("left", lambda ids: ids[-24:]),
        ("right", lambda ids: ids[:24]),
        ("middle", lambda ids: ids[:12] + ids[-12:]),
    ],
)
def test_truncation_modes(tmp_path, tok, mode, expected):
    f = write_parquet([row("abcdefghij")], tmp_path / "f.parquet")
    ds = RLHFDataset(f, tok, _cfg(max_prompt_length=24, filter_overlong_prompts=False, truncation=mode))
    full = ids_of("abcdefghij")
    assert len(full) == 29
    assert ds[0]["raw_prompt_ids"] == expected(full)
    assert ds[0]["input_ids"].tolist() == expected(full)
    assert ds[0]["attention_mask"].tolist() == [1] * 24


def test_truncation_error_names_file_row_key(tmp_path, tok):
    f = write_parquet([row("a"), row("b"), row("abcdefghij")], tmp_path / "long.parquet")
    cfg = _cfg(max_prompt_length=24, filter_overlong_prompts=False, truncation="error")
    with pytest.raises(ValueError) as err:
        RLHFDataset(f, tok, cfg)
    msg = str(err.value)
    assert f"file '{f}', row 2, key 'prompt'" in msg and "29 tokens > data.max_prompt_length=24" in msg


def _error(tmp_path, tok, rows, **cfg):
    f = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError) as err:
        RLHFDataset(f, tok, _cfg(max_prompt_length=64, **cfg))
    return f, str(err.value)


def test_error_missing_prompt_key(tmp_path, tok):
    f, msg = _error(tmp_path, tok, [row("a"), {"data_source": "x", "question": "hi"}])
    assert msg.startswith(f"file '{f}', row 1: missing prompt key 'prompt'")
    f, msg = _error(tmp_path, tok, [row("a")], prompt_key="messages")
    assert msg.startswith(f"file '{f}', row 0: missing prompt key 'messages'")


def test_error_wrong_type(tmp_path, tok):
    f, msg = _error(tmp_path, tok, [{"prompt": "just a string"}])
    assert msg == (
        f"file '{f}', row 0, key 'prompt': expected a list of chat messages {{'role', 'content'}}, got str"
    )
    f, msg = _error(tmp_path, tok, [{"prompt": [{"role": "user", "content": 3}]}])
    assert msg == f"file '{f}', row 0, key 'prompt': message 0 needs a string 'content', got int"
    f, msg = _error(tmp_path, tok, [{"prompt": [{"content": "hi"}]}])
    assert msg == f"file '{f}', row 0, key 'prompt': message 0 needs a string 'role', got nothing"
    f, msg = _error(tmp_path, tok, [{"prompt": ["hi"]}])
    assert msg.startswith(f"file '{f}', row 0, key 'prompt': message 0 must be a dict")


def test_error_empty_prompt(tmp_path, tok):
    f, msg = _error(tmp_path, tok, [row("a"), {"prompt": []}])
    assert msg == f"file '{f}', row 1, key 'prompt': empty prompt (no messages)"
    f, msg = _error(tmp_path, tok, [{"prompt": [{"role": "user", "content": "  "}]}])
    assert msg == f"file '{f}', row 0, key 'prompt': empty prompt (every message content is empty)"


def test_rows_with_images_or_videos_are_refused_naming_the_row(tmp_path, tok):
    """verl's multimodal columns (``data.image_key`` / ``video_key``): empty or absent is text; a row with
    images is refused rather than trained on as text without them (parquet: a list column)."""
    rows = [row("a", images=[]), row("b", images=None), row("c", images=[{"image": "x.png"}])]
    f = str(tmp_path / "vl.parquet")
    write_parquet(rows, f)
    with pytest.raises(ValueError) as err:
        RLHFDataset(f, tok, _cfg(max_prompt_length=64))
    assert str(err.value).startswith(
        f"file '{f}', row 2, key 'images': the row has images (column data.image_key='images'); rlflow "
        "trains text-only models"
    )
    f, msg = _error(tmp_path, tok, [row("a"), row("b", clips=["v.mp4"])], video_key="clips")
    assert msg.startswith(
        f"file '{f}', row 1, key 'clips': the row has videos (column data.video_key='clips')"
    )
    assert (
        len(RLHFDataset(write_jsonl(tmp_path / "ok.jsonl", rows[:2]), tok, _cfg(max_prompt_length=64))) == 2
    )


def test_error_missing_and_unreadable_files(tmp_path, tok):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(ValueError, match=f"data file '{missing}' does not exist"):
        RLHFDataset([missing], tok, _cfg())
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not a parquet file at all")
    with pytest.raises(ValueError, match=f"cannot read parquet file '{garbage}'"):
        RLHFDataset([str(garbage)], tok, _cfg())
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(row("a")) + "\n{oops\n")
    with pytest.raises(ValueError, match=f"file '{bad_json}', line 2: invalid JSON"):
        RLHFDataset([str(bad_json)], tok, _cfg())
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"unknown suffix '\.csv'"):
        RLHFDataset([str(csv)], tok, _cfg())


def test_bad_truncation_is_refused(tok, tmp_path):
    f = write_parquet([row("a")], tmp_path / "f.parquet")
    with pytest.raises(ValueError, match=r"data\.truncation='cut' must be one of"):
        RLHFDataset(f, tok, _cfg(truncation="cut"))


def test_collate_fn_to_dataproto(tmp_path, tok):
    f = write_parquet([row("ab", index=0), row("cd", index=1), row("efg", index=2)], tmp_path / "f.parquet")
    ds = RLHFDataset(f, tok, _cfg(max_prompt_length=24))
    batch = collate_fn([ds[0], ds[1], ds[2]])
    assert batch["input_ids"].shape == (3, 24) and batch["attention_mask"].shape == (3, 24)
    assert batch["position_ids"][2].tolist() == [0, 0, *range(22)]
    # equal-length lists must stay whole (one list per sample), not become a 2-D array
    assert batch["raw_prompt_ids"].dtype == object and batch["raw_prompt_ids"].shape == (3,)
    assert batch["raw_prompt_ids"][0] == ids_of("ab")
    assert batch["reward_model"][1] == {"style": "rule", "ground_truth": "CD"}
    assert batch["index"].tolist() == [0, 1, 2]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 3 and set(data.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert isinstance(data.non_tensor_batch["data_source"], np.ndarray)
    with pytest.raises(ValueError, match="sample 1 has keys"):
        collate_fn([{"a": 1}, {"b": 2}])


def test_missing_columns_filled_and_logged(tmp_path, tok, caplog):
    a = write_jsonl(tmp_path / "a.jsonl", [row("x")])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": [{"role": "user", "content": "y"}]}])
    with caplog.at_level(logging.WARNING, logger="rlflow.data.rl_dataset"):
        ds = RLHFDataset([a, b], tok, _cfg(max_prompt_length=32))
    assert ds[1]["data_source"] is None and ds[1]["reward_model"] is None and ds[1]["index"] == 1
    assert f"1 row(s) of {b} lack column 'data_source'; filled with None" in caplog.text
    assert a not in caplog.text
