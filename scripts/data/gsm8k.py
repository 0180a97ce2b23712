"""Convert a locally downloaded GSM8K into verl's parquet schema.

    python scripts/data/gsm8k.py --train_file gsm8k/train.jsonl --test_file gsm8k/test.jsonl \
        --local_dir ~/data/gsm8k

Inputs are the usual forms: the original ``train.jsonl`` / ``test.jsonl`` (``question``, ``answer``) or the
Hugging Face parquet files (``main/train-00000-of-00001.parquet``). Writes ``train.parquet`` and
``test.parquet`` with ``data_source="openai/gsm8k"``, the question followed by
'Let's think step by step and output the final answer after "####".', and the number after ``####`` of the
reference answer as ``reward_model.ground_truth``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlflow.data.gsm8k import convert_gsm8k_file


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train_file", required=True, help="local GSM8K train split (jsonl or parquet)")
    parser.add_argument("--test_file", default=None, help="local GSM8K test split (jsonl or parquet)")
    parser.add_argument("--local_dir", required=True, help="output directory")
    args = parser.parse_args()
    out = Path(args.local_dir).expanduser()
    print(convert_gsm8k_file(args.train_file, out / "train.parquet", split="train"))
    if args.test_file:
        print(convert_gsm8k_file(args.test_file, out / "test.parquet", split="test"))


if __name__ == "__main__":
    main()
