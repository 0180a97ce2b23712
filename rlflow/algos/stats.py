"""Statistics of critic predictions over valid response tokens, exact over a data-parallel split.

`explained_variance_stats` gives the 5 sums a shard contributes; summing them over the shards (an
all-reduce) and `explained_variance_from_stats` give exactly the whole batch's explained variance.
"""

from __future__ import annotations

import math

import torch

__all__ = ["explained_variance", "explained_variance_from_stats", "explained_variance_stats"]


def explained_variance_stats(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sufficient statistics of the explained variance over the valid tokens of one shard.

    Args:
        returns: ``(bs, response_len)`` value targets.
        values: ``(bs, response_len)`` critic predictions.
        mask: ``(bs, response_len)``, 1 on valid response tokens.

    Returns:
        float64 tensor ``(5,)``: ``[n, Σ r, Σ r², Σ d, Σ d²]`` with ``d = r - v``, over valid tokens.
        Sum it over data-parallel ranks (``all_reduce``) before :func:`explained_variance_from_stats`.
    """
    if returns.shape != values.shape or returns.shape != mask.shape:
        raise ValueError(
            f"explained_variance: returns {tuple(returns.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape"
        )
    valid = mask.bool()
    r = returns.detach().to(torch.float64)[valid]
    d = r - values.detach().to(torch.float64)[valid]
    n = torch.tensor(float(r.numel()), dtype=torch.float64, device=r.device)
    return torch.stack([n, r.sum(), (r * r).sum(), d.sum(), (d * d).sum()])


def explained_variance_from_stats(stats: torch.Tensor) -> float:
    """``1 - Var[r - v] / Var[r]`` from the sums of :func:`explained_variance_stats`.

    Both variances are population variances (divide by ``n``); the ratio is the same with Bessel's
    correction. 1 means the critic predicts the returns perfectly, 0 means no better than predicting
    their mean, < 0 worse than that. When ``Var[r] == 0`` (all returns equal; in practice below 1e-12
    times the mean square, the rounding floor of the sums) the ratio is undefined and the result is 0.0
    (a number, so that averages and plots stay finite).

    Raises:
        ValueError: no valid token (``n == 0``).
    """
    n, sum_r, sum_r2, sum_d, sum_d2 = (float(x) for x in stats.to(torch.float64).cpu())
    if n <= 0:
        raise ValueError("explained_variance: the mask selects no token")
    var_r = max(sum_r2 / n - (sum_r / n) ** 2, 0.0)
    var_d = max(sum_d2 / n - (sum_d / n) ** 2, 0.0)
    if var_r <= 1e-12 * max(sum_r2 / n, 1.0) or not math.isfinite(var_r):
        return 0.0
    return 1.0 - var_d / var_r


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of the variance of the returns that the critic's values explain, over valid tokens.

    ``EV = 1 - Var[returns - values] / Var[returns]`` (the diagnostic of cleanrl's and Stable-Baselines'
    PPO). 0.0 when ``Var[returns] == 0``; see :func:`explained_variance_from_stats`.

    Args:
        returns: ``(bs, response_len)`` value targets (GAE returns).
        values: ``(bs, response_len)`` critic predictions made before the update.
        mask: ``(bs, response_len)``, 1 on valid response tokens.

    Returns:
        The explained variance as a float.
    """
    return explained_variance_from_stats(explained_variance_stats(returns, values, mask))
