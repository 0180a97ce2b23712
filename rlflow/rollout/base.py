"""What every rollout engine shares: its config, the per-call sampling parameters and the output format.

A rollout turns a batch of left-padded prompts into responses. Engines (`HFRollout` in ``hf.py``,
``VLLMRollout`` in ``vllm.py``) differ only in how they decode; they read the same
``actor_rollout_ref.rollout`` config (`RolloutConfig`), resolve the same per-call sampling
parameters (`resolve_sampling_params`) and return the same verl-format batch
(`build_rollout_output`).

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

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlflow.protocol import DataProto
from rlflow.utils.torch_functional import get_response_mask

__all__ = [
    "ROLLOUT_KEY",
    "BaseRollout",
    "RolloutConfig",
    "SamplingParams",
    "ValKwargs",
    "build_rollout_output",
    "logprob_temperature",
    "resolve_sampling_params",
]

ROLLOUT_KEY = "actor_rollout_ref.rollout"
"""Config path of the rollout section (used in error messages)."""

_OVERRIDE_KEYS = ("temperature", "top_p", "top_k", "do_sample", "n", "response_length")
"""Sampling fields that ``meta_info`` may override for one call."""


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


def _to_plain_dict(values: Any, key: str) -> dict[str, Any]:
    """A plain dict from a Mapping or an OmegaConf ``DictConfig`` (resolved)."""
    if values is None:
        return {}
    if hasattr(values, "_metadata") and hasattr(values, "items"):  # DictConfig without importing omegaconf
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(values, resolve=True)
    if not isinstance(values, Mapping):
        raise ValueError(f"{key} must be a mapping, got {type(values).__name__}")
    return dict(values)


def _from_mapping(cls: type, values: Any, key: str) -> Any:
    """Build dataclass ``cls`` from ``values``; an unknown key raises ``ValueError`` naming its path."""
    data = _to_plain_dict(values, key)
    names = {f.name for f in dataclasses.fields(cls)}
    for name in data:
        if name not in names:
            raise ValueError(f"unknown config key {key}.{name} (known keys: {sorted(names)})")
    return cls(**data)


@dataclass
class ValKwargs:
    """Sampling used when ``meta_info["validate"]`` is true (``actor_rollout_ref.rollout.val_kwargs``).

    Greedy decoding by default, so validation scores are deterministic.

    Attributes:
        temperature: softmax temperature (0 with ``do_sample=False`` is greedy).
        top_p: nucleus mass (1.0 = off).
        top_k: keep the k most likely tokens (-1 or 0 = off).
        do_sample: sample (True) or take the argmax (False).
        n: samples per prompt.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        _check_sampling(f"{ROLLOUT_KEY}.val_kwargs", dataclasses.asdict(self))


@dataclass
class RolloutConfig:
    """``actor_rollout_ref.rollout``: one typed owner for every rollout knob (verl names).

    Attributes:
        name: engine, ``"hf"`` (embedded default) or ``"vllm"`` (GPU extra).
        temperature: softmax temperature; 0 means greedy (as in vLLM).
        top_p: nucleus sampling mass, in (0, 1]; 1.0 = off (Holtzman et al. 2019, arXiv:1904.09751).
        top_k: keep the k most likely tokens; -1 (or 0) = off.
        do_sample: sample (True) or greedy argmax (False).
        n: samples per prompt (GRPO group size); rows are interleaved per prompt.
        response_length: maximum generated tokens per sample (the width of ``responses``).
        prompt_length: maximum prompt width; wider prompts raise ``ValueError``.
        micro_batch_size: rows (after the ``n`` repeat) decoded together; None = the whole batch.
        seed: base seed of the sampling noise (see ``hf.py`` for how rows get their own stream).
        calculate_log_probs: also return ``rollout_log_probs``.
        free_cache_engine: HF: drop the gathered generation replica after each call (True) or keep its
            memory for the next call (False; weights are re-copied every call either way).
            vLLM: sleep the engine after each call.
        dtype: dtype of the HF generation replica / vLLM engine (``"float32"``, ``"bfloat16"``, ...);
            None keeps the dtype of the actor's parameters.
        val_kwargs: sampling used for validation batches.
        tensor_model_parallel_size: vLLM only: tensor-parallel size of the engine.
        gpu_memory_utilization: vLLM only: fraction of GPU memory the engine may take.
        enforce_eager: vLLM only: disable CUDA graphs.
        max_num_batched_tokens: vLLM only: scheduler token budget per step.
        max_num_seqs: vLLM only: scheduler sequence budget per step.
        max_model_len: vLLM only: context length; None = ``prompt_length + response_length``.
        enable_chunked_prefill: vLLM only.
        log_prob_micro_batch_size: accepted for verl compatibility (read by the worker's
            ``compute_log_prob``, not by the rollout).
        log_prob_micro_batch_size_per_gpu: idem.
        log_prob_use_dynamic_bsz: idem.
        log_prob_max_token_len_per_gpu: idem.
    """

    name: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    n: int = 1
    response_length: int = 512
    prompt_length: int = 512
    micro_batch_size: int | None = None
    seed: int = 0
    calculate_log_probs: bool = False
    free_cache_engine: bool = True
    dtype: str | None = None
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384

    def __post_init__(self) -> None:
        if isinstance(self.val_kwargs, Mapping) or hasattr(self.val_kwargs, "_metadata"):
            self.val_kwargs = _from_mapping(ValKwargs, self.val_kwargs, f"{ROLLOUT_KEY}.val_kwargs")
        self.validate()

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | Any | None) -> RolloutConfig:
        """Build from a mapping (or OmegaConf node); an unknown key raises ``ValueError`` naming it.

        Args:
            values: the ``actor_rollout_ref.rollout`` section; missing keys keep their defaults.

        Returns:
            The validated config.
        """
        return _from_mapping(cls, values, ROLLOUT_KEY)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the key (``actor_rollout_ref.rollout.<key>``) of a bad value."""
        k = ROLLOUT_KEY
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"{k}.name={self.name!r} must be a non-empty string")
        _check_sampling(k, {f: getattr(self, f) for f in _OVERRIDE_KEYS})
        _check_number(f"{k}.prompt_length", self.prompt_length, int, 1)
        _check_number(f"{k}.seed", self.seed, int)
        if self.micro_batch_size is not None:
            _check_number(f"{k}.micro_batch_size", self.micro_batch_size, int, 1)
        for name in ("calculate_log_probs", "free_cache_engine", "enforce_eager", "enable_chunked_prefill"):
            _check_bool(f"{k}.{name}", getattr(self, name))
        _check_number(f"{k}.tensor_model_parallel_size", self.tensor_model_parallel_size, int, 1)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"{k}.gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]")
        if self.dtype is not None and not isinstance(self.dtype, str):
            raise ValueError(f"{k}.dtype={self.dtype!r} must be a dtype name such as 'bfloat16' or null")


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
    """

    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    n: int
    response_length: int

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


def resolve_sampling_params(config: RolloutConfig, meta_info: Mapping[str, Any]) -> SamplingParams:
    """Sampling parameters of one call: config, then ``val_kwargs`` if validating, then ``meta_info``.

    Args:
        config: the rollout config.
        meta_info: the prompts' meta info; ``validate`` selects ``config.val_kwargs``; any of
            ``temperature``, ``top_p``, ``top_k``, ``do_sample``, ``n``, ``response_length`` overrides.

    Returns:
        The resolved `SamplingParams` (validated; a bad override raises ``ValueError`` naming it).
    """
    values = {name: getattr(config, name) for name in _OVERRIDE_KEYS}
    if meta_info.get("validate", False):
        values.update(dataclasses.asdict(config.val_kwargs))
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
) -> DataProto:
    """Assemble the verl-format rollout output from (already ``n``-repeated) prompts and responses.

    Args:
        prompts: ``bs*n`` rows with ``input_ids``, ``attention_mask``, ``position_ids`` of shape
            ``(bs*n, prompt_len)``; its non-tensor batch and meta info are carried over.
        responses: ``(bs*n, response_length)`` generated ids, right-padded.
        eos_token_ids: ids that end a response (the first one is included in the mask).
        rollout_log_probs: optional ``(bs*n, response_length)`` log-probs; zeroed where the mask is 0.

    Returns:
        DataProto with ``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``,
        ``response_mask`` and, when given, ``rollout_log_probs``.
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
    return DataProto.from_dict(
        tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=dict(prompts.meta_info)
    )


class BaseRollout(ABC):
    """A rollout engine: ``generate_sequences(prompts) -> DataProto`` in the format of `build_rollout_output`."""

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate responses for left-padded ``prompts`` (see the module docstring for the keys)."""
