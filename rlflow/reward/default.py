"""``default_compute_score``: the rule scorer for a sample, chosen by its ``data_source``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlflow.reward import gsm8k, synthetic

if TYPE_CHECKING:
    from rlflow.reward.sandbox_fusion import SandboxSettings

__all__ = ["CODE_DATA_SOURCES", "DEFAULT_SCORERS", "default_compute_score"]

DEFAULT_SCORERS = {
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "rlflow/repeat": synthetic.repeat_score,
    "rlflow/arithmetic": synthetic.arithmetic_score,
}
"""``data_source`` -> ``scorer(solution_str, ground_truth) -> float``."""

CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")
"""Code tasks (verl's names): their answers run in a SandboxFusion service (`rlflow.reward.sandbox_fusion`)."""


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    sandbox: SandboxSettings | None = None,
) -> dict[str, float]:
    """Score one response with the rule scorer of its ``data_source``.

    Args:
        data_source: e.g. ``"openai/gsm8k"``, ``"rlflow/repeat"``, ``"rlflow/arithmetic"``.
        solution_str: decoded response (special tokens skipped).
        ground_truth: ``reward_model["ground_truth"]`` of the sample.
        extra_info: the sample's ``extra_info`` (unused by the built-in scorers).
        sandbox: where code tasks (`CODE_DATA_SOURCES`) run (``reward_model.sandbox_fusion``).

    Returns:
        ``{"score": s, "acc": 1.0 if s == 1.0 else 0.0}``; every built-in scorer gives 1.0 exactly for a
        fully correct answer.

    Raises:
        NotImplementedError: no built-in scorer for ``data_source`` (or a code task with no sandbox).
    """
    if data_source in CODE_DATA_SOURCES:
        if sandbox is None:
            raise NotImplementedError(
                f"data_source={data_source!r} is a code task: its answers run in a SandboxFusion service; set "
                "reward_model.sandbox_fusion.url (or custom_reward_function.path / .name)"
            )
        from rlflow.reward.sandbox_fusion import score_code

        return score_code(sandbox, solution_str, ground_truth)
    scorer = DEFAULT_SCORERS.get(data_source)
    if scorer is None:
        raise NotImplementedError(
            f"no default reward scorer for data_source={data_source!r} (known: {sorted(DEFAULT_SCORERS)}); "
            "set custom_reward_function.path / .name"
        )
    score = float(scorer(solution_str, ground_truth))
    return {"score": score, "acc": float(score == 1.0)}
