"""``reward_manager=prime``: verl's name for scoring rule rewards in a process pool with a timeout.

verl's ``PrimeRewardManager`` runs the score function of every sample in a pool of processes (64) with a
per-sample timeout (300 s), as code-execution rewards need. rlflow's `NaiveRewardManager` does that with
``reward_model.num_workers`` / ``timeout_s``; this class is the naive manager with those two defaulting
to ``min(64, CPUs)`` processes and 300 s when the config leaves them unset.
"""

from __future__ import annotations

import os

from rlflow.reward.naive import NaiveRewardManager
from rlflow.reward.registry import register_reward_manager

__all__ = ["PRIME_TIMEOUT_S", "PrimeRewardManager", "prime_workers"]

PRIME_TIMEOUT_S = 300.0
"""verl's per-sample timeout of the prime manager."""


def prime_workers() -> int:
    """verl's pool of 64 processes, bounded by this machine's CPUs."""
    return max(1, min(64, os.cpu_count() or 1))


@register_reward_manager("prime")
class PrimeRewardManager(NaiveRewardManager):
    """`NaiveRewardManager` scoring in a process pool (see the module docstring for the defaults)."""
