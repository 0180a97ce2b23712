"""Load a user's reward function from a file (``custom_reward_function.path`` / ``.name``).

The function is called as ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...,
**reward_kwargs)`` and returns a number or a dict with a numeric ``"score"``. The signature is checked when
the function is loaded, so a wrong signature fails before any rollout; return values are checked by the
reward manager (:func:`rlflow.reward.naive.check_score`).

:class:`CustomRewardFunction` pickles as ``(path, name, reward_kwargs)`` and re-imports the file on
unpickling, so it can be sent to scoring processes and Ray workers.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from rlflow.utils.import_utils import load_function

__all__ = ["SCORE_ARGUMENTS", "CustomRewardFunction", "get_custom_reward_fn", "load_custom_reward_fn"]

SCORE_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""Keyword arguments every score function receives."""


def check_signature(fn: Callable[..., Any], label: str, reward_kwargs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless ``fn`` accepts the score keyword arguments plus ``reward_kwargs``.

    Args:
        fn: the score function.
        label: names the function in the message.
        reward_kwargs: extra keyword arguments that will be passed.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reward function {label}: cannot inspect its signature ({exc})") from exc
    probe = dict.fromkeys(SCORE_ARGUMENTS) | dict(reward_kwargs)
    try:
        signature.bind(**probe)
    except TypeError as exc:
        raise ValueError(
            f"reward function {label} has signature {signature}; it must accept the keyword arguments "
            f"{', '.join(SCORE_ARGUMENTS)}"
            + (f", {', '.join(reward_kwargs)}" if reward_kwargs else "")
            + f" (other parameters need defaults): {exc}"
        ) from exc


class CustomRewardFunction:
    """A score function loaded from a file; picklable by path.

    Args:
        path: Python file.
        name: function name in that file.
        reward_kwargs: extra keyword arguments passed on every call.
    """

    def __init__(
        self, path: str, name: str = "compute_score", reward_kwargs: Mapping[str, Any] | None = None
    ):
        self.path = os.path.abspath(os.path.expanduser(str(path)))
        self.name = str(name)
        self.reward_kwargs = dict(reward_kwargs or {})
        self.label = f"{self.name!r} from {self.path!r}"
        self._fn = self._load()

    def _load(self) -> Callable[..., Any]:
        fn = load_function(self.path, self.name, "custom_reward_function")
        check_signature(fn, self.label, self.reward_kwargs)
        return fn

    def __call__(self, **kwargs: Any) -> Any:
        return self._fn(**kwargs, **self.reward_kwargs)

    def __repr__(self) -> str:
        return f"CustomRewardFunction({self.label})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "reward_kwargs": self.reward_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["name"], state["reward_kwargs"])


def load_custom_reward_fn(
    path: str, name: str = "compute_score", reward_kwargs: Mapping[str, Any] | None = None
) -> CustomRewardFunction:
    """Load and check a user's score function.

    Args:
        path: Python file (``custom_reward_function.path``).
        name: function name (``custom_reward_function.name``).
        reward_kwargs: extra keyword arguments (``custom_reward_function.reward_kwargs``).

    Returns:
        A callable taking the score keyword arguments.

    Raises:
        ValueError: missing file, import error, missing or non-callable name, or a signature that cannot
            take ``data_source, solution_str, ground_truth, extra_info`` (and ``reward_kwargs``).
    """
    return CustomRewardFunction(path, name, reward_kwargs)


def get_custom_reward_fn(section: Any) -> CustomRewardFunction | None:
    """The function named by the ``custom_reward_function`` section, or None when its ``path`` is unset.

    Args:
        section: the section (``path``, ``name``, ``reward_kwargs``).
    """
    if not section.path:
        return None
    return load_custom_reward_fn(section.path, section.name or "compute_score", section.reward_kwargs)
