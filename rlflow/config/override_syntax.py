"""The syntax of one Hydra command-line override, shared by the rewrites of verl's spellings
(`rlflow.config.aliases`, `rlflow.config.profiler_layout`, `rlflow.config.megatron_layout`), and their
log-once notes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

__all__ = [
    "HYDRA_PREFIXES",
    "NULL_SPELLINGS",
    "check_produced",
    "note_once",
    "parse_bool",
    "same_value",
    "split_override",
    "unquote",
]

HYDRA_PREFIXES = ("++", "+", "~")
"""Hydra's override prefixes: force-add, add, delete (longest first)."""
NULL_SPELLINGS = ("null", "none", "~", "")
"""How a command line writes null (compared lower-cased, unquoted)."""

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def split_override(override: str) -> tuple[str, str, str]:
    """``(hydra prefix, key, "=value" or "")`` of one command-line override.

    >>> split_override("+data.x=1")
    ('+', 'data.x', '=1')
    >>> split_override("~trainer.logger")
    ('~', 'trainer.logger', '')
    """
    prefix = next((p for p in HYDRA_PREFIXES if override.startswith(p)), "")
    key, sep, value = override[len(prefix) :].partition("=")
    return prefix, key, sep + value


def unquote(value: str) -> str:
    """An override's value without surrounding blanks and shell-style quotes."""
    return value.strip().strip("'\"")


def parse_bool(key: str, value: str) -> bool:
    """The boolean an override's value spells (true / false, 1 / 0, yes / no, any case).

    Raises:
        ValueError: any other value, naming ``key``.
    """
    text = unquote(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{key}={value}: expected true or false")


def same_value(key: str, a: str, b: str) -> bool:
    """Whether two override values of ``key`` are the same: booleans in any spelling, else the unquoted text."""
    try:
        return parse_bool(key, a) == parse_bool(key, b)
    except ValueError:
        return unquote(a) == unquote(b)


def check_produced(
    overrides: Iterable[str],
    produced: Mapping[str, tuple[str, str]],
    message: str,
    canonical: Callable[[str], str] = lambda key: key,
) -> None:
    """Refuse an override that sets a key a rewrite produced to another value than the rewrite did.

    Args:
        overrides: the rewritten overrides.
        produced: rlflow key -> (the verl override that set it, the value it set).
        message: the error, formatted with ``key``, ``origin``, ``value`` and ``item`` (the other override).
        canonical: rlflow's spelling of a key, to find the other override under a verl spelling.

    Raises:
        ValueError: ``message`` for the first contradicting override.
    """
    for item in overrides:
        _, key, rest = split_override(item)
        key = canonical(key)
        if key in produced and rest:
            origin, value = produced[key]
            if not same_value(key, rest.removeprefix("="), value):
                raise ValueError(message.format(key=key, origin=origin, value=value, item=item))


_NOTED: set[str] = set()


def note_once(log: logging.Logger, key: str, message: str, *args: object) -> None:
    """Log ``message % args`` at INFO on ``log`` the first time ``key`` is noted in this process (a rewrite
    of a verl spelling is said once, however often the config is composed)."""
    if key not in _NOTED:
        _NOTED.add(key)
        log.info(message, *args)
