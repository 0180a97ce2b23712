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

__all__ = ["import_file", "load_function"]


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
