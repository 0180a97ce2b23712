"""`VLLMRollout`: the GPU rollout engine (``actor_rollout_ref.rollout.name=vllm``), an optional extra.

Importing this module never fails; constructing `VLLMRollout` without vLLM raises ``ImportError`` with
the install command (``pip install rlflow[vllm]``). Status: written against vLLM 0.33's offline ``LLM``
API; the mapping functions below are tested without vLLM, the engine itself only by
``scripts/gpu_check.py`` on a GPU machine (docs/gpu.md says what has run).

How it works, and the choices that keep it consistent with the trainer:

* **One in-process engine per actor rank.** Each Ray actor sees one GPU, so the engine runs with
  ``tensor_parallel_size=1`` (validation refuses more: rlflow's rollout is data-parallel over the actor's
  ranks) and with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the engine's model lives in this process and
  the weights can be loaded into it directly. ``load_format="dummy"``: the weights come from the actor.
* **Weights.** Before each call the engine wakes up (sleep mode when ``free_cache_engine``) and receives
  the actor's full parameters bucket by bucket (`rlflow.parallel.weight_buckets`: FSDP1 and FSDP2,
  wrapper prefixes stripped, at most ``update_weights_bucket_megabytes`` gathered by one collective over
  the actor's ranks, about two buckets in flight).
* **Stopping.** ``skip_tokenizer_init=True`` (token ids in, token ids out), so the trainer's EOS ids are
  passed as ``stop_token_ids`` of every request.
* **Log-probs** (``calculate_log_probs``): ``logprobs_mode="processed_logprobs"`` makes vLLM report the
  sampled token's log-prob under ``logits / temperature`` — the trainer's quantity — as long as top-k /
  top-p are off (validation refuses them together with ``calculate_log_probs`` on vLLM, where vLLM would
  report the truncated, renormalised distribution). Greedy decoding (``temperature = 0``) reports
  ``log_softmax(logits)``, the trainer's temperature-1 convention.
* **dtype.** ``rollout.dtype`` (or the actor's ``param_dtype``) is mapped to vLLM's dtype names.
* **Routing** (``enable_rollout_routing_replay``, a mixture-of-experts actor): the engine runs with
  ``enable_return_routed_experts`` and each completion's ``routed_experts`` (the experts of its prompt and
  generated tokens, in order) is laid out as the batch's ``routed_experts``
  (`rlflow.models.router_replay.place_prompt_routing`); a vLLM that returns none is an error.
* **Sampling.** The same config keys as the HF rollout (`to_vllm_sampling_kwargs`), one vLLM seed per
  row from the same global-row keys as ``hf.py``; the output has the HF rollout's format
  (`rlflow.rollout.base.build_rollout_output`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlflow.models.qat import qat_spec_of, qat_weight_names, quantize_weight_stream
from rlflow.models.router_replay import moe_routers, place_prompt_routing
from rlflow.parallel.distributed import get_rank
from rlflow.parallel.weight_buckets import MIB
from rlflow.protocol import DataProto
from rlflow.rollout.base import (
    BaseRollout,
    SamplingParams,
    build_rollout_output,
    normalize_token_ids,
    resolve_sampling_params,
    warn_unread_engine_kwargs,
)
from rlflow.rollout.sampling import row_keys
from rlflow.rollout.weights import full_weights
from rlflow.utils.dtypes import to_torch_dtype

try:
    import vllm

    _VLLM_IMPORT_ERROR: ImportError | None = None
except ImportError as _exc:  # the optional extra is missing
    vllm = None
    _VLLM_IMPORT_ERROR = _exc

__all__ = ["INSTALL_HINT", "VLLMRollout", "to_vllm_sampling_kwargs", "vllm_dtype", "vllm_engine_kwargs"]

INSTALL_HINT = "pip install rlflow[vllm]"
IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
_VLLM_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def vllm_dtype(name: str | None, compute_dtype: torch.dtype | None = None) -> str:
    """vLLM's name of the engine dtype: ``rollout.dtype`` if set, else the actor's compute dtype.

    Args:
        name: ``actor_rollout_ref.rollout.dtype`` (rlflow's names: fp32, bf16, float16, ...), or None.
        compute_dtype: the actor's FSDP ``param_dtype``; None with ``name`` None gives ``"auto"``.
    """
    if name is not None:
        return _VLLM_DTYPE_NAMES[to_torch_dtype(name, "actor_rollout_ref.rollout.dtype")]
    return "auto" if compute_dtype is None else _VLLM_DTYPE_NAMES[compute_dtype]


def vllm_engine_kwargs(
    config: Any, model_path: str, compute_dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` from the ``actor_rollout_ref.rollout`` section.

    Args:
        config: the rollout section.
        model_path: the HF model directory (architecture and config; the weights come from the actor).
        compute_dtype: the actor's compute dtype (used when ``config.dtype`` is null).

    Returns:
        A dict for ``vllm.LLM(**kwargs)``: rlflow's keys, then ``config.engine_kwargs.vllm``.
    """
    return {
        "model": model_path,
        "tensor_parallel_size": config.tensor_model_parallel_size,
        "dtype": vllm_dtype(config.dtype, compute_dtype),
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "enforce_eager": config.enforce_eager,
        "max_model_len": config.max_model_len or config.prompt_length + config.response_length,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_prefix_caching": config.enable_prefix_caching,
        "enable_sleep_mode": config.free_cache_engine,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "logprobs_mode": "processed_logprobs",
        "seed": config.seed,
        **({"enable_return_routed_experts": True} if config.enable_rollout_routing_replay else {}),
        **dict(config.engine_kwargs.vllm),  # validated: none of the keys above (rlflow.config.rollout_checks)
    }


def to_vllm_sampling_kwargs(
    params: SamplingParams, seed: int, calculate_log_probs: bool, stop_token_ids: Sequence[int] = ()
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one row (one sample: ``n`` is done by repeating rows).

    Args:
        params: resolved sampling parameters of the call.
        seed: the row's seed.
        calculate_log_probs: ask for the sampled token's log-prob (``logprobs=0``).
        stop_token_ids: the trainer's EOS ids (the engine has no tokenizer to know them).

    Returns:
        A dict for ``vllm.SamplingParams(**kwargs)``.
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": params.response_length,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "seed": seed,
        "detokenize": False,
        "stop_token_ids": [] if params.ignore_eos else list(stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "min_tokens": params.min_tokens,
    }
    if calculate_log_probs:
        kwargs["logprobs"] = 0
    return kwargs


class VLLMRollout(BaseRollout):
    """Generation with a colocated, in-process vLLM engine (see the module docstring).

    Args:
        module: the actor (plain, FSDP1 or FSDP2) whose weights the engine serves.
        config: the ``actor_rollout_ref.rollout`` section.
        tokenizer: supplies ``eos_token_id`` / ``pad_token_id`` when ``meta_info`` does not.
        model_path: the HF model directory (architecture and config for the engine).
        dp_rank: data-parallel rank (the first global row of this rank's samples); None = process rank.
        compute_dtype: the actor's compute dtype, the engine's dtype when ``rollout.dtype`` is null.

    Raises:
        ImportError: when vLLM is not installed (the message gives the install command).
    """

    def __init__(
        self,
        module: nn.Module,
        config: Any,
        tokenizer: Any = None,
        *,
        model_path: str | None = None,
        dp_rank: int | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        if vllm is None:
            raise ImportError(
                f"actor_rollout_ref.rollout.name=vllm needs vLLM (a GPU-only extra): {INSTALL_HINT}. "
                "Use actor_rollout_ref.rollout.name=hf to generate without it."
            ) from _VLLM_IMPORT_ERROR
        if model_path is None:
            raise ValueError("VLLMRollout needs model_path (actor_rollout_ref.model.path)")
        self.module = module
        self.config = config
        self.tokenizer = tokenizer
        self.dp_rank = get_rank() if dp_rank is None else dp_rank
        os.environ[IN_PROCESS_ENV] = "0"  # the engine's model in this process: weights load directly
        warn_unread_engine_kwargs(config, "vllm")
        routers = moe_routers(module) if config.enable_rollout_routing_replay else []
        self._routing = (len(routers), int(routers[0].top_k)) if routers else None
        if config.enable_rollout_routing_replay and self._routing is None:
            raise ValueError(
                "actor_rollout_ref.rollout.enable_rollout_routing_replay needs a mixture-of-experts actor"
            )
        self.engine = vllm.LLM(**vllm_engine_kwargs(config, model_path, compute_dtype))
        self._num_calls = 0
        if config.free_cache_engine:
            self.engine.sleep(level=1)

    def sync_weights(self) -> None:
        """Push the actor's full weights into the engine (collective over the actor): gathered in buckets
        of ``update_weights_bucket_megabytes``, one collective each, handed to ``load_weights`` in order."""
        weights = full_weights(self.module, int(self.config.update_weights_bucket_megabytes) * MIB)
        qat = qat_spec_of(self.module)
        if qat is not None:  # an actor trained with QAT: the engine decodes with the quantized weights
            weights = quantize_weight_stream(weights, qat_weight_names(self.module, qat), qat)
        if hasattr(self.engine, "apply_model"):
            self.engine.apply_model(lambda model: model.load_weights(weights=weights))
            return
        try:
            model = self.engine.llm_engine.model_executor.driver_worker.worker.model_runner.model
        except AttributeError as exc:
            raise RuntimeError(
                f"VLLMRollout.sync_weights: cannot reach the engine's model in this process ({IN_PROCESS_ENV} "
                "must be 0 when the engine is created)"
            ) from exc
        model.load_weights(weights=weights)

    def _token_ids(self, meta_info: Mapping[str, Any]) -> tuple[list[int], int]:
        eos = meta_info.get("eos_token_id", getattr(self.tokenizer, "eos_token_id", None))
        eos_ids = normalize_token_ids(eos, "eos_token_id")
        if not eos_ids:
            raise ValueError(
                "VLLMRollout: no eos_token_id: set prompts.meta_info['eos_token_id'] or pass a tokenizer"
            )
        pad = meta_info.get("pad_token_id", getattr(self.tokenizer, "pad_token_id", None))
        return eos_ids, eos_ids[0] if pad is None else int(pad)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt; same inputs and output format as ``HFRollout``."""
        params = resolve_sampling_params(self.config, prompts.meta_info)
        eos, pad = self._token_ids(prompts.meta_info)
        batch = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        step = prompts.meta_info.get("global_steps", self._num_calls)
        keys = row_keys(
            self.config.seed,
            2 * int(step) + int(bool(prompts.meta_info.get("validate"))),
            int(prompts.meta_info.get("row_offset", 0)) + self.dp_rank * len(batch),
            len(batch),
        )
        self._num_calls += 1
        ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
        requests = [{"prompt_token_ids": row[m.bool()].tolist()} for row, m in zip(ids, mask)]
        logprobs = self.config.calculate_log_probs
        sampling = [
            vllm.SamplingParams(**to_vllm_sampling_kwargs(params, int(k), logprobs, eos)) for k in keys
        ]
        start = time.perf_counter()
        if self.config.free_cache_engine:
            self.engine.wake_up()
        self.sync_weights()
        self.last_weight_sync_s = time.perf_counter() - start
        outputs = self.engine.generate(requests, sampling_params=sampling, use_tqdm=False)
        if self.config.free_cache_engine:
            self.engine.sleep(level=1)
        responses = torch.full((len(batch), params.response_length), pad, dtype=torch.int64)
        log_probs = torch.zeros((len(batch), params.response_length), dtype=torch.float32)
        for i, out in enumerate(outputs):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)[: params.response_length]
            responses[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            if logprobs and completion.logprobs:
                values = [lp[tok].logprob for lp, tok in zip(completion.logprobs, tokens)]
                log_probs[i, : len(values)] = torch.tensor(values)
        responses, log_probs = responses.to(ids.device), log_probs.to(ids.device)
        record = self._routing is not None and not prompts.meta_info.get(
            "validate", False
        )  # R3: for the update
        routed = self._routed_experts(outputs, mask, params.response_length) if record else None
        return build_rollout_output(
            batch,
            responses,
            [] if params.ignore_eos else eos,
            log_probs if logprobs else None,
            routed_experts=None if routed is None else routed.to(ids.device),
        )

    def _routed_experts(
        self, outputs: Sequence[Any], mask: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        """The completions' ``routed_experts`` in the batch's layout (``enable_rollout_routing_replay``)."""
        per_row = [getattr(out.outputs[0], "routed_experts", None) for out in outputs]
        if any(r is None for r in per_row):
            raise RuntimeError(
                "actor_rollout_ref.rollout.enable_rollout_routing_replay: this vLLM returned no routed_experts "
                "(it needs vLLM's enable_return_routed_experts, vLLM >= 0.22); use rollout.name=hf or "
                "router_replay.mode=R2"
            )
        layers, top_k = self._routing
        lengths = [int(m.sum()) for m in mask]
        return place_prompt_routing(per_row, lengths, mask.shape[1], response_length, layers, top_k)
