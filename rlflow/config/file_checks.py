"""Checks that touch the file system or import user code, used last by `config_validate`: data files,
local model/tokenizer paths, the resume directory, ``custom_reward_function``,
``algorithm.custom_advantage_function``, ``data.custom_cls``, and that ``data.tokenizer`` is the policy's."""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlflow.algos.custom import load_custom_advantage_fn
from rlflow.config.checks import value_at
from rlflow.data.custom_dataset import load_dataset_class
from rlflow.reward.custom import load_custom_reward_fn

__all__ = ["check_data_tokenizer", "check_files", "check_user_code"]


def _exists(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path))


def _check_data_files(cfg: DictConfig, key: str) -> None:
    value = value_at(cfg, key)
    if value is None:
        return
    if isinstance(value, str):
        items = [(key, value)]
    elif isinstance(value, ListConfig | list | tuple) and len(value) > 0:
        items = [(f"{key}[{i}]", path) for i, path in enumerate(value)]
    else:
        raise ValueError(f"{key}={value!r} must be a file path, a non-empty list of paths, or null")
    for label, path in items:
        if not isinstance(path, str):
            raise ValueError(f"{label}={path!r} must be a file path")
        if not _exists(path):
            raise ValueError(
                f"{label}: no such file {path!r} (resolved to {os.path.abspath(os.path.expanduser(path))})"
            )


def _check_local_path(cfg: DictConfig, key: str) -> None:
    """A path that is clearly local (absolute, ``~``, ``./``, ``../``) must exist; hub ids pass."""
    path = value_at(cfg, key)
    if path is None or path.startswith("rlflow://"):
        return
    local = os.path.isabs(os.path.expanduser(path)) or path.startswith(("./", "../")) or path in (".", "..")
    if local and not _exists(path):
        raise ValueError(f"{key}={path!r}: no such file or directory")


def check_files(cfg: DictConfig, *, critic: bool) -> None:
    """Data files, local model and tokenizer paths (the critic's when ``critic``), the resume path."""
    _check_data_files(cfg, "data.train_files")
    _check_data_files(cfg, "data.val_files")
    for key in ("data.tokenizer", "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path"):
        _check_local_path(cfg, key)
    if critic:
        _check_local_path(cfg, "critic.model.path")
        _check_local_path(cfg, "critic.model.tokenizer_path")
    if value_at(cfg, "reward_model.enable"):
        _check_local_path(cfg, "reward_model.model.path")
    _check_continuous_token(cfg)
    if value_at(cfg, "trainer.resume_mode") == "resume_path":
        path = value_at(cfg, "trainer.resume_from_path")
        if path is None:
            raise ValueError("trainer.resume_from_path must be set when trainer.resume_mode=resume_path")
        if not _exists(path):
            raise ValueError(
                f"trainer.resume_from_path={path!r}: no such directory (trainer.resume_mode=resume_path)"
            )


def _check_continuous_token(cfg: DictConfig) -> None:
    """``data.continuous_token``: a family rlflow renders with (`rlflow.data.prompt_builders`), no builder
    module, and for ``deepseekv4`` the checkpoint's encoder in the policy's tokenizer directory."""
    from rlflow.data.prompt_builders import DEEPSEEK_V4_ENCODER, MODEL_FAMILIES, encoder_path

    section = "data.continuous_token"
    family = value_at(cfg, f"{section}.model_family")
    if family not in MODEL_FAMILIES:
        raise ValueError(
            f"{section}.model_family={family!r}: rlflow renders prompts with the tokenizer's chat template (auto) "
            f"or DeepSeek-V4's own encoder (deepseekv4, the checkpoint's {DEEPSEEK_V4_ENCODER}); give the "
            "tokenizer a chat template in that family's format (actor_rollout_ref.model.custom_chat_template) and "
            "set auto"
        )
    if value_at(cfg, f"{section}.custom_builder_module") is not None:
        raise ValueError(
            f"{section}.custom_builder_module: verl's builder classes are not loaded; render the prompts with a "
            "chat template (actor_rollout_ref.model.custom_chat_template) and drop the key"
        )
    if not value_at(cfg, f"{section}.enable") or family != "deepseekv4":
        return
    model = "actor_rollout_ref.model"
    directory = value_at(cfg, f"{model}.tokenizer_path") or value_at(cfg, f"{model}.path")
    if (
        directory is not None
        and "://" not in str(directory)
        and not os.path.isfile(encoder_path(str(directory)))
    ):
        raise ValueError(
            f"{section}.model_family=deepseekv4: no DeepSeek-V4 encoder at {encoder_path(str(directory))} (the "
            f"checkpoint's {DEEPSEEK_V4_ENCODER}, which renders its prompts); point {model}.tokenizer_path at the "
            "checkpoint, or set model_family=auto to use the tokenizer's chat template"
        )


def _check_custom_reward(cfg: DictConfig) -> None:
    prefix = "custom_reward_function"
    path, name = value_at(cfg, f"{prefix}.path"), value_at(cfg, f"{prefix}.name")
    if path is None:
        return
    if not name:
        raise ValueError(f"{prefix}.name must be set when {prefix}.path={path!r} is")
    kwargs = value_at(cfg, f"{prefix}.reward_kwargs")
    kwargs = OmegaConf.to_container(kwargs) if isinstance(kwargs, DictConfig) else dict(kwargs or {})
    try:
        load_custom_reward_fn(path, name, kwargs)
    except Exception as err:
        if isinstance(err, ValueError) and prefix in str(err):
            raise
        raise ValueError(f"{prefix} (path={path!r}, name={name!r}): {err}") from err


def _check_custom_advantage(cfg: DictConfig) -> None:
    prefix = "algorithm.custom_advantage_function"
    path, name = value_at(cfg, f"{prefix}.path"), value_at(cfg, f"{prefix}.name")
    if (path is None) != (name is None):
        raise ValueError(
            f"{prefix}.path and {prefix}.name must be set together (path={path!r}, name={name!r})"
        )
    if path is None:
        return
    load_custom_advantage_fn(path, name)  # its errors name the key path


def check_user_code(cfg: DictConfig) -> None:
    """Import the custom reward and advantage functions and the dataset class, so a broken file fails
    before Ray starts (the dataset's items are checked when the trainer builds it, also before Ray)."""
    _check_custom_reward(cfg)
    _check_custom_advantage(cfg)
    load_dataset_class(value_at(cfg, "data.custom_cls.path"), value_at(cfg, "data.custom_cls.name"))
    options = value_at(cfg, "data.custom_options")
    if options and value_at(cfg, "data.custom_cls.path") is None:
        raise ValueError(
            f"data.custom_options ({sorted(options)}) are read only by a dataset class of yours: set "
            "data.custom_cls.path / name, or drop them"
        )


def check_data_tokenizer(cfg: DictConfig) -> None:
    """``data.tokenizer`` (verl: the tokenizer of the prompts) may only name the policy's tokenizer: the
    rollout decodes and the trainer scores with that one, so prompts tokenized by another would be read
    as other tokens."""
    tokenizer = value_at(cfg, "data.tokenizer")
    if tokenizer is None:
        return
    model = "actor_rollout_ref.model"
    policy = value_at(cfg, f"{model}.tokenizer_path") or value_at(cfg, f"{model}.path")

    def where(path: str) -> str:
        return path if "://" in path else os.path.abspath(os.path.expanduser(path))

    if policy is None or where(str(tokenizer)) != where(str(policy)):
        raise ValueError(
            f"data.tokenizer={tokenizer!r}: the prompts must be tokenized with the policy's tokenizer "
            f"({model}.tokenizer_path, else {model}.path: {policy!r}), which the rollout decodes with; set "
            f"{model}.tokenizer_path={tokenizer} instead, or drop data.tokenizer"
        )
