"""PF-PPO's policy filtration (Zhang et al. 2024, arXiv:2409.06957): train on a batch redrawn from the
step's responses, with replacement, weighted by their scores.

The responses a noisy reward scores most reliably (the best and, for ``max_min``, the worst) get drawn
more often; the update then runs on as many rows as before. verl's ``algorithm.use_pf_ppo`` computes the
weights below from each response's summed ``token_level_scores`` (before any KL penalty) and draws with
``torch.multinomial`` from the global generator; rlflow draws from a generator keyed by the seed and the
step, so a resumed run redraws the same rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PF_PPO_METHODS", "pf_ppo_indices", "pf_ppo_weights"]

PF_PPO_METHODS = ("pow", "max_min", "max_random")
"""``algorithm.pf_ppo.reweight_method`` values."""

WEIGHT_FLOOR = 1e-8
"""Added to every weight, so a batch whose weights are all 0 is drawn uniformly (as verl does)."""


def pf_ppo_weights(scores: np.ndarray, method: str, weight_pow: float) -> np.ndarray:
    """Unnormalised drawing weight of each response.

    Args:
        scores: (bs,) each response's summed score.
        method: ``pow``: ``|score| ** weight_pow``; ``max_min``: 1 for the responses with the batch's
            highest or lowest score, 0 for the others; ``max_random``: 0.4 for the highest-scored
            responses, 0.1 for the others.
        weight_pow: the exponent of ``pow`` (>= 0).

    Returns:
        (bs,) float64 weights, each at least `WEIGHT_FLOOR`.

    Raises:
        ValueError: an unknown method, a negative exponent, or a score that is not finite.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"pf_ppo_weights: scores must be a non-empty (bs,) array, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError(
            f"pf_ppo_weights: non-finite scores at rows {np.flatnonzero(~np.isfinite(s)).tolist()}"
        )
    if method == "pow":
        if weight_pow < 0:
            raise ValueError(f"pf_ppo_weights: weight_pow must be >= 0, got {weight_pow}")
        weights = np.abs(s) ** float(weight_pow)
    elif method == "max_min":
        weights = ((s == s.max()) | (s == s.min())).astype(np.float64)
    elif method == "max_random":
        weights = np.where(s == s.max(), 0.4, 0.1)
    else:
        raise ValueError(f"pf_ppo_weights: unknown method {method!r}; expected one of {list(PF_PPO_METHODS)}")
    return weights + WEIGHT_FLOOR


def pf_ppo_indices(scores: np.ndarray, method: str, weight_pow: float, seed: int, step: int) -> np.ndarray:
    """The rows of the redrawn batch: ``bs`` draws with replacement, row ``i`` with probability
    ``w_i / sum(w)`` (`pf_ppo_weights`).

    Args:
        scores: (bs,) each response's summed score.
        method / weight_pow: as `pf_ppo_weights`.
        seed / step: key of the draw (``trainer.seed``, the global step): the same step draws the same
            rows, in a fresh run or a resumed one.

    Returns:
        (bs,) int64 row indices into ``scores``, in drawing order.
    """
    weights = pf_ppo_weights(scores, method, weight_pow)
    rng = np.random.default_rng([int(seed), int(step), 0x5F5F])
    return rng.choice(weights.size, size=weights.size, replace=True, p=weights / weights.sum()).astype(
        np.int64
    )
