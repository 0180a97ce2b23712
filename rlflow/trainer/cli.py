"""Command-line arguments of the Hydra entry points (``main_ppo``, ``main_sft``, ``check_config``).

Hydra parses its own options (``--config-name``, ``--cfg``, ...) with argparse, whose positional
``overrides`` list stops at the first option: ``a=1 --config-name demo b=2`` fails with "unrecognized
arguments: b=2". Scripts that add overrides around the user's (the Slurm script does) put options in the
middle, so the entry points move Hydra's options to the front first.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["hydra_options_first", "split_config_name"]

_WITH_VALUE = {
    "--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd",
    "--cfg", "-c", "--package", "-p", "--experimental-rerun",
}  # fmt: skip
"""Hydra options followed by a value (``--config-name demo``); ``--config-name=demo`` is one argument."""


def hydra_options_first(args: Sequence[str]) -> list[str]:
    """``args`` with every option (and the value of those that take one) before the overrides, each group
    in its original order."""
    options, overrides, i = [], [], 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            options.append(arg)
            if arg in _WITH_VALUE and i + 1 < len(args):
                options.append(args[i + 1])
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return options + overrides


def split_config_name(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """``--config-name NAME`` / ``--config-name=NAME`` / ``-cn NAME`` out of ``args``: (NAME, the rest).

    Raises:
        ValueError: the option has no value.
    """
    name, rest, i = None, [], 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif arg in ("--config-name", "-cn"):
            if i + 1 >= len(args):
                raise ValueError(f"{arg} needs a config name, e.g. {arg} demo")
            name, i = args[i + 1], i + 1
        else:
            rest.append(arg)
        i += 1
    return name, rest
