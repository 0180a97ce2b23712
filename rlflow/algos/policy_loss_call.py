"""Calling a registered policy loss, whichever of verl's conventions it was written for.

rlflow's built-in losses take the mini-batch's global counts (``global_token_num``, ``global_seq_num``,
``dp_size``, ``loss_scale_factor``: `rlflow.algos.losses.agg_loss`), so summing them over micro-batches
and averaging over ranks gives the loss of the whole mini-batch, and return verl's 4-tuple
``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``. A loss written for verl >= 0.9 returns
``(pg_loss, metrics)`` with ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (and
any others), and one written for verl (either version) knows nothing of the global counts: it returns the
*local* aggregate of its micro-batch — unless it aggregates as verl's current losses do, with
``agg_loss(..., **config.global_batch_info)``: the ``config`` such a loss receives carries
``global_batch_info`` (verl's keys ``dp_size``, ``batch_num_tokens``, ``global_batch_size``,
``loss_scale_factor``, holding the mini-batch's counts). `PolicyLossCall` accepts both return shapes, and
rescales a local aggregate to its share of the mini-batch's when the loss did not read
``global_batch_info``, so every such loss keeps batch invariance (DESIGN invariant 1).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["GlobalBatchInfo", "PolicyLossCall"]

logger = logging.getLogger(__name__)

_COUNT_KWARGS = ("global_token_num", "global_seq_num", "dp_size", "loss_scale_factor")
_TUPLE_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
# aggregation modes whose local aggregate (a mean over the micro-batch's tokens or sequences) can be
# rescaled to the mini-batch's without knowing how the loss aggregated
_LOCAL_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


class PolicyLossCall:
    """How to call one policy-loss function (its signature is read once).

    Args:
        fn: the registered function; positional ``(old_log_prob, log_prob, advantages, response_mask,
            loss_agg_mode, config[, rollout_is_weights])``.
        name: its ``policy_loss.loss_mode``, for messages.

    Raises:
        TypeError: ``fn`` cannot take the six positional arguments.
    """

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name = fn, name
        params = inspect.signature(fn).parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
        var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
        names = {p.name for p in params}
        if len(positional) < 6 and not var_positional:
            raise TypeError(
                f"policy loss {name!r} ({getattr(fn, '__qualname__', fn)}) must take (old_log_prob, log_prob, "
                f"advantages, response_mask, loss_agg_mode, config[, rollout_is_weights])"
            )
        self.takes_weights = var_keyword or "rollout_is_weights" in names
        self._names, self._var_keyword = names, var_keyword
        self.takes_counts = var_keyword or all(k in names for k in _COUNT_KWARGS)
        if not self.takes_counts:
            logger.info(
                "policy loss %r takes no global counts: its micro-batch aggregate is rescaled to its share "
                "of the mini-batch's",
                name,
            )

    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str,
        config: Any,
        rollout_is_weights: torch.Tensor | None,
        counts: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One micro-batch's loss, the mini-batch-global aggregate, and its metrics.

        Args:
            old_log_prob / log_prob / advantages / response_mask: ``(bs, response_len)``.
            loss_agg_mode: `rlflow.algos.losses.AGG_LOSS_MODES`.
            config: the actor config.
            rollout_is_weights: ``(bs, response_len)`` or None.
            counts: `rlflow.engine.ppo_loop.loss_normalisers` of the mini-batch.
            extra: further keyword arguments the loss needs (KL-Cov / Clip-Cov's ``cov_selected``).

        Returns:
            ``(pg_loss, metrics)``: the scalar loss and ``actor/...`` metrics (token-weighted means).

        Raises:
            TypeError: the loss takes none of ``extra``'s keywords.
        """
        info = GlobalBatchInfo(counts)
        config = _LossConfig(config, info)
        args = [old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config]
        kwargs: dict[str, Any] = dict(counts) if self.takes_counts else {}
        if self.takes_weights:
            kwargs["rollout_is_weights"] = rollout_is_weights
        elif rollout_is_weights is not None:
            raise ValueError(
                f"importance weights (actor.tis_imp_ratio_cap > 0 or algorithm.rollout_correction.rollout_is) "
                f"need a policy loss with a rollout_is_weights parameter; "
                f"{self.name!r} has none"
            )
        for key, value in (extra or {}).items():
            if not (self._var_keyword or key in self._names):
                raise TypeError(
                    f"policy loss {self.name!r} ({getattr(self.fn, '__qualname__', self.fn)}) takes no {key!r} "
                    f"argument, which its loss mode's selection over the mini-batch passes"
                )
            kwargs[key] = value
        out = self.fn(*args, **kwargs)
        pg_loss, metrics = self._unpack(out)
        if not self.takes_counts and not info.read:
            if loss_agg_mode not in _LOCAL_MODES:
                raise ValueError(
                    f"actor.loss_agg_mode={loss_agg_mode!r} needs a policy loss that takes the global counts "
                    f"({', '.join(_COUNT_KWARGS)}) or aggregates with config.global_batch_info; "
                    f"{self.name!r} does neither (supported without them: {', '.join(_LOCAL_MODES)})"
                )
            pg_loss = pg_loss * _local_share(response_mask, loss_agg_mode, counts)
        return pg_loss, metrics

    def _unpack(self, out: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        if isinstance(out, tuple) and len(out) == 4:
            return out[0], dict(zip(_TUPLE_METRICS, out[1:]))
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
            return out[0], {(k if k.startswith("actor/") else f"actor/{k}"): v for k, v in out[1].items()}
        raise TypeError(
            f"policy loss {self.name!r} returned {type(out).__name__}"
            f"{f' of length {len(out)}' if isinstance(out, tuple) else ''}; expected verl's (pg_loss, "
            f"pg_clipfrac, ppo_kl, pg_clipfrac_lower) or (pg_loss, metrics dict)"
        )


class GlobalBatchInfo(Mapping):
    """verl's ``config.global_batch_info`` of one micro-batch: the mini-batch's counts under verl's keys,
    remembering whether the loss read them (then its result is already its share of the mini-batch's).

    Args:
        counts: `rlflow.engine.ppo_loop.loss_normalisers` of the mini-batch.
    """

    def __init__(self, counts: Mapping[str, Any]) -> None:
        self._values = {
            "dp_size": counts["dp_size"],
            "batch_num_tokens": counts["global_token_num"],
            "global_batch_size": counts["global_seq_num"],
            "loss_scale_factor": counts["loss_scale_factor"],
        }
        self.read = False

    def __getitem__(self, key: str) -> Any:
        self.read = True
        return self._values[key]

    def __iter__(self) -> Any:
        self.read = True
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> Any:
        self.read = True
        return self._values.keys()


class _LossConfig:
    """The actor config as a registered loss sees it: every attribute of the config, plus
    ``global_batch_info``."""

    def __init__(self, config: Any, info: GlobalBatchInfo) -> None:
        self._config, self.global_batch_info = config, info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)

    def get(self, name: str, default: Any = None) -> Any:
        """Dict-style access, as verl's config objects allow."""
        return self.global_batch_info if name == "global_batch_info" else getattr(self._config, name, default)


def _local_share(response_mask: torch.Tensor, loss_agg_mode: str, counts: Mapping[str, Any]) -> torch.Tensor:
    """Factor turning a micro-batch's local aggregate into its term of the mini-batch-global one:
    ``local count * dp_size / global count`` of the tokens (``token-mean``) or sequences (``seq-*``)."""
    mask = response_mask.to(torch.float64)
    if loss_agg_mode == "token-mean":
        local, total = mask.sum(), counts["global_token_num"]
    else:
        local, total = (mask.sum(-1) > 0).sum().to(torch.float64), counts["global_seq_num"]
    total = torch.as_tensor(total, dtype=torch.float64, device=mask.device).clamp(min=1)
    return (local * float(counts["dp_size"]) / total).to(torch.float32)
