"""Turn a locally downloaded GSM8K (jsonl or parquet with ``question`` / ``answer``) into verl's schema.

Each source row ``{"question": q, "answer": "...reasoning...\\n#### 72"}`` becomes::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": q + " " + GSM8K_INSTRUCTION}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": split, "index": i, "answer": answer, "question": q}}

The ground truth is the text after the last ``####`` of the reference answer, commas removed.
"""

from __future__ import annotations

import os
from typing import Any

from rlflow.data.io import read_rows, write_parquet

__all__ = ["GSM8K_DATA_SOURCE", "GSM8K_INSTRUCTION", "convert_gsm8k_file", "gsm8k_ground_truth", "gsm8k_rows"]

GSM8K_DATA_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def gsm8k_ground_truth(answer: str, where: str = "answer") -> str:
    """The final answer of a GSM8K reference solution: text after the last ``####``, commas removed.

    Args:
        answer: the reference solution.
        where: names the row in the error message.

    Returns:
        e.g. ``"1000"`` for ``"... #### 1,000"``.
    """
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError(f"{where}: GSM8K answer must be a string containing '####', got {answer!r:.80}")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ValueError(f"{where}: nothing after '####' in GSM8K answer {answer!r:.80}")
    return final


def gsm8k_rows(records: list[dict[str, Any]], split: str, source: str = "<records>") -> list[dict[str, Any]]:
    """Convert GSM8K records to rows in verl's schema.

    Args:
        records: dicts with string ``question`` and ``answer``.
        split: stored in ``extra_info["split"]`` (e.g. ``"train"``, ``"test"``).
        source: names the input in error messages.

    Returns:
        One row per record, in order.
    """
    rows = []
    for i, rec in enumerate(records):
        where = f"file {source!r}, row {i}"
        for key in ("question", "answer"):
            if not isinstance(rec.get(key), str):
                raise ValueError(
                    f"{where}, key {key!r}: expected a string, got {type(rec.get(key)).__name__}"
                )
        question = rec["question"]
        rows.append(
            {
                "data_source": GSM8K_DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": gsm8k_ground_truth(rec["answer"], where)},
                "extra_info": {"split": split, "index": i, "answer": rec["answer"], "question": question},
            }
        )
    return rows


def convert_gsm8k_file(input_path: str | os.PathLike, output_path: str | os.PathLike, split: str) -> str:
    """Read a local GSM8K file (jsonl or parquet) and write it as a parquet file in verl's schema.

    Args:
        input_path: e.g. ``grade-school-math/data/train.jsonl`` or ``main/train-00000-of-00001.parquet``.
        output_path: the parquet file to write.
        split: the split name stored in ``extra_info``.

    Returns:
        ``str(output_path)``.
    """
    return write_parquet(gsm8k_rows(read_rows(input_path), split, source=str(input_path)), output_path)
