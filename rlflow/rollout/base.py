"""What every rollout engine shares: its config, the per-call sampling parameters and the output format.

A rollout turns a batch of left-padded prompts into responses. Engines (`HFRollout` in ``hf.py``,
``VLLMRollout`` in ``vllm.py``) differ only in how they decode; they read the same
``actor_rollout_ref.rollout`` section (`rlflow.config.schema.RolloutSection`, validated with the rest of
the config), resolve the same per-call sampling parameters (`resolve_sampling_params`) and return the
same verl-format batch (`build_rollout_output`).

Output keys (``bs`` prompts, ``n`` samples each, rows interleaved: prompt 0 sample 0..n-1, prompt 1 ...):

* ``prompts``: ``(bs*n, prompt_len)`` the left-padded prompt ids.
* ``responses``: ``(bs*n, response_length)`` generated ids, right-padded with the pad id.
* ``input_ids``: ``(bs*n, prompt_len + response_length)`` = ``cat(prompts, responses)``.
* ``attention_mask``: prompt mask followed by ``response_mask``.
* ``position_ids``: prompt positions, then ``last prompt position + 1, + 2, ...``.
* ``response_mask``: ``(bs*n, response_length)`` 1 up to and including the first EOS, 0 after.
* ``rollout_log_probs`` (with ``calculate_log_probs``): ``(bs*n, response_length)``
  ``log_softmax(logits / temperature)`` at each sampled token, 0 where ``response_mask`` is 0.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlflow.protocol import DataProto
from rlflow.utils.torch_functional import get_response_mask

if TYPE_CHECKING:
    from rlflow.config.schema import RolloutSection

__all__ = [
    "ROLLOUT_KEY",
    "BaseRollout",
    "SamplingParams",
    "build_rollout_output",
    "logprob_temperature",
    "resolve_sampling_params",
    "warn_unread_engine_kwargs",
]

logger = logging.getLogger(__name__)

ROLLOUT_KEY = "actor_rollout_ref.rollout"
"""Config path of the rollout section (used in error messages)."""

_OVERRIDE_KEYS = ("temperature", "top_p", "top_k", "do_sample", "n", "response_length")
"""Sampling fields that ``meta_info`` may override for one call."""
_VAL_KEYS = ("temperature", "top_p", "top_k", "do_sample", "n")
"""Fields of ``val_kwargs``."""


def _check_number(key: str, value: Any, kind: type, minimum: float | None = None) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``value`` is a ``kind`` (bool excluded) >= ``minimum``."""
    ok_types = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok_types):
        raise ValueError(f"{key}={value!r} must be a {kind.__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key}={value!r} must be >= {minimum}")


def _check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} must be true or false")


def _check_sampling(prefix: str, values: Mapping[str, Any]) -> None:
    """Validate the sampling fields present in ``values`` (keys reported as ``prefix.name``)."""
    checks = {
        "temperature": lambda k, v: _check_number(k, v, float, 0.0),
        "top_k": lambda k, v: _check_number(k, v, int, -1),
        "n": lambda k, v: _check_number(k, v, int, 1),
        "response_length": lambda k, v: _check_number(k, v, int, 1),
        "do_sample": _check_bool,
    }
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else name
        if name == "top_p":
            _check_number(key, value, float)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{key}={value!r} must be in (0, 1]")
        elif name in checks:
            checks[name](key, value)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling for one ``generate_sequences`` call, after val_kwargs and ``meta_info`` overrides.

    Attributes:
        temperature: softmax temperature used to sample (and for ``rollout_log_probs``).
        top_p: nucleus mass (1.0 = off).
        top_k: top-k size (<= 0 = off).
        do_sample: False (or ``temperature == 0``) decodes greedily.
        n: samples per prompt.
        response_length: maximum generated tokens.
        ignore_eos: generate ``response_length`` tokens whatever is sampled (an EOS is a token like any
            other, inside the response mask).
        min_tokens: no EOS is sampled before this many tokens (its logits are masked for sampling; the
            log-probs stay those of the full distribution, the trainer's quantity).
    """

    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    n: int
    response_length: int
    ignore_eos: bool = False
    min_tokens: int = 0

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (``do_sample=False`` or ``temperature == 0``)."""
        return (not self.do_sample) or self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """Temperature that ``rollout_log_probs`` divide the logits by (`logprob_temperature`)."""
        return logprob_temperature(self.temperature)


def logprob_temperature(temperature: float) -> float:
    """The temperature log-probs are taken at: ``temperature``, or 1 for greedy decoding at ``T = 0``.

    The rollout's ``rollout_log_probs`` and the trainer's old / new log-probs both use it, so greedy
    training rollouts (``do_sample=false``, ``temperature=0``) are scored as ``log_softmax(logits)``.
    """
    return float(temperature) if temperature > 0 else 1.0


def resolve_sampling_params(config: RolloutSection, meta_info: Mapping[str, Any]) -> SamplingParams:
    """Sampling parameters of one call: config, then ``val_kwargs`` if validating, then ``meta_info``.

    Args:
        config: the ``actor_rollout_ref.rollout`` section.
        meta_info: the prompts' meta info; ``validate`` selects ``config.val_kwargs``; any of
            ``temperature``, ``top_p``, ``top_k``, ``do_sample``, ``n``, ``response_length`` overrides.

    Returns:
        The resolved `SamplingParams` (a bad override raises ``ValueError`` naming it).
    """
    values = {name: getattr(config, name) for name in _OVERRIDE_KEYS}
    if meta_info.get("validate", False):
        values.update({name: getattr(config.val_kwargs, name) for name in _VAL_KEYS})
    overrides = {name: meta_info[name] for name in _OVERRIDE_KEYS if name in meta_info}
    _check_sampling("meta_info", overrides)
    values.update(overrides)
    return SamplingParams(
        temperature=float(values["temperature"]),
        top_p=float(values["top_p"]),
        top_k=int(values["top_k"]),
        do_sample=bool(values["do_sample"]),
        n=int(values["n"]),
        response_length=int(values["response_length"]),
        ignore_eos=bool(config.ignore_eos),
        min_tokens=int(config.min_tokens),
    )


def normalize_token_ids(value: Any, key: str) -> list[int]:
    """``int`` / list of ints / None → list of ints (None → ``[]``); anything else raises ``ValueError``."""
    if value is None:
        return []
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    if not isinstance(ids, Sequence) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{key}={value!r} must be an int or a list of ints")
    return list(ids)


def build_rollout_output(
    prompts: DataProto,
    responses: torch.Tensor,
    eos_token_ids: Sequence[int],
    rollout_log_probs: torch.Tensor | None = None,
    rollout_entropy: torch.Tensor | None = None,
    routed_experts: torch.Tensor | None = None,
) -> DataProto:
    """Assemble the verl-format rollout output from (already ``n``-repeated) prompts and responses.

    Args:
        prompts: ``bs*n`` rows with ``input_ids``, ``attention_mask``, ``position_ids`` of shape
            ``(bs*n, prompt_len)``; its non-tensor batch and meta info are carried over.
        responses: ``(bs*n, response_length)`` generated ids, right-padded.
        eos_token_ids: ids that end a response (the first one is included in the mask).
        rollout_log_probs: optional ``(bs*n, response_length)`` log-probs; zeroed where the mask is 0.
        rollout_entropy: optional ``(bs*n, response_length)`` entropies of the sampling distributions
            (full, at the log-prob temperature); zeroed where the mask is 0.
        routed_experts: optional ``(bs*n, prompt_len + response_length, moe_layers, top_k)`` experts each
            token went through (`rlflow.models.router_replay`, -1 = not recorded); -1 wherever the attention
            mask is 0.

    Returns:
        DataProto with ``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``,
        ``response_mask`` and, when given, ``rollout_log_probs`` and ``rollout_entropy``.
    """
    batch = prompts.batch
    prompt_ids, prompt_mask, prompt_pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    if responses.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"{responses.shape[0]} responses for {prompt_ids.shape[0]} prompts")
    length = responses.shape[1]
    if eos_token_ids:
        response_mask = get_response_mask(responses, list(eos_token_ids), dtype=prompt_mask.dtype)
    else:
        response_mask = torch.ones_like(responses, dtype=prompt_mask.dtype)
    delta = torch.arange(1, length + 1, device=prompt_pos.device, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[..., -1:] + delta  # (bs*n, length); mrope-style (bs, k, len) also works
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=-1),
        "response_mask": response_mask,
    }
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = torch.where(response_mask.bool(), rollout_log_probs, 0.0)
    if rollout_entropy is not None:
        tensors["rollout_entropy"] = torch.where(response_mask.bool(), rollout_entropy, 0.0)
    if routed_experts is not None:
        expected = (*tensors["input_ids"].shape, *routed_experts.shape[2:])
        if tuple(routed_experts.shape) != expected:
            raise ValueError(f"routed_experts has shape {tuple(routed_experts.shape)}, expected {expected}")
        tensors["routed_experts"] = routed_experts.masked_fill(
            ~tensors["attention_mask"].bool()[..., None, None], -1
        )
    return DataProto.from_dict(
        tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=dict(prompts.meta_info)
    )


def warn_unread_engine_kwargs(config: Any, engine: str) -> None:
    """Warn about the ``rollout.engine_kwargs`` sections the ``engine`` (``"hf"``, ``"vllm"``) does not read:
    every section but its own (rlflow has no SGLang or TensorRT-LLM engine: ``sglang`` and ``trtllm`` are
    never read)."""
    sections = config.engine_kwargs
    names = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    for name, label in names.items():
        options = dict(getattr(sections, name))
        if options and name != engine:
            logger.warning(
                "actor_rollout_ref.rollout.engine_kwargs.%s.{%s}: %s options, not read by the %s engine",
                name,
                ",".join(sorted(options)),
                label,
                engine,
            )


class BaseRollout(ABC):
    """A rollout engine: ``generate_sequences(prompts) -> DataProto`` in the format of `build_rollout_output`.

    Attributes:
        last_weight_sync_s: seconds the last call spent bringing the actor's current weights into the
            engine (gathering the generation replica, loading vLLM's weights); None when it needs none
            (an unsharded module decodes with its own weights). Logged as ``timing_s/update_weights``.
    """

    last_weight_sync_s: float | None = None

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate responses for left-padded ``prompts`` (see the module docstring for the keys)."""
