"""A user-supplied advantage function, loaded from a Python file and checked at load time and on every call.

Configured as ``algorithm.custom_advantage_function.path`` (a ``.py`` file) and ``.name`` (a function in
it); when set, it replaces the registry estimator (``algorithm.adv_estimator``) for the run. The idea
follows slime's ``--custom-advantage-function-path``.

The function the user writes is called with these keyword arguments only (never positionally)::

    def my_advantage(token_level_rewards, response_mask, values, index, config, **kwargs):
        # token_level_rewards: torch.Tensor (bs, response_len), float
        # response_mask:       torch.Tensor (bs, response_len), 1 on generated tokens up to EOS
        # values:              torch.Tensor (bs, response_len) critic values, or None without a critic
        # index:               numpy object array (bs,), group id (prompt uid) of each response
        # config:              the algorithm config (``algorithm``: gamma, lam, ...)
        ...
        return advantages, returns  # both torch.Tensor (bs, response_len), floating

Parameters it does not use may be absorbed by ``**kwargs``; a parameter outside these five needs a
default. The call runs under ``torch.no_grad()``.

``load_custom_advantage_fn(path, name)`` (at config-load time) raises ``ValueError`` naming
``algorithm.custom_advantage_function.path`` or ``.name`` when the file is missing or does not import,
when ``name`` is missing or not callable, or when the signature cannot take those keywords. The returned
``CustomAdvantageFn`` checks every result: a pair ``(advantages, returns)``, both tensors of shape
``(bs, response_len)`` on the device of ``response_mask``, floating dtype, finite on valid tokens;
each error names the function and the problem.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from rlflow.utils.import_utils import import_file

__all__ = ["CONFIG_KEY", "INPUT_NAMES", "CustomAdvantageFn", "load_custom_advantage_fn"]

CONFIG_KEY = "algorithm.custom_advantage_function"
INPUT_NAMES = ("token_level_rewards", "response_mask", "values", "index", "config")


def _check_signature(fn: Callable, label: str) -> None:
    """Raise ValueError unless ``fn(**{name: ... for name in INPUT_NAMES})`` binds."""
    key = f"{CONFIG_KEY}.name"
    if inspect.iscoroutinefunction(fn):
        raise ValueError(
            f"{key}: {label} is an async function; it must return (advantages, returns) directly"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key}: cannot read the signature of {label} ({err})") from err
    try:
        signature.bind(**dict.fromkeys(INPUT_NAMES))
    except TypeError as err:
        raise ValueError(
            f"{key}: {label}{signature} cannot be called with the keyword arguments {list(INPUT_NAMES)} "
            f"({err}); declare them, or absorb unused ones with **kwargs, and give any other parameter a "
            "default"
        ) from err


class CustomAdvantageFn:
    """A checked user advantage function: calls it with the documented keywords and validates its output.

    Pickles as ``(path, name)`` and re-imports the file when unpickled (e.g. in another Ray process).

    Args:
        fn: the user's callable.
        path: the file it came from.
        name: its name in that file.
    """

    def __init__(self, fn: Callable, path: str, name: str):
        self.fn = fn
        self.path = path
        self.name = name
        self.label = f"custom advantage function {name!r} ({path})"

    def __repr__(self) -> str:
        return f"CustomAdvantageFn(path={self.path!r}, name={self.name!r})"

    def __reduce__(self) -> tuple[Callable, tuple[str, str]]:
        return load_custom_advantage_fn, (self.path, self.name)

    def __call__(
        self,
        *,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        values: torch.Tensor | None = None,
        index: Any = None,
        config: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the user function and check ``(advantages, returns)``.

        Args:
            token_level_rewards: ``(bs, response_len)``.
            response_mask: ``(bs, response_len)``.
            values: ``(bs, response_len)`` critic values, or None without a critic.
            index: ``(bs,)`` numpy object array of group ids.
            config: the algorithm config.

        Returns:
            ``(advantages, returns)``, each ``(bs, response_len)`` floating, finite on valid tokens.
        """
        if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
            raise ValueError(
                f"{self.label}: the trainer must pass response_mask as a (bs, response_len) tensor"
            )
        with torch.no_grad():
            out = self.fn(
                token_level_rewards=token_level_rewards,
                response_mask=response_mask,
                values=values,
                index=index,
                config=config,
            )
        return self._validate(out, response_mask)

    def _validate(self, out: Any, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(out, tuple | list) or len(out) != 2:
            got = (
                f"a {type(out).__name__} of length {len(out)}"
                if isinstance(out, tuple | list)
                else type(out).__name__
            )
            raise ValueError(f"{self.label} must return a pair (advantages, returns); it returned {got}")
        valid = response_mask.bool()
        for what, tensor in zip(("advantages", "returns"), out):
            self._check_tensor(what, tensor, response_mask, valid)
        return out[0], out[1]

    def _check_tensor(self, what: str, tensor: Any, response_mask: torch.Tensor, valid: torch.Tensor) -> None:
        if tensor is None:
            raise ValueError(
                f"{self.label} returned None for {what}; both advantages and returns are required"
            )
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{self.label}: {what} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.shape != response_mask.shape:
            raise ValueError(
                f"{self.label}: {what} has shape {tuple(tensor.shape)}, expected (bs, response_len)="
                f"{tuple(response_mask.shape)} like response_mask"
            )
        if not tensor.is_floating_point():
            raise ValueError(f"{self.label}: {what} must have a floating dtype, got {tensor.dtype}")
        if tensor.device != response_mask.device:
            raise ValueError(
                f"{self.label}: {what} is on {tensor.device}, response_mask on {response_mask.device}"
            )
        bad = valid & ~torch.isfinite(tensor)
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{self.label}: {what} has {int(bad.sum())} non-finite value(s) on valid tokens, "
                f"first at [{row}, {col}] = {tensor[row, col].item()}"
            )


def load_custom_advantage_fn(path: str, name: str) -> CustomAdvantageFn:
    """Import ``name`` from the Python file ``path`` and check that it can serve as the advantage estimator.

    Checked now: the file exists and imports, ``name`` exists and is callable, and its signature takes the
    keywords ``INPUT_NAMES``. Checked on each call: see ``CustomAdvantageFn``.

    Args:
        path: ``algorithm.custom_advantage_function.path``, a ``.py`` file.
        name: ``algorithm.custom_advantage_function.name``, the function (or callable object) in it.

    Returns:
        A ``CustomAdvantageFn``; call it with the keyword inputs of the module docstring.
    """
    if not name:
        raise ValueError(f"{CONFIG_KEY}.name is empty; set it to the name of the function in {path!r}")
    module = import_file(path, f"{CONFIG_KEY}.path")
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ValueError(
            f"{CONFIG_KEY}.name: {path!r} defines no {name!r} (callables defined there: {defined})"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise ValueError(f"{CONFIG_KEY}.name: {name!r} in {path!r} is a {type(fn).__name__}, not callable")
    _check_signature(fn, f"{name!r} in {path!r}")
    return CustomAdvantageFn(fn, path, name)
