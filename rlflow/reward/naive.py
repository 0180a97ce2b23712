"""``NaiveRewardManager``: decode each response, score it with a rule, place the score on its last token.

For sample ``i`` with ``n_i`` valid response tokens (``attention_mask[i, prompt_len:].sum()``), the score
goes to ``token_level_scores[i, n_i - 1]`` and every other entry is 0 (shape ``(bs, response_len)``). With
``return_dict=True`` the manager also returns ``reward_extra_info``: per-sample lists, ``score`` always, the
other keys of dict-returning score functions (e.g. ``acc``), and ``reward_timeout`` (1.0 / 0.0) when a
per-sample timeout is set. A timed-out sample scores ``timeout_score`` (also in its other extra keys) and
is counted in ``num_timeouts``.
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from rlflow.protocol import DataProto
from rlflow.reward.default import default_compute_score
from rlflow.reward.pool import ScoringPool
from rlflow.reward.registry import register_reward_manager

__all__ = ["NaiveRewardManager", "check_score"]


def _fn_label(fn: Callable[..., Any]) -> str:
    return getattr(fn, "label", None) or getattr(fn, "__qualname__", None) or repr(fn)


def check_score(result: Any, index: int, fn_label: str) -> tuple[float, dict[str, Any]]:
    """Validate one score function return value.

    Args:
        result: a real number, or a dict with a real ``"score"`` (other keys are extra info).
        index: sample index (for the message).
        fn_label: names the score function (for the message).

    Returns:
        ``(score, extra)`` where ``extra`` holds the dict's other keys.

    Raises:
        ValueError: non-numeric or non-finite score.
    """
    extra: dict[str, Any] = {}
    value = result
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"reward function {fn_label} returned a dict without 'score' for sample {index}")
        value = result["score"]
        extra = {k: v for k, v in result.items() if k != "score"}
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise ValueError(
            f"reward function {fn_label} returned a non-numeric score {value!r} "
            f"({type(value).__name__}) for sample {index}"
        )
    if not math.isfinite(float(value)):
        raise ValueError(
            f"reward function {fn_label} returned a non-finite score {value!r} for sample {index}"
        )
    return float(value), extra


@register_reward_manager("naive")
class NaiveRewardManager:
    """Rule-based rewards, one score function call per sample (verl's ``NaiveRewardManager``).

    Args:
        tokenizer: decodes prompts and responses.
        num_examine: print this many decoded samples per data source on each call.
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info)``; default
            :func:`default_compute_score`.
        reward_fn_key: non-tensor key naming each sample's data source.
        num_workers: score in this many worker processes (0: in this process).
        timeout_s: per-sample timeout (needs ``num_workers >= 1``); a late sample scores ``timeout_score``.
        timeout_score: score given to a sample that timed out.
        mp_context: start method of the worker processes.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        num_workers: int = 0,
        timeout_s: float | None = None,
        timeout_score: float = 0.0,
        mp_context: str = "spawn",
    ):
        if timeout_s is not None and num_workers < 1:
            raise ValueError(
                "reward timeout_s needs num_workers >= 1 (a timed-out sample is run in a process)"
            )
        self.tokenizer, self.num_examine, self.reward_fn_key = tokenizer, num_examine, reward_fn_key
        self.compute_score = compute_score or default_compute_score
        self.timeout_s, self.timeout_score = timeout_s, float(timeout_score)
        self.num_timeouts = 0
        self._pool = (
            ScoringPool(self.compute_score, num_workers, timeout_s, mp_context) if num_workers else None
        )

    def _decode(self, data: DataProto) -> tuple[list[str], list[str], torch.Tensor]:
        """Decoded valid prompts and responses, and the valid response lengths (bs,)."""
        prompts, responses = data.batch["prompts"], data.batch["responses"]
        prompt_len = prompts.shape[-1]
        mask = data.batch["attention_mask"]
        prompt_valid = mask[:, :prompt_len].sum(-1)
        response_valid = mask[:, prompt_len:].sum(-1)
        prompt_strs, response_strs = [], []
        for i in range(len(data)):
            if int(response_valid[i]) == 0:
                raise ValueError(
                    f"reward: sample {i} has no valid response token (attention_mask is 0 there)"
                )
            p = prompts[i, prompt_len - int(prompt_valid[i]) :].tolist()
            r = responses[i, : int(response_valid[i])].tolist()
            prompt_strs.append(self.tokenizer.decode(p, skip_special_tokens=True))
            response_strs.append(self.tokenizer.decode(r, skip_special_tokens=True))
        return prompt_strs, response_strs, response_valid

    def _score_kwargs(self, data: DataProto, response_strs: list[str]) -> list[dict[str, Any]]:
        """Keyword arguments of each score call; ``ValueError`` naming the sample when a field is missing."""
        nt = data.non_tensor_batch
        for key in (self.reward_fn_key, "reward_model"):
            if key not in nt:
                raise ValueError(f"reward: the batch has no non-tensor key {key!r} (keys: {sorted(nt)})")
        out = []
        for i, response in enumerate(response_strs):
            reward_model = nt["reward_model"][i]
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise ValueError(
                    f"reward: sample {i} has no reward_model['ground_truth'] ({reward_model!r:.80})"
                )
            extra_info = nt["extra_info"][i] if "extra_info" in nt else None
            out.append(
                {
                    "data_source": nt[self.reward_fn_key][i],
                    "solution_str": response,
                    "ground_truth": reward_model["ground_truth"],
                    "extra_info": extra_info,
                }
            )
        return out

    def _run(self, kwargs_list: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        """``("ok", result)`` or ``("timeout", None)`` per sample; errors raise naming the sample."""
        label = _fn_label(self.compute_score)
        if self._pool is None:
            results = []
            for i, kwargs in enumerate(kwargs_list):
                try:
                    results.append(("ok", self.compute_score(**kwargs)))
                except Exception as exc:
                    raise RuntimeError(
                        f"reward function {label} failed on sample {i} (data_source={kwargs['data_source']!r}): "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
            return results
        results = self._pool.map(kwargs_list)
        for i, (status, value) in enumerate(results):
            if status == "error":
                raise RuntimeError(
                    f"reward function {label} failed on sample {i} in a scoring process:\n{value}"
                )
        return results

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Score a batch.

        Args:
            data: ``batch`` with ``prompts`` (bs, prompt_len), ``responses`` (bs, response_len),
                ``attention_mask`` (bs, prompt_len + response_len); ``non_tensor_batch`` with
                ``reward_model`` (dicts with ``ground_truth``), the ``reward_fn_key`` entry and optionally
                ``extra_info``. If ``batch`` has ``rm_scores`` they are returned as is.
            return_dict: also return ``reward_extra_info``.

        Returns:
            ``token_level_scores`` (bs, response_len) float32, or ``{"reward_tensor": ...,
            "reward_extra_info": {key: list of bs values}}``.
        """
        if "rm_scores" in data.batch.keys():
            scores = data.batch["rm_scores"]
            return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores
        prompt_strs, response_strs, valid = self._decode(data)
        kwargs_list = self._score_kwargs(data, response_strs)
        results = self._run(kwargs_list)
        scored = self._check_results(results)
        reward = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        extra_info: dict[str, list[Any]] = {"score": [score for score, _ in scored]}
        for key in scored[0][1] if scored else {}:
            extra_info[key] = [extra[key] for _, extra in scored]
        if self.timeout_s is not None:
            extra_info["reward_timeout"] = [float(status == "timeout") for status, _ in results]
        for i, (score, _) in enumerate(scored):
            reward[i, int(valid[i]) - 1] = score
        self._examine(kwargs_list, prompt_strs, extra_info["score"])
        return {"reward_tensor": reward, "reward_extra_info": extra_info} if return_dict else reward

    def _check_results(self, results: list[tuple[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
        """``(score, extra)`` per sample; a timed-out sample scores ``timeout_score`` in every key.

        Score functions returning dicts must return the same keys for every sample (``ValueError`` naming
        the first sample that differs), so each extra-info list has one value per sample.
        """
        label = _fn_label(self.compute_score)
        scored: list[tuple[float, dict[str, Any]] | None] = [None] * len(results)
        keys: list[str] | None = None
        for i, (status, result) in enumerate(results):
            if status == "timeout":
                continue
            score, extra = check_score(result, i, label)
            if keys is None:
                keys, first = sorted(extra), i
            elif sorted(extra) != keys:
                raise ValueError(
                    f"reward function {label} returned keys {sorted(extra)} for sample {i} but {keys} for "
                    f"sample {first}; every sample must return the same keys"
                )
            scored[i] = (score, extra)
        for i, (status, _) in enumerate(results):
            if status == "timeout":
                self.num_timeouts += 1
                scored[i] = (self.timeout_score, dict.fromkeys(keys or [], self.timeout_score))
        return scored  # type: ignore[return-value]

    def _examine(
        self, kwargs_list: list[dict[str, Any]], prompt_strs: list[str], scores: list[float]
    ) -> None:
        """Print the first ``num_examine`` samples of each data source."""
        printed: dict[str, int] = defaultdict(int)
        for kwargs, prompt, score in zip(kwargs_list, prompt_strs, scores):
            source = kwargs["data_source"]
            if printed[source] >= self.num_examine:
                continue
            printed[source] += 1
            print(f"[{source}] [prompt] {prompt!r}\n[response] {kwargs['solution_str']!r}")
            print(f"[ground_truth] {kwargs['ground_truth']!r} [score] {score}")

    def close(self) -> None:
        """Stop the scoring processes, if any."""
        if self._pool is not None:
            self._pool.close()
