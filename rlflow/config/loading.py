"""Where the trainer config lives and how it is composed: Hydra, the critic config file, verl aliases.

``main_ppo`` uses ``@hydra.main(config_path=str(config_dir()), config_name="ppo_trainer",
version_base=None)``, then `apply_critic_config_file` and `rlflow.config.validate.validate_config`.
Importing `rlflow.config.schema` registers the typed schema with Hydra's ConfigStore, which
``ppo_trainer.yaml`` names in its defaults list.

Precedence, lowest first: schema defaults = ``ppo_trainer.yaml`` < command-line overrides < the critic
config file (``critic.config_path``), whose keys override the ``critic`` group after composition.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlflow.config.aliases import rewrite_critic_file_keys, rewrite_overrides
from rlflow.config.reads import track_reads, tracking_enabled
from rlflow.config.schema import PPOTrainerConfig, register_configs
from rlflow.config.sft_schema import SFTConfig, register_sft_configs
from rlflow.config.suggest import check_override_keys, drop_append_on_known_keys

__all__ = [
    "CONFIG_NAME",
    "DEMO_CONFIG_NAME",
    "SFT_CONFIG_NAME",
    "YAML_PACKAGE",
    "apply_critic_config_file",
    "config_dir",
    "config_section",
    "load_config",
    "load_sft_config",
    "resolve_critic_config_path",
    "to_typed",
    "to_typed_sft",
]

CONFIG_NAME = "ppo_trainer"
"""Name of the main config file (``config/ppo_trainer.yaml``): verl's defaults."""

DEMO_CONFIG_NAME = "demo"
"""The embedded CPU demo's config (``config/demo.yaml``): ``ppo_trainer`` with the demo's own values
(``python -m rlflow.trainer.main_ppo --config-name demo``)."""

YAML_PACKAGE = "rlflow.config.files"
"""The package the repository's top-level ``config/`` directory is installed as (``setup.py``)."""

SFT_CONFIG_NAME = "sft_trainer"
"""Name of the SFT trainer's config file (``config/sft_trainer.yaml``)."""

register_configs()  # before any ``@hydra.main`` app (main_ppo, main_sft) composes its YAML
register_sft_configs()

_CRITIC_PATH_KEY = "critic.config_path"


def config_dir() -> Path:
    """Absolute path of the Hydra config directory (the one holding ``ppo_trainer.yaml``).

    The repository's ``config/`` is installed as the package `YAML_PACKAGE` (see ``setup.py``); when
    that package is not importable (running from a source tree that was not installed), the ``config/``
    next to the ``rlflow`` package is used.

    Returns:
        The directory, absolute.

    Raises:
        FileNotFoundError: when neither location holds ``ppo_trainer.yaml``.
    """
    candidates = []
    with contextlib.suppress(ModuleNotFoundError, TypeError):
        candidates.append(Path(str(files(YAML_PACKAGE))))
    candidates.append(Path(__file__).resolve().parents[2] / "config")
    for candidate in candidates:
        if (candidate / f"{CONFIG_NAME}.yaml").is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"cannot find {CONFIG_NAME}.yaml in the {YAML_PACKAGE} package or in {candidates[-1]}; "
        "reinstall rlflow (pip install -e .)"
    )


@contextlib.contextmanager
def _own_global_hydra() -> Iterator[None]:
    """Let ``initialize_config_dir`` run even inside a Hydra app; restore the app's Hydra afterwards."""
    saved = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().hydra = saved


def load_config(overrides: Sequence[str] | None = None, config_name: str = CONFIG_NAME) -> DictConfig:
    """Compose the trainer config in Python (notebooks, scripts, tests), as the command line would.

    Composes ``config_name`` from `config_dir` with Hydra's compose API, then applies the critic config
    file (`apply_critic_config_file`). It does not validate: call `validate_config` next.

    Args:
        overrides: Hydra overrides, e.g. ``["algorithm.adv_estimator=grpo", "data.train_batch_size=8"]``;
            verl's spellings of renamed keys are accepted (`rlflow.config.aliases`).
        config_name: config file name without ``.yaml``: `CONFIG_NAME` (verl's defaults) or
            `DEMO_CONFIG_NAME` (the embedded CPU demo).

    Returns:
        The composed config, typed by the schema and in struct mode (unknown keys raise).

    Raises:
        ValueError: an override names a key the schema does not have (with the closest keys).
        hydra.errors.ConfigCompositionException: an override has the wrong type (the message names the
            key path).
        ValueError: a problem with the critic config file.
    """
    register_configs()
    overrides = drop_append_on_known_keys(rewrite_overrides(overrides or []), PPOTrainerConfig)
    check_override_keys(overrides, PPOTrainerConfig)
    with _own_global_hydra(), initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return apply_critic_config_file(cfg)


def load_sft_config(overrides: Sequence[str] | None = None) -> DictConfig:
    """Compose the SFT trainer config (``config/sft_trainer.yaml``) in Python, as ``main_sft`` would.

    Args:
        overrides: Hydra overrides, e.g. ``["optim.lr=1e-4", "trainer.total_training_steps=10"]``.

    Returns:
        The composed config, typed by `rlflow.config.sft_schema.SFTConfig` (unknown keys raise); not
        validated (`rlflow.config.sft_validate.validate_sft_config`).
    """
    register_sft_configs()
    overrides = drop_append_on_known_keys(overrides or [], SFTConfig)
    check_override_keys(overrides, SFTConfig, doc="config/sft_trainer.yaml")
    with _own_global_hydra(), initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        return compose(config_name=SFT_CONFIG_NAME, overrides=list(overrides or []))


def to_typed_sft(cfg: DictConfig) -> SFTConfig:
    """The composed SFT config as `SFTConfig` dataclasses, interpolations resolved."""
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, SFTConfig):
        raise TypeError(f"to_typed_sft expects a composed SFT config, got {type(typed).__name__}")
    return typed


def resolve_critic_config_path(path: str) -> Path:
    """Find the critic config file ``path``: as given (absolute, or relative to the working directory),
    then relative to `config_dir`.

    Args:
        path: the value of ``critic.config_path``.

    Returns:
        The absolute path of an existing file.

    Raises:
        ValueError: naming ``critic.config_path`` and the places looked at, when no file is found.
    """
    expanded = Path(os.path.expanduser(str(path)))
    candidates = [expanded.resolve()]
    if not expanded.is_absolute():
        candidates.append((config_dir() / expanded).resolve())
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise ValueError(f"{_CRITIC_PATH_KEY}={path!r}: no such file (looked at {looked})")


def _load_critic_file(path: Path) -> DictConfig:
    """Read the critic config file as a mapping (ValueError naming the file otherwise)."""
    try:
        content = OmegaConf.load(path)
    except Exception as err:  # YAML syntax errors come in several exception types
        raise ValueError(f"{_CRITIC_PATH_KEY}: cannot read {path}: {err}") from err
    if not isinstance(content, DictConfig):
        raise ValueError(
            f"{_CRITIC_PATH_KEY}: {path} must hold a mapping of critic keys, got {type(content).__name__}"
        )
    if "config_path" in content:
        raise ValueError(f"{_CRITIC_PATH_KEY}: {path} sets critic.config_path itself; remove that key")
    return content


def apply_critic_config_file(cfg: DictConfig) -> DictConfig:
    """Override the ``critic`` group with the keys of the YAML file ``critic.config_path`` (if set).

    The file holds keys of the ``critic`` group (no ``critic:`` prefix), e.g. a different parallel layout
    (``world_size``, ``ulysses_sequence_parallel_size``, ``use_dynamic_bsz``, ``strategy``) or a different
    ``optim.lr`` / ``model.path``. Its keys take precedence over command-line ``critic.*`` overrides.
    Interpolations in the file resolve against the whole config. ``critic.config_path`` becomes the
    absolute path of the file, so applying twice gives the same config.

    Args:
        cfg: a composed config (`load_config` or ``@hydra.main``); not modified.

    Returns:
        The merged config (struct mode and schema types kept), or ``cfg`` when no file is set.

    Raises:
        ValueError: the file is missing or not a mapping (naming ``critic.config_path``), or holds an
            unknown key or a value of the wrong type (naming the file and the key path, e.g.
            ``critic.optim.lrr``).
    """
    path = cfg.critic.config_path
    if path is None:
        return cfg
    resolved = resolve_critic_config_path(path)
    content = OmegaConf.create(rewrite_critic_file_keys(OmegaConf.to_container(_load_critic_file(resolved))))
    try:
        merged = OmegaConf.merge(cfg, {"critic": content})
    except ConfigKeyError as err:
        key = err.full_key or "critic"
        raise ValueError(
            f"{_CRITIC_PATH_KEY}: {resolved} sets unknown key {key!r} ({str(err).splitlines()[0]})"
        ) from err
    except (ValidationError, OmegaConfBaseException) as err:
        key = err.full_key or "critic"
        raise ValueError(
            f"{_CRITIC_PATH_KEY}: {resolved} sets a bad value for {key!r}: {str(err).splitlines()[0]}"
        ) from err
    merged.critic.config_path = str(resolved)
    return merged


def to_typed(cfg: DictConfig) -> PPOTrainerConfig:
    """The composed config as the schema's dataclasses, interpolations resolved.

    This is what the driver and every worker read (by attribute): picklable, with one set of defaults
    (the schema's).

    Args:
        cfg: a composed (and validated) config.

    Returns:
        A `rlflow.config.schema.PPOTrainerConfig` instance.
    """
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, PPOTrainerConfig):
        raise TypeError(f"to_typed expects a composed PPO trainer config, got {type(typed).__name__}")
    if tracking_enabled():
        track_reads(typed)
    return typed


@functools.cache
def _schema_defaults() -> DictConfig:
    return OmegaConf.structured(PPOTrainerConfig)


def config_section(path: str, /, **overrides: Any) -> Any:
    """One typed section of the default config, with ``overrides`` applied (library and test use).

    Interpolated defaults (``rollout.prompt_length`` follows ``data.max_prompt_length``, ...) resolve
    in the context of the whole default config, so a section built here is what the trainer would hand
    a component; keys of a nested section are dotted (``val_kwargs.n=2``).

    Args:
        path: a section's key path, e.g. ``"actor_rollout_ref.rollout"``.
        **overrides: values for keys of that section (``"a.b"`` spelled ``a__b``).

    Returns:
        The section's dataclass instance.

    Raises:
        ValueError: an unknown section or key (naming it).
    """
    cfg = _schema_defaults().copy()
    if OmegaConf.select(cfg, path) is None:
        raise ValueError(f"config_section: {path!r} is not a section of the trainer config")
    for key, value in overrides.items():
        full = f"{path}.{key.replace('__', '.')}"
        try:
            OmegaConf.update(cfg, full, value, merge=True)
        except (ConfigKeyError, ValidationError, OmegaConfBaseException) as err:
            raise ValueError(
                f"config_section: cannot set {full}={value!r}: {str(err).splitlines()[0]}"
            ) from err
    return OmegaConf.to_object(OmegaConf.select(cfg, path))
