"""Load tokenizers and models for the actor, reference, critic and reward roles.

Every loader takes a local Hugging Face directory (or ``"rlflow://tiny"``, the embedded default from
:mod:`rlflow.models.tiny`). ``trust_remote_code`` is off unless the caller turns it on. Load failures raise
``ValueError`` naming the path.

* :func:`load_causal_lm`: actor and reference policy (``AutoModelForCausalLM``).
* :func:`load_value_model`: the PPO critic, a token-level value model
  (``AutoModelForTokenClassification`` with one label: one value per token). It can start from a causal-LM
  (actor / SFT) checkpoint that has no value head; the head is then freshly initialised from a seeded
  generator, and a warning says so.
* :func:`load_reward_model`: a sequence-classification reward model (one label).
* :func:`resolve_attn_implementation`: ``"auto"`` picks ``flash_attention_2`` only when flash-attn is
  importable and CUDA is available, else ``sdpa``.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from typing import Any

import torch

from rlflow.models.lora import output_head
from rlflow.models.tiny import resolve_model_path
from rlflow.utils.dtypes import to_torch_dtype

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "apply_config_overrides",
    "load_causal_lm",
    "load_model_config",
    "load_reward_model",
    "load_tokenizer",
    "load_value_model",
    "meta_model",
    "resolve_attn_implementation",
    "resolve_dtype",
]

logger = logging.getLogger(__name__)

ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2", "ulysses_sdpa")
"""Names accepted by :func:`resolve_attn_implementation`."""


def flash_attn_available() -> bool:
    """True when the ``flash_attn`` package is importable and a CUDA device is visible."""
    return importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()


def resolve_attn_implementation(name: str | None = "auto") -> str:
    """Turn a configured attention backend into the name transformers expects.

    Args:
        name: one of :data:`ATTN_IMPLEMENTATIONS`; None means ``"auto"``.

    Returns:
        ``"flash_attention_2"`` for ``"auto"`` when :func:`flash_attn_available`, else ``"sdpa"``; any other
        accepted name unchanged (``"ulysses_sdpa"`` is registered with transformers on the way).

    Raises:
        ValueError: unknown name, or ``flash_attention_2`` requested where it cannot run.
    """
    name = name or "auto"
    if name not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={name!r} is not one of {list(ATTN_IMPLEMENTATIONS)}")
    if name == "auto":
        return "flash_attention_2" if flash_attn_available() else "sdpa"
    if name == "flash_attention_2" and not flash_attn_available():
        raise ValueError(
            "attn_implementation='flash_attention_2' needs the flash-attn package (pip install rlflow[gpu]) "
            "and a CUDA device; use 'sdpa' or 'auto' instead"
        )
    if name == "ulysses_sdpa":
        import rlflow.models.attention  # noqa: F401  (registers the backend with transformers)
    return name


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bf16"`` / ``"bfloat16"`` / ``"fp16"`` / ``"float16"`` / ``"fp32"`` / ``"float32"`` or a dtype -> dtype."""
    return to_torch_dtype(dtype)


def load_tokenizer(
    path: str,
    trust_remote_code: bool = False,
    padding_side: str | None = None,
    chat_template: str | None = None,
) -> Any:
    """Load a tokenizer and make sure it has a pad token.

    A tokenizer without a pad token gets ``pad_token = eos_token`` (logged), as most RL code expects.

    Args:
        path: local directory, or ``"rlflow://tiny..."``.
        trust_remote_code: allow custom tokenizer code shipped with the checkpoint.
        padding_side: ``"left"`` / ``"right"`` to override the saved side; None keeps it.
        chat_template: a Jinja chat template replacing the tokenizer's own
            (``actor_rollout_ref.model.custom_chat_template``); None keeps it.

    Returns:
        A transformers tokenizer.
    """
    from transformers import AutoTokenizer

    local = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ValueError(f"cannot load a tokenizer from {path!r}: {type(exc).__name__}: {exc}") from exc
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer at {path!r} has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer at %s has no pad token; using eos %r as pad", path, tokenizer.eos_token)
    if padding_side is not None:
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side={padding_side!r} must be 'left' or 'right'")
        tokenizer.padding_side = padding_side
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _from_pretrained(auto_cls: Any, path: str, role: str, **kwargs: Any) -> tuple[Any, dict]:
    """Call ``auto_cls.from_pretrained`` with loading info; wrap failures in a ``ValueError`` naming the path."""
    local = resolve_model_path(path)
    try:
        return auto_cls.from_pretrained(local, output_loading_info=True, **kwargs)
    except Exception as exc:
        raise ValueError(f"cannot load the {role} model from {path!r}: {type(exc).__name__}: {exc}") from exc


def apply_config_overrides(config: Any, overrides: Mapping[str, Any], where: str = "override_config") -> Any:
    """Set ``overrides`` on an HF config (verl's ``model.override_config``): attributes are replaced, a
    mapping given for a sub-config (e.g. ``rope_scaling`` dicts stay dicts) is applied to it key by key.

    Args:
        config: a ``PretrainedConfig`` (changed in place and returned).
        overrides: attribute name -> value.
        where: the config key, for the log line.
    """
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(value, Mapping) and hasattr(current, "to_dict"):
            apply_config_overrides(current, value, f"{where}.{key}")
        else:
            setattr(config, key, value)
    if overrides:
        logger.info("model config: %s = %s applied", where, dict(overrides))
    return config


def load_model_config(
    path: str,
    trust_remote_code: bool = False,
    override_config: Mapping[str, Any] | None = None,
    role: str = "model",
) -> Any:
    """The HF config of ``path`` with ``override_config`` applied, or ``ValueError`` naming the path."""
    from transformers import AutoConfig

    local = resolve_model_path(path)
    try:
        config = AutoConfig.from_pretrained(local, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ValueError(f"cannot load the {role} config from {path!r}: {type(exc).__name__}: {exc}") from exc
    return apply_config_overrides(config, dict(override_config or {}))


def load_causal_lm(
    path: str,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "auto",
    trust_remote_code: bool = False,
    override_config: Mapping[str, Any] | None = None,
) -> Any:
    """Load a causal LM (actor or reference policy).

    Args:
        path: local HF directory, or ``"rlflow://tiny..."``.
        dtype: parameter dtype (see :func:`resolve_dtype`).
        attn_implementation: see :func:`resolve_attn_implementation`.
        trust_remote_code: allow custom modelling code shipped with the checkpoint.
        override_config: HF config attributes to replace (`apply_config_overrides`).

    Returns:
        The model on CPU (train mode is left to the caller).
    """
    from transformers import AutoModelForCausalLM

    model, info = _from_pretrained(
        AutoModelForCausalLM,
        path,
        "causal-LM",
        config=load_model_config(path, trust_remote_code, override_config, "causal-LM"),
        dtype=resolve_dtype(dtype),
        attn_implementation=resolve_attn_implementation(attn_implementation),
        trust_remote_code=trust_remote_code,
    )
    if info.get("missing_keys"):
        raise ValueError(f"causal-LM checkpoint {path!r} lacks weights {sorted(info['missing_keys'])}")
    return model


def _head(model: Any, path: str) -> torch.nn.Linear:
    """The classification head of a token/sequence-classification model (``score`` or ``classifier``)."""
    head = output_head(model)
    if isinstance(head, torch.nn.Linear):
        return head
    raise ValueError(
        f"model from {path!r} ({type(model).__name__}) has no linear 'score' or 'classifier' head"
    )


def _param_names(model: Any, module: torch.nn.Module) -> set[str]:
    """Names (in ``model``) of the parameters of ``module``."""
    ids = {id(p) for p in module.parameters()}
    return {name for name, param in model.named_parameters() if id(param) in ids}


def _init_head_(linear: torch.nn.Linear, std: float, seed: int) -> None:
    """Fill a freshly created head: weight ~ N(0, std^2) from a generator seeded with ``seed``, bias 0."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        weight = torch.randn(linear.weight.shape, generator=gen, dtype=torch.float32) * std
        linear.weight.copy_(weight.to(linear.weight.dtype))
        if linear.bias is not None:
            linear.bias.zero_()


def meta_model(
    kind: str, path: str, trust_remote_code: bool = False, override_config: Mapping[str, Any] | None = None
) -> torch.nn.Module:
    """The architecture of ``path`` on the ``meta`` device, no weights read: a causal LM (``kind`` =
    ``"causal_lm"``) or a one-label token-classification value model (``"value"``, dropout off, as
    :func:`load_value_model` builds it). The ranks that receive their shards build this; checks before Ray
    starts use it to see the module names."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    config = load_model_config(path, trust_remote_code, override_config)
    with torch.device("meta"):
        if kind == "value":
            config.num_labels = 1
            config.classifier_dropout = 0.0
            return AutoModelForTokenClassification.from_config(config, trust_remote_code=trust_remote_code)
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def load_value_model(
    path: str,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "auto",
    trust_remote_code: bool = False,
    seed: int = 0,
    head_init_std: float | None = None,
    override_config: Mapping[str, Any] | None = None,
) -> Any:
    """Load the PPO critic as a token-level value model: ``AutoModelForTokenClassification``, one label.

    ``model(input_ids, attention_mask, position_ids).logits`` has shape ``(bs, seq_len, 1)``: the value of
    each token. Classifier dropout is set to 0 so values are deterministic in train mode.

    From a causal-LM (actor / SFT) checkpoint, which has no value head, the backbone weights load and the
    head (``score``) is **freshly initialised**: weight ~ N(0, ``head_init_std``^2) drawn from a generator
    seeded with ``seed`` (same seed, same head), bias 0; a warning names the path. A checkpoint saved from a
    value model keeps its trained head.

    Args:
        path: local HF directory, or ``"rlflow://tiny..."``.
        dtype: parameter dtype (see :func:`resolve_dtype`).
        attn_implementation: see :func:`resolve_attn_implementation`.
        trust_remote_code: allow custom modelling code shipped with the checkpoint.
        seed: seed of the fresh head.
        head_init_std: std of the fresh head's weight; None uses the config's ``initializer_range``.
        override_config: HF config attributes to replace (`apply_config_overrides`).

    Returns:
        The value model on CPU.
    """
    from transformers import AutoModelForTokenClassification

    config = load_model_config(path, trust_remote_code, override_config, "value")
    config.num_labels, config.classifier_dropout = 1, 0.0  # one value per token, deterministic in train mode
    model, info = _from_pretrained(
        AutoModelForTokenClassification,
        path,
        "value",
        config=config,
        dtype=resolve_dtype(dtype),
        attn_implementation=resolve_attn_implementation(attn_implementation),
        trust_remote_code=trust_remote_code,
    )
    missing = set(info.get("missing_keys") or ())
    head = _head(model, path)
    head_keys = _param_names(model, head)
    if missing - head_keys:
        raise ValueError(
            f"value-model checkpoint {path!r} lacks backbone weights {sorted(missing - head_keys)}"
        )
    if missing:
        std = head_init_std if head_init_std is not None else getattr(config, "initializer_range", 0.02)
        _init_head_(head, std, seed)
        logger.warning(
            "value model from %s: the checkpoint has no value head; initialised a fresh one "
            "(N(0, %g^2), seed=%d, bias 0)",
            path,
            std,
            seed,
        )
    return model


def load_reward_model(
    path: str,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "auto",
    trust_remote_code: bool = False,
    allow_random_head: bool = False,
    seed: int = 0,
) -> Any:
    """Load a sequence-classification reward model (one label): one score per (prompt, response).

    A reward model whose checkpoint has no trained head would score at random, so that is an error unless
    ``allow_random_head`` (tests, building a reward model to train); the fresh head is then seeded like
    :func:`load_value_model`'s.

    Args:
        path: local HF directory, or ``"rlflow://tiny..."``.
        dtype: parameter dtype (see :func:`resolve_dtype`).
        attn_implementation: see :func:`resolve_attn_implementation`.
        trust_remote_code: allow custom modelling code shipped with the checkpoint.
        allow_random_head: accept a checkpoint without a classification head.
        seed: seed of a fresh head.

    Returns:
        The reward model on CPU, in eval mode.
    """
    from transformers import AutoModelForSequenceClassification

    config = load_model_config(path, trust_remote_code, role="reward")
    config.num_labels = 1
    model, info = _from_pretrained(
        AutoModelForSequenceClassification,
        path,
        "reward",
        config=config,
        dtype=resolve_dtype(dtype),
        attn_implementation=resolve_attn_implementation(attn_implementation),
        trust_remote_code=trust_remote_code,
    )
    missing = set(info.get("missing_keys") or ())
    head = _head(model, path)
    head_keys = _param_names(model, head)
    if missing and not (allow_random_head and missing <= head_keys):
        raise ValueError(
            f"reward-model checkpoint {path!r} lacks weights {sorted(missing)}; a reward model needs a "
            "trained sequence-classification head"
        )
    if missing:
        _init_head_(head, getattr(config, "initializer_range", 0.02), seed)
        logger.warning("reward model from %s: no classification head in the checkpoint; random head", path)
    return model.eval()
