"""Write a synthetic task's train/val parquet files (verl's schema).

    python scripts/data/make_synthetic.py --task repeat --out ~/data/repeat [--seed 0] [--train-size 4096]

Tasks: ``repeat`` (easy: "repeat c x4" -> "cccc") and ``arithmetic`` ("What is 347 + 58? ..." -> "405");
see ``rlflow/data/tasks.py``. Without ``--out`` the files go to the rlflow cache and their paths are printed.
"""

from __future__ import annotations

import argparse

from rlflow.data.tasks import TASKS, ensure_task_files, get_task, write_task_files


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="repeat")
    parser.add_argument("--out", default=None, help="output directory (default: the rlflow cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--val-size", type=int, default=None)
    args = parser.parse_args()
    sizes = {"train_size": args.train_size, "val_size": args.val_size}
    overrides = {k: v for k, v in sizes.items() if v is not None}
    if args.out is None:
        train, val = ensure_task_files(args.task, seed=args.seed, **overrides)
    else:
        train, val = write_task_files(get_task(args.task, **overrides), args.out, seed=args.seed)
    print(train)
    print(val)


if __name__ == "__main__":
    main()
