"""Print or write (markdown / HTML) the prompts, responses and scores of a generation dump.

    python scripts/view_rollouts.py outputs/val_generations --step -1 --max_rows 20
    python scripts/view_rollouts.py outputs/val_generations/40.jsonl --out step40.html

See `rlflow.logging.rollout_viewer` for the dump format and the options.
"""

from __future__ import annotations

import sys

from rlflow.logging.rollout_viewer import main

if __name__ == "__main__":
    sys.exit(main())
