"""Options of a custom dataset class that verl scripts add under ``data`` (``+data.cis.swap_seed=7``).

verl hands its whole ``data`` config to the dataset class ``data.custom_cls`` names, so a script can give
that class options of its own with Hydra's ``+``: verl's InternVL CIS example adds ``+data.cis.*`` for
its ``CISGrpoDataset``, which reads ``config.get("cis", {})``. rlflow's ``data`` section is typed, so
such keys would be refused as unknown. When the command line names a dataset class
(``data.custom_cls.path``), each ``+data.<name>...`` override whose ``<name>`` is not one of rlflow's
``data`` keys is rewritten into ``data.custom_options.<name>...`` (logged once per name), a free-form
mapping the class reads back as ``config.get("<name>")`` or ``config.<name>``
(`rlflow.config.schema.DataConfig`). Without a dataset class the key stays unknown and is refused with
the closest keys, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import fields

from rlflow.config.override_syntax import note_once, split_override, unquote
from rlflow.config.schema import DataConfig

__all__ = ["rewrite_dataset_options"]

logger = logging.getLogger(__name__)

_NULL = ("", "null", "none", "~")


def _names_a_class(overrides: list[str]) -> bool:
    for item in overrides:
        prefix, key, rest = split_override(item)
        if (
            key == "data.custom_cls.path"
            and prefix != "~"
            and unquote(rest.removeprefix("=")).lower() not in _NULL
        ):
            return True
    return False


def _data_keys() -> frozenset[str]:
    return frozenset(f.name for f in fields(DataConfig))


def rewrite_dataset_options(overrides: Iterable[str]) -> list[str]:
    """``+data.<name>...`` -> ``+data.custom_options.<name>...`` for names rlflow's ``data`` lacks, when the
    command line names a dataset class (see the module docstring).

    Args:
        overrides: command-line overrides.

    Returns:
        The overrides with each such key moved under ``data.custom_options``.
    """
    overrides = list(overrides)
    if not _names_a_class(overrides):
        return overrides
    return list(_rewrite(overrides, _data_keys()))


def _rewrite(overrides: list[str], known: frozenset[str]) -> Iterator[str]:
    for item in overrides:
        prefix, key, rest = split_override(item)
        name = key.split(".")[1] if key.startswith("data.") and key.count(".") >= 1 else ""
        if prefix in ("+", "++") and rest and name and name not in known:
            new = "data.custom_options." + key.removeprefix("data.")
            note_once(
                logger,
                f"data.{name}",
                "config key data.%s is not one of rlflow's data keys: the dataset class of data.custom_cls reads "
                "it as config.get(%r) (data.custom_options.%s)",
                name,
                name,
                name,
            )
            yield f"+{new}{rest}"
        else:
            yield item
