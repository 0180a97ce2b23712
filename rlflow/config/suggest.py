"""Unknown command-line keys, caught before composition, with "did you mean" suggestions.

Hydra refuses a key the schema does not have ("Key 'lrr' is not in struct") without saying which key was
meant. `check_override_keys` runs first — in `rlflow.config.loading.load_config` and the ``main_*``
entry points, after verl's spellings are rewritten (`rlflow.config.aliases`) — and names the closest
keys of the schema: the keys that end the same way (a key typed under the wrong section), then the
closest spellings.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.nodes import BooleanNode

from rlflow.config.verl_unsupported import unsupported_advice

__all__ = [
    "boolean_keys",
    "check_override_keys",
    "drop_append_on_known_keys",
    "schema_keys",
    "suggest_keys",
]

logger = logging.getLogger(__name__)


@functools.cache
def _schema_nodes(schema: type) -> tuple[tuple[str, Any], ...]:
    """``(dotted key, node)`` of every section and leaf of a structured config; the entries of free-form
    mappings (``dict`` fields) are not walked."""
    nodes: list[tuple[str, Any]] = []

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node.keys():
            key, child = f"{prefix}{name}", node._get_node(name)
            nodes.append((key, child))
            if isinstance(child, DictConfig) and OmegaConf.get_type(child) not in (dict, None):
                walk(child, key + ".")

    walk(OmegaConf.structured(schema), "")
    return tuple(nodes)


def _is_open(node: Any) -> bool:
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) in (dict, None)


@functools.cache
def schema_keys(schema: type) -> tuple[frozenset[str], frozenset[str]]:
    """Dotted keys of a structured config: ``(keys, open_sections)``.

    ``keys`` holds every section and leaf; ``open_sections`` the free-form mappings (``dict`` fields such
    as ``custom_reward_function.reward_kwargs``), under which any key is accepted.
    """
    nodes = _schema_nodes(schema)
    return frozenset(k for k, _ in nodes), frozenset(k for k, node in nodes if _is_open(node))


def suggest_keys(key: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """Known leaf keys close to ``key``: same last component first (nearest spelling first), then
    spellings. Sections (keys that prefix others) are not suggested."""
    known = sorted(known)
    sections = {k.rsplit(".", 1)[0] for k in known if "." in k}
    known = [k for k in known if k not in sections]
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
    same_leaf.sort(key=lambda k: -difflib.SequenceMatcher(None, key, k).ratio())
    close = difflib.get_close_matches(key, known, n=limit, cutoff=0.75)
    out: list[str] = []
    for k in [*same_leaf, *close]:
        if k not in out:
            out.append(k)
    return out[:limit]


def _override_key(item: str) -> str | None:
    """The key a plain ``key=value`` override sets; None for flags, ``+``/``~`` forms and ``hydra.*``."""
    if item.startswith(("-", "+", "~")) or "=" not in item:
        return None
    key = item.split("=", 1)[0].strip()
    return None if key == "hydra" or key.startswith("hydra.") else key


def _under_open_section(key: str, open_sections: frozenset[str]) -> bool:
    """Whether ``key`` lies inside one of the free-form sections (an entry of a ``dict`` field)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in open_sections for i in range(1, len(parts)))


@functools.cache
def boolean_keys(schema: type) -> frozenset[str]:
    """Dotted keys of the structured config ``schema`` whose value is a boolean."""
    return frozenset(k for k, node in _schema_nodes(schema) if isinstance(node, BooleanNode))


def drop_append_on_known_keys(overrides: Iterable[str], schema: type) -> list[str]:
    """``+key=value`` for a key the schema already has becomes ``key=value`` (logged once per key).

    Hydra's ``+`` appends a key that is not in the config and fails on one that is ("Could not append to
    config. An item is already at ..."). verl scripts written before verl added a key (``+trainer.
    val_before_train=False``) pass it with ``+``; rlflow's schema has the key, so the override means the
    plain assignment. Keys under free-form sections (``override_config``, ``reward_kwargs``) keep their
    ``+``: there it adds a new entry. The other way round, a plain ``key=value`` under a free-form section
    becomes ``++key=value`` (add or replace): Hydra refuses to assign an entry the mapping does not have
    yet, and verl declares some such entries in its own YAML (``rollout.engine_kwargs.vllm.*``), so its
    scripts set them without ``+``. A boolean key given no value (``data.return_raw_chat=``: a shell
    variable the script never set) is false, as verl's code reads the empty string (warned).
    """
    keys, open_sections = schema_keys(schema)
    booleans = boolean_keys(schema)
    out = []
    for item in overrides:
        key, sep, value = item.lstrip("+").partition("=")
        if sep and not value.strip() and key.strip() in booleans:
            logger.warning(
                "%s has no value (an unset shell variable?): read as %s=false, as verl reads the empty string",
                item,
                key.strip(),
            )
            item = f"{item.rstrip()}false"
        if item.startswith("+") and not item.startswith("++") and "=" in item:
            key = item[1:].split("=", 1)[0].strip()
            if key in keys:
                logger.info("'+%s': the key exists in rlflow's config; applied as %s=...", key, key)
                item = item[1:]
        elif item[:1] not in ("+", "~", "-") and "=" in item:
            key = item.split("=", 1)[0].strip()
            if key not in keys and _under_open_section(key, open_sections):
                item = "++" + item
        out.append(item)
    return out


def check_override_keys(overrides: Iterable[str], schema: type, doc: str = "docs/configuration.md") -> None:
    """Refuse overrides whose key the schema does not have, suggesting the keys meant.

    Args:
        overrides: command-line overrides, verl spellings already rewritten.
        schema: the root dataclass (``PPOTrainerConfig``, ``SFTConfig``).
        doc: where the keys are listed (named in the message).

    Raises:
        ValueError: ``unknown config key 'trainer.total_epoch' (did you mean 'trainer.total_epochs'?)``,
            one line per unknown key.
    """
    keys, open_sections = schema_keys(schema)
    problems = []
    for item in overrides:
        key = _override_key(item)
        if key is None and item.startswith("+") and not item.startswith("++") and "=" in item:
            key = item[1:].split("=", 1)[0].strip()  # an appended key: refused here only with advice
            if unsupported_advice(key) is None:
                continue
        if key is None or key in keys:
            continue
        if _under_open_section(key, open_sections):
            continue
        advice = unsupported_advice(key)
        if advice is not None:
            problems.append(f"{key}: {advice}")
            continue
        hint = suggest_keys(key, keys)
        meant = f" (did you mean {' or '.join(repr(k) for k in hint)}?)" if hint else ""
        problems.append(f"unknown config key {key!r}{meant}")
    if problems:
        raise ValueError("; ".join(problems) + f" — every key is listed in {doc}")
