"""The one importer of user Python files (custom reward and advantage functions, registration modules).

A file is imported once per process and content: the module is named after a hash of its absolute path and
modification time and kept in ``sys.modules`` (dataclasses and pickling look it up there), so loading the
same file again returns the same module — a file that registers an estimator can be named by several
config keys without registering twice — while an edited file is imported afresh.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["EXTERNAL_LIB_KEY", "external_lib_entries", "import_external_libs", "import_file", "load_function"]

EXTERNAL_LIB_KEY = "actor_rollout_ref.model.external_lib"


def import_file(path: str | os.PathLike, key: str) -> ModuleType:
    """Import the Python file ``path`` as a module.

    Args:
        path: a ``.py`` file (``~`` expanded, relative to the working directory).
        key: the config key that names the file (``custom_reward_function.path``), for error messages.

    Returns:
        The module.

    Raises:
        ValueError: naming ``key``: no such file, not importable, or an exception while importing it.
    """
    if not path:
        raise ValueError(f"{key} is empty; set it to a Python file")
    abspath = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(abspath):
        raise ValueError(f"{key}={str(path)!r}: no such file (resolved to {abspath})")
    stamp = f"{abspath}:{os.stat(abspath).st_mtime_ns}"
    module_name = "rlflow_user_" + hashlib.sha1(stamp.encode()).hexdigest()[:16]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, abspath)
    if spec is None or spec.loader is None:
        raise ValueError(f"{key}={str(path)!r} cannot be imported as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise ValueError(f"{key}={str(path)!r}: importing it failed: {type(err).__name__}: {err}") from err
    return module


def load_function(path: str | os.PathLike, name: str, prefix: str) -> Callable:
    """The callable ``name`` of the Python file ``path``.

    Args:
        path: the file (``<prefix>.path``).
        name: the attribute (``<prefix>.name``).
        prefix: the config section, e.g. ``custom_reward_function``.

    Raises:
        ValueError: naming ``<prefix>.path`` or ``<prefix>.name``.
    """
    module = import_file(path, f"{prefix}.path")
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"{prefix}.name={name!r} is not defined in {str(path)!r}")
    if not callable(fn):
        raise ValueError(f"{prefix}.name={name!r} in {str(path)!r} is a {type(fn).__name__}, not callable")
    return fn


def external_lib_entries(value: object) -> list[str]:
    """The entries of ``actor_rollout_ref.model.external_lib``: None, one string or a list of strings."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    try:
        entries = [str(v) for v in value]  # type: ignore[union-attr]
    except TypeError:
        raise ValueError(
            f"{EXTERNAL_LIB_KEY}={value!r}: a module name, a .py file or a list of them"
        ) from None
    return entries


def import_external_libs(value: object) -> list[ModuleType]:
    """Import the user's modules named by ``actor_rollout_ref.model.external_lib`` (verl's key for the
    modules that register HF models; in rlflow also the modules that register advantage estimators,
    policy losses and reward managers). The driver imports them before it validates the config, so the
    names they register are accepted, and every worker before it builds its model.

    Args:
        value: None, or one entry or a list of them: an importable module name (``my_pkg.rl_ext``) or a
            path to a ``.py`` file.

    Returns:
        The modules, in order.

    Raises:
        ValueError: naming the key and the entry that cannot be imported.
    """
    modules = []
    for entry in external_lib_entries(value):
        if entry.endswith(".py") or os.sep in entry:
            modules.append(import_file(entry, EXTERNAL_LIB_KEY))
            continue
        try:
            modules.append(importlib.import_module(entry))
        except Exception as err:
            raise ValueError(
                f"{EXTERNAL_LIB_KEY}: cannot import {entry!r}: {type(err).__name__}: {err} (a module on "
                "the Python path of the driver and of every worker, or a path to a .py file)"
            ) from err
    return modules
