"""``DAPORewardManager``: the naive manager plus DAPO's soft overlong punishment (Yu et al. 2025,
arXiv:2503.14476, section 3.4), verl's ``reward_model.reward_manager=dapo``.

A response of ``L`` valid tokens, with ``max_resp_len`` the length budget and ``buffer_len`` the soft
buffer before it, gets ``min(0, -(L - (max_resp_len - buffer_len)) / buffer_len * penalty_factor)`` added
to its score: nothing up to ``max_resp_len - buffer_len`` tokens, then a linear penalty reaching
``-penalty_factor`` at ``max_resp_len``. Configured as verl does, through ``reward_model.reward_kwargs``::

    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=512
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False
    +reward_model.reward_kwargs.max_resp_len=4096
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlflow.protocol import DataProto
from rlflow.reward.naive import NaiveRewardManager
from rlflow.reward.registry import register_reward_manager

__all__ = ["DAPORewardManager", "OverlongBuffer", "overlong_penalty"]

KWARGS_KEY = "reward_model.reward_kwargs"


def overlong_penalty(
    lengths: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """DAPO's soft overlong penalty of each response.

    Args:
        lengths: (bs,) valid response tokens.
        max_resp_len: the length budget (penalty ``-penalty_factor`` there).
        buffer_len: tokens before the budget over which the penalty grows linearly from 0.
        penalty_factor: the penalty at ``max_resp_len``.

    Returns:
        (bs,) float32 penalties, ``<= 0``.
    """
    expected = max_resp_len - buffer_len
    exceed = lengths.to(torch.float32) - expected
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


@dataclass(frozen=True)
class OverlongBuffer:
    """``reward_kwargs.overlong_buffer_cfg`` (verl's keys) with ``reward_kwargs.max_resp_len``."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False
    max_resp_len: int | None = None

    @classmethod
    def from_reward_kwargs(cls, reward_kwargs: Mapping[str, Any], max_response_length: int) -> OverlongBuffer:
        """Parse and check ``reward_model.reward_kwargs`` of the dapo manager.

        Args:
            reward_kwargs: ``{"overlong_buffer_cfg": {...}, "max_resp_len": int}`` (both optional).
            max_response_length: ``data.max_response_length``; the budget when ``max_resp_len`` is unset.

        Raises:
            ValueError: an unknown key, or values that cannot work, naming the key path.
        """
        unknown = sorted(set(reward_kwargs) - {"overlong_buffer_cfg", "max_resp_len"})
        if unknown:
            raise ValueError(
                f"{KWARGS_KEY}: unknown key(s) {unknown} for reward_manager=dapo (it takes "
                "overlong_buffer_cfg.{enable,len,penalty_factor,log} and max_resp_len)"
            )
        raw = dict(reward_kwargs.get("overlong_buffer_cfg") or {})
        fields = {"enable", "len", "penalty_factor", "log"}
        if set(raw) - fields:
            raise ValueError(
                f"{KWARGS_KEY}.overlong_buffer_cfg: unknown key(s) {sorted(set(raw) - fields)} "
                f"(known: {sorted(fields)})"
            )
        max_resp_len = reward_kwargs.get("max_resp_len")
        buf = cls(
            enable=bool(raw.get("enable", False)),
            len=int(raw.get("len", 0) or 0),
            penalty_factor=float(raw.get("penalty_factor", 1.0)),
            log=bool(raw.get("log", False)),
            max_resp_len=int(max_resp_len) if max_resp_len is not None else int(max_response_length),
        )
        if buf.enable:
            if buf.len <= 0:
                raise ValueError(
                    f"{KWARGS_KEY}.overlong_buffer_cfg.len={buf.len} must be > 0 when the buffer is enabled"
                )
            if buf.max_resp_len < buf.len:
                raise ValueError(
                    f"{KWARGS_KEY}.max_resp_len={buf.max_resp_len} is shorter than the overlong buffer "
                    f"(overlong_buffer_cfg.len={buf.len})"
                )
            if buf.max_resp_len > max_response_length:
                raise ValueError(
                    f"{KWARGS_KEY}.max_resp_len={buf.max_resp_len} exceeds data.max_response_length="
                    f"{max_response_length}: no response can reach it, so the penalty never reaches "
                    "-penalty_factor; set max_resp_len to data.max_response_length"
                )
            if buf.penalty_factor < 0:
                raise ValueError(
                    f"{KWARGS_KEY}.overlong_buffer_cfg.penalty_factor={buf.penalty_factor} must be >= 0"
                )
        return buf


@register_reward_manager("dapo")
class DAPORewardManager(NaiveRewardManager):
    """`NaiveRewardManager` whose scores get DAPO's overlong penalty (`overlong_penalty`).

    Args:
        tokenizer, num_examine, ...: as `NaiveRewardManager`.
        overlong: the buffer settings; disabled = the naive manager's scores.

    A score function that returns a number has it logged as ``acc`` too (verl's dapo manager does, so
    ``algorithm.filter_groups.metric=acc`` works with any score function). With ``overlong.log`` the
    extra info also holds ``overlong_reward`` (the penalty) and ``overlong``
    (1.0 where the penalty is negative), logged as ``reward/overlong_reward/mean`` and
    ``reward/overlong/mean``.
    """

    def __init__(self, tokenizer: Any, num_examine: int, overlong: OverlongBuffer, **kwargs: Any):
        super().__init__(tokenizer, num_examine, **kwargs)
        self.overlong = overlong

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if "rm_scores" in data.batch.keys():
            return super().__call__(data, return_dict=return_dict)
        result = super().__call__(data, return_dict=True)
        reward, extra = result["reward_tensor"], result["reward_extra_info"]
        extra.setdefault("acc", list(extra["score"]))
        if not self.overlong.enable:
            return result if return_dict else reward
        prompt_len = data.batch["prompts"].shape[-1]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(-1)
        buf = self.overlong
        penalty = overlong_penalty(lengths, int(buf.max_resp_len), buf.len, buf.penalty_factor)
        rows = torch.arange(len(lengths))
        reward[rows, lengths - 1] += penalty
        if buf.log:
            extra["overlong_reward"] = penalty.tolist()
            extra["overlong"] = (penalty < 0).to(torch.float32).tolist()
        return {"reward_tensor": reward, "reward_extra_info": extra} if return_dict else reward
