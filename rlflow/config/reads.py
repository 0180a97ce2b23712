"""Which config keys a run actually reads: a diagnostic for "every accepted key is read or refused".

With ``RLFLOW_TRACK_CONFIG_READS=1`` in the driver's environment (the worker groups pass ``RLFLOW_*``
variables on to their actors), `track_reads` labels every section of the typed config with its key path
and makes the schema classes record each field read by rlflow code (copies, pickling and
``dataclasses.asdict`` for logging do not count: they are not rlflow code; validation reads the composed
``DictConfig``, not these objects). `config_reads` returns
the dotted key paths read in this process so far; a worker's come back with ``group.execute_fn``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

__all__ = ["ENV_VAR", "config_reads", "track_reads", "tracking_enabled"]

ENV_VAR = "RLFLOW_TRACK_CONFIG_READS"
_PATH_ATTR = "_rlflow_key_path"
_READS: set[str] = set()
_INSTALLED: set[type] = set()


def tracking_enabled() -> bool:
    """True when ``RLFLOW_TRACK_CONFIG_READS`` is set to a non-empty value other than 0."""
    return os.environ.get(ENV_VAR, "") not in ("", "0")


def _section_classes(section: Any) -> set[type]:
    """The classes of ``section`` and of every section under it (wherever the schema defines them)."""
    classes = {type(section)}
    for f in dataclasses.fields(section):
        value = object.__getattribute__(section, f.name)
        if dataclasses.is_dataclass(value):
            classes |= _section_classes(value)
    return classes


def _recording_getattribute(self: Any, name: str) -> Any:
    value = object.__getattribute__(self, name)
    if not name.startswith("_"):
        fields = object.__getattribute__(self, "__dataclass_fields__")
        if name in fields:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("rlflow.") and caller != __name__:
                path = object.__getattribute__(self, "__dict__").get(_PATH_ATTR)
                if path is not None:
                    _READS.add(f"{path}.{name}" if path else name)
    return value


def _label(section: Any, path: str) -> None:
    object.__setattr__(section, _PATH_ATTR, path)
    for f in dataclasses.fields(section):
        value = object.__getattribute__(section, f.name)
        if dataclasses.is_dataclass(value):
            _label(value, f"{path}.{f.name}" if path else f.name)


def track_reads(config: Any) -> None:
    """Label the sections of ``config`` (a typed `PPOTrainerConfig`) and record reads from now on.

    Idempotent; labels travel with the config when it is pickled to a worker.
    """
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"track_reads needs the typed config, got {type(config).__name__}")
    if _PATH_ATTR not in vars(config):
        _label(config, "")
    for cls in _section_classes(config):
        if cls not in _INSTALLED:
            cls.__getattribute__ = _recording_getattribute  # type: ignore[method-assign]
            _INSTALLED.add(cls)


def config_reads() -> set[str]:
    """Dotted key paths read by rlflow code in this process since `track_reads`."""
    return set(_READS)
