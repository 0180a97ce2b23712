"""One entry point for advantages: the registry estimator or the user's custom function.

`compute_advantage` is called wherever the whole batch is at hand: by the driver when there is no critic,
and by the actor and critic workers (on the batch gathered over their data-parallel ranks) when values
come from the critic as Ray futures — so group estimators always see whole groups and GAE whitening is
over the whole batch, whichever process runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlflow.algos.advantages import get_adv_estimator_fn, get_estimator_info
from rlflow.algos.common import config_get
from rlflow.protocol import DataProto
from rlflow.utils.torch_functional import masked_mean

__all__ = ["advantage_metrics", "compute_advantage", "estimator_needs_critic"]


def estimator_needs_critic(adv_estimator: str) -> bool:
    """Whether ``algorithm.adv_estimator`` uses critic values (its registration says so)."""
    return get_estimator_info(str(adv_estimator)).needs_critic


def compute_advantage(
    data: DataProto, algorithm: Any, custom_fn: Callable[..., Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of a whole batch.

    Every estimator receives the same inputs as keyword arguments: ``token_level_rewards``,
    ``response_mask``, ``values`` (None without a critic), ``index`` (group ids), ``reward_baselines``
    (ReMax), ``gamma``, ``lam``, ``epsilon``, ``norm_adv_by_std_in_grpo`` and ``config``.

    Args:
        data: batch with ``token_level_rewards``, ``response_mask``: (bs, response_len); optional
            ``values`` (bs, response_len), ``reward_baselines`` (bs,); non-tensor ``uid`` (bs,).
        algorithm: the ``algorithm`` config (``adv_estimator``, ``gamma``, ``lam``, ...).
        custom_fn: the loaded custom advantage function (replaces the registry estimator).

    Returns:
        ``(advantages, returns)``, each (bs, response_len).
    """
    batch = data.batch
    keys = batch.keys()
    index = data.non_tensor_batch.get("uid")
    if index is None:
        index = np.arange(len(data), dtype=object)
    inputs = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"],
        "values": batch["values"] if "values" in keys else None,
        "index": index,
        "config": algorithm,
    }
    with torch.no_grad():
        if custom_fn is not None:
            return custom_fn(**inputs)
        estimator = str(config_get(algorithm, "adv_estimator", "gae"))
        info = get_estimator_info(estimator)
        if info.needs_critic and inputs["values"] is None:
            raise ValueError(
                f"algorithm.adv_estimator={estimator} needs critic values but the batch has none"
            )
        if not info.needs_critic:
            inputs.pop("values")
        extra = {
            "gamma": config_get(algorithm, "gamma", 1.0),
            "lam": config_get(algorithm, "lam", 1.0),
            "norm_adv_by_std_in_grpo": config_get(algorithm, "norm_adv_by_std_in_grpo", True),
        }
        if info.needs_baselines:
            if "reward_baselines" not in keys:
                raise ValueError(
                    f"algorithm.adv_estimator={estimator} needs reward_baselines (greedy-response rewards)"
                )
            extra["reward_baselines"] = batch["reward_baselines"]
        return get_adv_estimator_fn(estimator)(**inputs, **extra)


def advantage_metrics(data: DataProto, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """``critic/{advantages,returns,values}/{mean,max,min}`` over valid tokens of the whole batch."""
    mask = data.batch["response_mask"].bool()
    out: dict[str, float] = {}
    series = {"advantages": advantages, "returns": returns}
    if "values" in data.batch.keys():
        series["values"] = data.batch["values"]
    for name, t in series.items():
        valid = t[mask]
        if valid.numel() == 0:
            continue
        out[f"critic/{name}/mean"] = float(masked_mean(t, mask.to(t.dtype)))
        out[f"critic/{name}/max"] = float(valid.max())
        out[f"critic/{name}/min"] = float(valid.min())
    return out
