"""Scorers of the synthetic tasks of :mod:`rlflow.data.tasks`."""

from __future__ import annotations

import re

__all__ = ["arithmetic_score", "repeat_score"]

_INT = re.compile(r"-?\d+")


def repeat_score(solution_str: str, ground_truth: str, extra_penalty: float = 0.25) -> float:
    """Score of the ``repeat`` task: partial credit per matching character.

    With ``r = solution_str.strip()``, ``t = ground_truth`` and ``n = len(t)``::

        score = (#{i < n : r[i] == t[i]} / n) * max(0, 1 - extra_penalty * max(0, len(r) - n))

    e.g. t="cccc": "cccc" -> 1.0, "ccca" -> 0.75, "cc" -> 0.5, "cccccc" -> 0.5, "" -> 0.0.
    A policy emitting random letters of a 5-letter alphabet scores about 0.2 before the length factor.
    The length factor is steep on purpose: with a mild one (0.05 per character, the first version) a
    policy that repeats the right letter and never stops scores 0.78, a plateau RL runs settle on
    instead of learning to count (docs/baselines.md).

    Args:
        solution_str: decoded response.
        ground_truth: the target string (non-empty).
        extra_penalty: factor lost per character beyond ``n``.

    Returns:
        A score in [0, 1].
    """
    target = str(ground_truth)
    if not target:
        raise ValueError("repeat_score: empty ground_truth")
    response = solution_str.strip()
    matches = sum(a == b for a, b in zip(response, target))
    extra = max(0, len(response) - len(target))
    return matches / len(target) * max(0.0, 1.0 - extra_penalty * extra)


def _arithmetic_answer(solution_str: str) -> int | None:
    """The integer after the last ``####`` if there is one, else the last integer of the response."""
    if "####" in solution_str:
        found = _INT.findall(solution_str.rsplit("####", 1)[1].replace(",", ""))
        return int(found[0]) if found else None
    found = _INT.findall(solution_str.replace(",", ""))
    return int(found[-1]) if found else None


def arithmetic_score(solution_str: str, ground_truth: str, format_score: float = 0.0) -> float:
    """Score of the ``arithmetic`` task: 1.0 when the answer equals ``ground_truth``.

    The answer is the first integer after the last ``####`` when the response has one, else the last
    integer in the response; commas are removed.

    Args:
        solution_str: decoded response.
        ground_truth: the exact integer result, as a string.
        format_score: score of a response with an integer answer that is wrong.

    Returns:
        1.0, ``format_score`` or 0.0 (no integer found).
    """
    answer = _arithmetic_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if answer == int(str(ground_truth).strip()) else float(format_score)
