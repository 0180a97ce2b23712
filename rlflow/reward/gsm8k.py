"""GSM8K rule scorer: the answer after ``####`` must equal the ground truth.

The *strict* rule (the usual one for GSM8K RL, as in verl's ``gsm8k`` scorer) reads the number after the
last ``####`` of the response; the *flexible* rule reads the last number anywhere. Commas are removed
(``1,000`` == ``1000``) and a trailing period is ignored; otherwise the comparison is exact string
equality (``72.0`` != ``72``).
"""

from __future__ import annotations

import re

__all__ = ["compute_score", "extract_solution"]

_STRICT = re.compile(r"####\s*(-?[0-9][0-9.,]*)")
_NUMBER = re.compile(r"-?[0-9][0-9.,]*")


def _normalize(number: str) -> str:
    return number.replace(",", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer of a response, or None.

    Args:
        solution_str: decoded response.
        method: ``"strict"`` (number after the last ``####``) or ``"flexible"`` (last number).

    Returns:
        The normalized number (commas and a trailing period removed), or None when there is none.
    """
    if method == "strict":
        found = _STRICT.findall(solution_str)
    elif method == "flexible":
        found = _NUMBER.findall(solution_str)
    else:
        raise ValueError(f"method={method!r} must be 'strict' or 'flexible'")
    found = [_normalize(f) for f in found]
    found = [f for f in found if f and f != "-"]
    return found[-1] if found else None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score one GSM8K response.

    Args:
        solution_str: decoded response.
        ground_truth: the reference number (commas allowed).
        method: see :func:`extract_solution`.
        format_score: score of a response with an answer that is wrong.
        score: score of a correct answer.

    Returns:
        ``score`` if correct, ``format_score`` if an answer is present but wrong, else 0.
    """
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == _normalize(str(ground_truth).strip()) else float(format_score)
