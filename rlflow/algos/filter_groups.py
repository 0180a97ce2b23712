"""DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, section 3.2): keep the prompts whose
responses disagree.

A group (the responses of one prompt, same ``uid``) whose metric has zero spread gives every response
the same group-relative advantage, 0, and so no gradient; `informative_groups` keeps the other groups.
A group of one response is kept (it has no spread to measure).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["informative_groups"]


def informative_groups(uids: Sequence[object], values: Sequence[float]) -> tuple[list[int], int]:
    """Rows of the groups whose ``values`` are not all equal.

    Args:
        uids: (bs,) group id of each row.
        values: (bs,) the filter metric of each row.

    Returns:
        ``(rows, num_groups)``: the kept rows in their original order, and how many groups they form.

    Raises:
        ValueError: ``uids`` and ``values`` differ in length, or a value is not finite.
    """
    if len(uids) != len(values):
        raise ValueError(f"informative_groups: {len(uids)} uids but {len(values)} values")
    vals = np.asarray(values, dtype=np.float64)
    if not np.isfinite(vals).all():
        raise ValueError(
            f"informative_groups: non-finite metric values at rows {np.flatnonzero(~np.isfinite(vals)).tolist()}"
        )
    groups: dict[object, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    kept = {uid for uid, rows in groups.items() if len(rows) == 1 or np.std(vals[rows]) > 0}
    return [i for i, uid in enumerate(uids) if uid in kept], len(kept)
