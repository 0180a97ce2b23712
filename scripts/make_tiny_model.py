"""Write rlflow's tiny offline model and tokenizer to a directory.

    python scripts/make_tiny_model.py --out /tmp/tiny [--seed 0] [--hidden-size 64 --num-hidden-layers 2 ...]

The directory loads with ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``. Without ``--out`` the
model is built in (or found in) the cache (``$RLFLOW_CACHE_DIR``, default ``~/.cache/rlflow``).
"""

from __future__ import annotations

import argparse
import dataclasses

from rlflow.models.tiny import TinyModelConfig, get_tiny_model_path, save_tiny_model


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return text.lower() in ("true", "1")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="output directory (default: the rlflow cache)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    for f in dataclasses.fields(TinyModelConfig):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=_bool if isinstance(f.default, bool) else type(f.default),
            default=None,
        )
    args = parser.parse_args()
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinyModelConfig)}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.out is None:
        path = get_tiny_model_path(seed=args.seed, **overrides)
    else:
        path = save_tiny_model(args.out, dataclasses.replace(TinyModelConfig(), **overrides), seed=args.seed)
    print(path)


if __name__ == "__main__":
    main()
