"""`VLLMRollout`: the GPU rollout engine (``actor_rollout_ref.rollout.name=vllm``), an optional extra.

Importing this module never fails; constructing `VLLMRollout` without vLLM raises ``ImportError`` with
the install command (``pip install rlflow[vllm]``).

**Status: unverified.** Written against vLLM's offline ``LLM`` API but never run (no GPU and no vLLM on
the machines this was written on). The parts that need a GPU are marked in ``docs/rollout.md``. What it
does when vLLM is present:

* builds one engine per rank (colocated with the actor, ``load_format="dummy"``, sleep mode on when
  ``free_cache_engine``), and on every call wakes it, pushes the actor's weights tensor by tensor
  (FSDP2 ``DTensor.full_tensor()``, one full tensor in flight), generates, and puts it back to sleep;
* maps the same config keys as the HF rollout (`to_vllm_sampling_kwargs`), with one vLLM seed per row
  derived from the same row keys as ``hf.py``;
* returns the same DataProto as the HF rollout (`rlflow.rollout.base.build_rollout_output`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlflow.parallel.distributed import get_rank
from rlflow.protocol import DataProto
from rlflow.rollout.base import (
    BaseRollout,
    SamplingParams,
    build_rollout_output,
    normalize_token_ids,
    resolve_sampling_params,
)
from rlflow.rollout.sampling import row_keys

try:
    import vllm

    _VLLM_IMPORT_ERROR: ImportError | None = None
except ImportError as _exc:  # the optional extra is missing
    vllm = None
    _VLLM_IMPORT_ERROR = _exc

__all__ = ["INSTALL_HINT", "VLLMRollout", "to_vllm_sampling_kwargs", "vllm_engine_kwargs"]

INSTALL_HINT = "pip install rlflow[vllm]"


def to_vllm_sampling_kwargs(params: SamplingParams, seed: int, calculate_log_probs: bool) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one row (one sample: ``n`` is done by repeating rows).

    Args:
        params: resolved sampling parameters of the call.
        seed: the row's seed.
        calculate_log_probs: ask for the sampled token's log-prob (``logprobs=0``).

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
    }
    if calculate_log_probs:
        kwargs["logprobs"] = 0
    return kwargs


def vllm_engine_kwargs(config: Any, model_path: str) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` from the ``actor_rollout_ref.rollout`` section.

    Args:
        config: the rollout section.
        model_path: the HF model directory (architecture and config; the weights come from the actor).

    Returns:
        A dict for ``vllm.LLM(**kwargs)``.
    """
    return {
        "model": model_path,
        "tensor_parallel_size": config.tensor_model_parallel_size,
        "dtype": config.dtype or "auto",
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "enforce_eager": config.enforce_eager,
        "max_model_len": config.max_model_len or config.prompt_length + config.response_length,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_sleep_mode": config.free_cache_engine,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "seed": config.seed,
    }


def _full_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` one parameter at a time (an all-gather per DTensor: collective)."""
    for name, param in module.named_parameters():
        yield name, param.full_tensor() if isinstance(param, DTensor) else param.detach()


class VLLMRollout(BaseRollout):
    """Generation with a colocated vLLM engine (unverified; see the module docstring).

    Args:
        module: the actor (plain or FSDP2) whose weights the engine serves.
        config: the ``actor_rollout_ref.rollout`` section.
        tokenizer: supplies ``eos_token_id`` / ``pad_token_id`` when ``meta_info`` does not.
        model_path: the HF model directory (architecture and config for the engine).
        dp_rank: data-parallel rank mixed into the row seeds; None = the process-group rank.

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
    ) -> None:
        if vllm is None:
            raise ImportError(
                f"actor_rollout_ref.rollout.name=vllm needs vLLM (a GPU-only extra): {INSTALL_HINT}. "
                "Use actor_rollout_ref.rollout.name=hf to generate without it."
            ) from _VLLM_IMPORT_ERROR
        self.module = module
        self.config = config
        self.tokenizer = tokenizer
        self.dp_rank = get_rank() if dp_rank is None else dp_rank
        if model_path is None:
            raise ValueError("VLLMRollout needs model_path (actor_rollout_ref.model.path)")
        cfg = self.config
        self.engine = vllm.LLM(**vllm_engine_kwargs(cfg, model_path))
        self._num_calls = 0
        if cfg.free_cache_engine:
            self.engine.sleep(level=1)

    def sync_weights(self) -> None:
        """Push the actor's weights into the engine, one full tensor at a time (collective for FSDP2)."""
        try:
            runner = self.engine.llm_engine.model_executor.driver_worker.worker.model_runner
        except AttributeError as exc:
            raise RuntimeError(
                "VLLMRollout.sync_weights: cannot reach the engine's model in this process; "
                "set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating the engine"
            ) from exc
        for item in _full_tensors(self.module):
            runner.model.load_weights(weights=iter([item]))

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
            self.dp_rank * len(batch),
            len(batch),
        )
        self._num_calls += 1
        ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
        requests = [{"prompt_token_ids": row[m.bool()].tolist()} for row, m in zip(ids, mask)]
        sampling = [
            vllm.SamplingParams(**to_vllm_sampling_kwargs(params, int(k), self.config.calculate_log_probs))
            for k in keys
        ]
        if self.config.free_cache_engine:
            self.engine.wake_up()
        self.sync_weights()
        outputs = self.engine.generate(requests, sampling_params=sampling, use_tqdm=False)
        if self.config.free_cache_engine:
            self.engine.sleep(level=1)
        responses = torch.full((len(batch), params.response_length), pad, dtype=torch.int64)
        log_probs = torch.zeros((len(batch), params.response_length), dtype=torch.float32)
        for i, out in enumerate(outputs):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)[: params.response_length]
            responses[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            if self.config.calculate_log_probs and completion.logprobs:
                values = [lp[tok].logprob for lp, tok in zip(completion.logprobs, tokens)]
                log_probs[i, : len(values)] = torch.tensor(values)
        responses, log_probs = responses.to(ids.device), log_probs.to(ids.device)
        return build_rollout_output(
            batch, responses, eos, log_probs if self.config.calculate_log_probs else None
        )
