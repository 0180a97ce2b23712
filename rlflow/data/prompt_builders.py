"""How a row's chat messages become the prompt text: the tokenizer's chat template, or a model family's own
encoder (``data.continuous_token``, verl's key).

verl's continuous-token mode builds a rollout's token ids with the model family's own builder and keeps them
across turns rather than re-rendering the conversation. rlflow's rollout is single-turn and never
re-tokenizes: the prompt's ids are followed by the generated ids as they were sampled, which is what that
mode keeps. What ``continuous_token.enable`` changes here is who renders the prompt:

* ``model_family: deepseekv4``: DeepSeek-V4 checkpoints ship no Jinja chat template; their format is the
  Python encoder in the checkpoint, ``encoding/encoding_dsv4.py`` (``encode_messages(messages,
  thinking_mode, ...)``). rlflow imports that file from the tokenizer's directory and renders each prompt
  with it: ``thinking_mode`` is ``"thinking"`` when ``data.apply_chat_template_kwargs.enable_thinking`` is
  true, else ``"chat"``; the other ``apply_chat_template_kwargs`` (``reasoning_effort``) are passed on.
* ``model_family: auto``: ``deepseekv4`` when the tokenizer's directory holds that encoder, else the chat
  template.

The rendered text carries its own special tokens (the encoder writes the BOS), so it is tokenized without
adding any, as the chat template's text is.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["DEEPSEEK_V4_ENCODER", "MODEL_FAMILIES", "encoder_path", "prompt_renderer", "resolve_family"]

MODEL_FAMILIES = ("auto", "deepseekv4")
"""``data.continuous_token.model_family`` values rlflow renders with."""

DEEPSEEK_V4_ENCODER = os.path.join("encoding", "encoding_dsv4.py")
"""Where a DeepSeek-V4 checkpoint keeps its chat encoder, relative to its directory."""

Renderer = Callable[[list[dict[str, Any]]], str]


def encoder_path(tokenizer_dir: str) -> str:
    """The DeepSeek-V4 encoder's path in ``tokenizer_dir`` (which may not exist)."""
    return os.path.join(os.path.expanduser(tokenizer_dir), DEEPSEEK_V4_ENCODER)


def resolve_family(enable: bool, family: str, tokenizer_dir: str | None) -> str:
    """``chat_template`` or ``deepseekv4``: the renderer ``data.continuous_token`` selects (module docstring)."""
    if not enable:
        return "chat_template"
    if family == "auto":
        found = tokenizer_dir is not None and os.path.isfile(encoder_path(tokenizer_dir))
        return "deepseekv4" if found else "chat_template"
    return family


def _load_encoder(path: str) -> Callable[..., str]:
    spec = importlib.util.spec_from_file_location("rlflow_dsv4_encoding", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"data.continuous_token: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    encode = getattr(module, "encode_messages", None)
    if not callable(encode):
        raise ValueError(
            f"data.continuous_token: {path} defines no encode_messages(messages, thinking_mode, ...)"
        )
    return encode


def prompt_renderer(tokenizer: Any, config: Any) -> tuple[Renderer, str]:
    """The function that renders one row's messages into prompt text for ``config`` (the ``data`` section),
    and which renderer it is (``chat_template`` or ``deepseekv4``).

    Args:
        tokenizer: the policy's tokenizer (its ``name_or_path`` is the directory an encoder is read from).
        config: ``data``: ``continuous_token`` (absent: off) and ``apply_chat_template_kwargs``.

    Raises:
        ValueError: ``deepseekv4`` without the encoder file, naming the path.
    """
    section = getattr(config, "continuous_token", None)
    kwargs = dict(config.apply_chat_template_kwargs)
    directory = getattr(tokenizer, "name_or_path", None) or None
    enable = section is not None and bool(section.enable)
    family = resolve_family(enable, str(section.model_family) if section is not None else "auto", directory)
    if family == "chat_template":

        def render(messages: list[dict[str, Any]]) -> str:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )

        return render, family
    path = encoder_path(str(directory))
    if not os.path.isfile(path):
        raise ValueError(
            f"data.continuous_token.model_family={family}: no DeepSeek-V4 encoder at {path} (the "
            "checkpoint's encoding/encoding_dsv4.py); point actor_rollout_ref.model.tokenizer_path at the "
            "checkpoint, or set model_family=auto to use the tokenizer's chat template"
        )
    encode = _load_encoder(path)
    thinking = "thinking" if kwargs.pop("enable_thinking", False) else "chat"
    logger.info("data.continuous_token: prompts rendered by %s (thinking_mode=%s)", path, thinking)

    def render_dsv4(messages: list[dict[str, Any]]) -> str:
        return encode([dict(m) for m in messages], thinking_mode=thinking, **kwargs)

    return render_dsv4, family
