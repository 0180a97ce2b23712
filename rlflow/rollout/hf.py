"""`HFRollout`: the embedded rollout engine (``actor_rollout_ref.rollout.name=hf``, the default).

How one ``generate_sequences`` call runs:

1. **Weights.** A plain module generates directly. An FSDP2 (``fully_shard``) or FSDP1 module is
   never run during decoding: its full weights are gathered once into an unsharded *generation
   replica* (the same HF class built from the same config on ``meta``, then materialised): FSDP2
   parameters are all-gathered in buckets of ``update_weights_bucket_megabytes``, one collective per
   bucket (`rlflow.parallel.weight_buckets`); FSDP1 ones inside ``FSDP.summon_full_params``. Decoding then
   runs on the replica with no collectives, so ranks with different prompts, micro-batch counts and
   stopping times never wait for each other. ``free_cache_engine`` drops the replica after the call
   (True) or keeps its memory for the next one (False). With FP8 on either side (``quantization=fp8``,
   or an actor whose layers compute in FP8, `rlflow.models.fp8`) a plain module decodes through a replica
   too, so the rollout's numerics are ``quantization``'s: with ``fp8`` the replica's decoder linear
   layers hold their weights' FP8 values (128 x 128 blocks, quantized once per weight sync) and quantize
   each token's activations in 1 x 128 blocks, verl's FP8 rollout, emulated in FP32. An actor trained
   with QAT (`rlflow.models.qat`) decodes with its quantized weights (replaced at each weight sync).
2. **Decoding** (`rlflow.rollout.decoding.decode`). Our own loop over a KV cache: one prefill forward over the (left-padded,
   common-padding-trimmed) prompts, then one forward per new token. Finished rows emit the pad id.
   The ``n`` samples of a prompt share its prefill (one forward per prompt, then its KV cache is
   repeated) whenever a micro-batch holds whole groups of ``n``. On the CPU, for Qwen2 / Llama / Mistral /
   Qwen3 decoders, the steps after the prefill run through `rlflow.rollout.fast_decode.FastDecoder`
   (fused projections, no per-step mask building), with transformers' numerics.
   ``scripts/bench/bench_generate.py`` compares it with ``model.generate``; numbers in
   ``docs/rollout.md``.
3. **Sampling** (`rlflow.rollout.sampling`): temperature, top-k, top-p, then inverse-CDF sampling with
   counter-based uniforms keyed by ``(seed, step id, row index in the whole batch, token position)``.
   The step id is ``meta_info["global_steps"]`` when present (exact on resume), else a per-engine call
   counter.
4. **Log-probs** (``calculate_log_probs``): ``log_softmax(logits / temperature)`` at the sampled token,
   taken *before* top-k / top-p, i.e. the same quantity the trainer's ``compute_log_prob`` computes
   from ``logits / temperature``. Greedy decoding with ``temperature == 0`` uses temperature 1.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import DTensor

from rlflow.models.attention import GENERATION_ATTENTION
from rlflow.models.cpu_linear import install_onednn_linear, uses_onednn_linear
from rlflow.models.fp8 import Fp8Recipe, install_fp8, quantize_fp8_weights_
from rlflow.models.lora import LoRALinear, merge_lora_weights
from rlflow.models.qat import qat_quantize_weights_, qat_spec_of
from rlflow.models.router_replay import RouterReplay
from rlflow.parallel.distributed import get_rank
from rlflow.parallel.weight_buckets import MIB
from rlflow.protocol import DataProto
from rlflow.rollout.base import (
    ROLLOUT_KEY,
    BaseRollout,
    build_rollout_output,
    normalize_token_ids,
    resolve_sampling_params,
    warn_unread_engine_kwargs,
)
from rlflow.rollout.decoding import DecodeRouting, decode
from rlflow.rollout.fast_decode import fast_decoder_for
from rlflow.rollout.sampling import row_keys
from rlflow.rollout.weights import full_weights
from rlflow.utils.dtypes import to_torch_dtype

if TYPE_CHECKING:
    from rlflow.config.schema import RolloutSection

__all__ = ["HFRollout", "build_generation_replica", "sync_replica_weights"]

_ATTN_FOR_REPLICA = ("eager", "flash_attention_2", "flash_attention_3")


def _pad_right(x: torch.Tensor, length: int, value: float) -> torch.Tensor:
    return F.pad(x, (0, length - x.shape[-1]), value=value)


# ------------------------------------------------------------------------------------- generation replica


def _is_sharded(module: nn.Module) -> bool:
    """True for an FSDP1 wrapper or a module holding DTensor (FSDP2) parameters."""
    return isinstance(module, FSDP) or any(isinstance(p, DTensor) for p in module.parameters())


def _plain_class(module: nn.Module) -> type:
    """The user class of ``module``: unwraps FSDP1 and drops FSDP2's dynamic ``FSDP<Class>`` subclass."""
    module = module.module if isinstance(module, FSDP) else module
    cls = type(module)
    while issubclass(cls, FSDPModule):
        cls = next(base for base in cls.__bases__ if not issubclass(base, FSDPModule))
    return cls


def _get_attr_path(root: nn.Module, name: str) -> torch.Tensor:
    obj: Any = root
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def build_generation_replica(
    module: nn.Module, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> nn.Module:
    """An unsharded, uninitialised copy of a sharded HF model's architecture, for generation.

    Built on ``meta`` from ``module.config`` and materialised with ``to_empty`` (no init cost); tied
    weights are re-tied. Its linear layers compute with the training module's CPU kernel (oneDNN where
    `rlflow.models.cpu_linear.install_onednn_linear` routed ``module``'s). Fill it with
    `sync_replica_weights`.

    Args:
        module: FSDP1 wrapper or FSDP2 module around an HF ``PreTrainedModel``.
        dtype: parameter dtype; None = the dtype of ``module``'s parameters.
        device: target device; None = the current CUDA device when available, else CPU.

    Returns:
        The replica in eval mode.
    """
    inner = module.module if isinstance(module, FSDP) else module
    config = getattr(inner, "config", None)
    cls = _plain_class(module)
    if config is None or not hasattr(cls, "_from_config"):
        raise TypeError(f"{cls.__name__} is not an HF PreTrainedModel: cannot build a generation replica")
    if dtype is None:
        dtype = next(inner.parameters()).dtype
    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    attn = getattr(config, "_attn_implementation", None)
    # eager and flash-attn stay; SDPA and the packed training kernel (not for decoding) become SDPA
    # without per-step copies of the KV cache
    attn = attn if attn in _ATTN_FOR_REPLICA else GENERATION_ATTENTION
    # transformers writes the attention implementation into the config it is given: build from a copy, so
    # the training module keeps its own (a Ulysses actor must stay on "rlflow_packed").
    config = copy.deepcopy(config)
    with torch.device("meta"):
        replica = cls._from_config(config, attn_implementation=attn)
    replica.to(dtype=dtype)
    replica.to_empty(device=device)
    replica.tie_weights()
    if uses_onednn_linear(inner):
        install_onednn_linear(replica)  # the prefill's products: oneDNN's kernel, as in training
    return replica.eval()


def sync_replica_weights(module: nn.Module, replica: nn.Module, bucket_bytes: int = 512 * MIB) -> None:
    """Copy the full weights of a sharded ``module`` into ``replica`` (collective).

    FSDP2: the parameters are all-gathered bucket by bucket, one collective per bucket of at most
    ``bucket_bytes`` (`rlflow.parallel.weight_buckets`), and copied. FSDP1: inside
    ``summon_full_params(writeback=False)``. Buffers (e.g. rotary ``inv_freq``) are copied from the
    module. Every rank must call this in the same order.

    Args:
        module: FSDP1 wrapper or FSDP2 module.
        replica: from `build_generation_replica` for the same model.
        bucket_bytes: the most bytes of full tensors per gather
            (``rollout.update_weights_bucket_megabytes``).

    Raises:
        ValueError: a replica tensor the module does not have, or has with another shape.
    """
    if isinstance(module, FSDP):
        with torch.no_grad(), FSDP.summon_full_params(module, writeback=False):
            for name, target in itertools.chain(replica.named_parameters(), replica.named_buffers()):
                _copy_into(name, target, _merged_module_tensor(module, name))
        return
    targets = dict(replica.named_parameters())
    with torch.no_grad():
        for name, full in full_weights(module, bucket_bytes):
            target = targets.pop(name, None)
            if target is None:
                raise ValueError(f"generation replica: it has no parameter {name!r} of the sharded model")
            _copy_into(name, target, full)
            del full
        if targets:
            raise ValueError(f"generation replica: the sharded model has no tensor {sorted(targets)[0]!r}")
        for name, target in replica.named_buffers():
            source = _module_tensor(module, name)
            _copy_into(name, target, source.full_tensor() if isinstance(source, DTensor) else source)


def _module_tensor(module: nn.Module, name: str) -> torch.Tensor:
    try:
        return _get_attr_path(module, name)
    except AttributeError as exc:
        raise ValueError(f"generation replica: the sharded model has no tensor {name!r}") from exc


def _merged_module_tensor(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s tensor ``name`` (inside FSDP1's ``summon_full_params``), the weight of a `LoRALinear`
    merged with its adapters."""
    tensor = _module_tensor(module, name)
    prefix, _, leaf = name.rpartition(".")
    owner = _get_attr_path(module, prefix) if prefix and leaf == "weight" else None
    if not isinstance(owner, LoRALinear):
        return tensor
    return merge_lora_weights(tensor, owner.lora_A, owner.lora_B, float(owner.lora_scaling))


def _copy_into(name: str, target: torch.Tensor, source: torch.Tensor) -> None:
    if tuple(source.shape) != tuple(target.shape):
        raise ValueError(
            f"generation replica: {name!r} has shape {tuple(source.shape)} in the sharded model but "
            f"{tuple(target.shape)} in the replica"
        )
    target.copy_(source)


@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


# ------------------------------------------------------------------------------------- the engine


class HFRollout(BaseRollout):
    """Generation with HF transformers models (plain, FSDP1 or FSDP2), see the module docstring.

    Args:
        module: the actor model: a plain HF causal LM, an FSDP2 ``fully_shard``-ed one, or an FSDP1
            wrapper around one.
        config: the ``actor_rollout_ref.rollout`` section.
        tokenizer: supplies ``eos_token_id`` / ``pad_token_id`` when ``meta_info`` does not.
        dp_rank: data-parallel rank; with equal chunks per rank it gives this rank's first row in the
            whole batch (see `row_keys`). None = the process-group rank.
        compute_dtype: dtype of the generation replica when ``config.dtype`` is null: the dtype the
            actor computes in (its FSDP ``param_dtype``), so generation and training see the same
            numerics; None = the dtype of the module's parameters.
    """

    def __init__(
        self,
        module: nn.Module,
        config: RolloutSection,
        tokenizer: Any = None,
        *,
        dp_rank: int | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.module = module
        self.config = config
        self.compute_dtype = compute_dtype
        self.tokenizer = tokenizer
        self.dp_rank = get_rank() if dp_rank is None else dp_rank
        self.sharded = _is_sharded(module)
        self.fp8 = Fp8Recipe("e4m3", "blockwise") if config.quantization == "fp8" else None
        self.qat = qat_spec_of(module)
        trains_in_fp8 = any(hasattr(m, "fp8_recipe") for m in module.modules())
        self.uses_replica = self.sharded or self.fp8 is not None or trains_in_fp8 or self.qat is not None
        self.replica: nn.Module | None = None
        self._num_calls = 0
        warn_unread_engine_kwargs(config, "hf")

    # ---- special tokens -----------------------------------------------------------------------------

    def _token_ids(self, meta_info: Mapping[str, Any]) -> tuple[list[int], int]:
        """EOS ids and pad id: ``meta_info``, then the tokenizer, then the model's generation config."""
        gen_config = getattr(self.module, "generation_config", None)
        sources = [meta_info, self.tokenizer, gen_config]

        def first(name: str) -> Any:
            for src in sources:
                value = src.get(name) if isinstance(src, Mapping) else getattr(src, name, None)
                if value is not None:
                    return value
            return None

        eos = normalize_token_ids(first("eos_token_id"), "eos_token_id")
        if not eos:
            raise ValueError(
                "HFRollout: no eos_token_id: set prompts.meta_info['eos_token_id'] or pass a tokenizer"
            )
        pad = first("pad_token_id")
        pad = eos[0] if pad is None else pad
        if isinstance(pad, bool) or not isinstance(pad, int):
            raise ValueError(f"pad_token_id={pad!r} must be an int")
        return eos, pad

    # ---- weights ------------------------------------------------------------------------------------

    def _replica_dtype(self) -> torch.dtype | None:
        if self.config.dtype is None:
            return self.compute_dtype
        return to_torch_dtype(self.config.dtype, f"{ROLLOUT_KEY}.dtype")

    @contextlib.contextmanager
    def generation_model(self) -> Iterator[nn.Module]:
        """The module to decode with: the plain module (in eval mode) or a freshly synced replica.

        Collective for sharded modules (all ranks enter together); the decoding inside is not.
        """
        if not self.uses_replica:
            with _eval_mode(self.module) as model:
                yield model
            return
        start = time.perf_counter()
        if self.replica is None:
            self.replica = build_generation_replica(self.module, self._replica_dtype())
            if self.fp8 is not None:
                install_fp8(self.replica, self.fp8)
        sync_replica_weights(self.module, self.replica, self.config.update_weights_bucket_megabytes * MIB)
        if self.qat is not None:  # the weights a deployment of the QAT checkpoint holds
            qat_quantize_weights_(self.replica, self.qat)
        if self.fp8 is not None:
            quantize_fp8_weights_(self.replica)
        self.last_weight_sync_s = time.perf_counter() - start
        try:
            yield self.replica
        finally:
            if self.config.free_cache_engine:
                self.replica = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    # ---- generation ---------------------------------------------------------------------------------

    def _check_prompts(self, prompts: DataProto) -> None:
        if prompts.batch is None:
            raise ValueError("HFRollout.generate_sequences: prompts has no tensor batch")
        for key in ("input_ids", "attention_mask", "position_ids"):
            if key not in prompts.batch.keys():
                raise ValueError(f"HFRollout.generate_sequences: prompts.batch lacks {key!r}")
        width = prompts.batch["input_ids"].shape[-1]
        if len(prompts) == 0:
            raise ValueError("HFRollout.generate_sequences: prompts is empty")
        if width > self.config.prompt_length:
            raise ValueError(
                f"prompts are {width} tokens wide but {ROLLOUT_KEY}.prompt_length={self.config.prompt_length}"
            )

    def _step_id(self, meta_info: Mapping[str, Any]) -> int:
        step = meta_info.get("global_steps")
        step = self._num_calls if step is None else int(step)
        return 2 * step + int(bool(meta_info.get("validate", False)))

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt.

        Args:
            prompts: ``input_ids`` / ``attention_mask`` / ``position_ids`` of shape ``(bs, prompt_len)``,
                left-padded; ``meta_info`` may set ``eos_token_id``, ``pad_token_id``, ``validate``,
                ``global_steps``, ``row_offset`` (the call's first row in the step's rows: later rounds of
                dynamic sampling continue the numbering, so they draw fresh noise) and per-call
                ``temperature``, ``top_p``, ``top_k``, ``do_sample``, ``n``, ``response_length``, and
                ``calculate_log_probs`` / ``calculate_entropy`` (the trainer asks for both when the rollout's
                log-probs stand for the old policy's: `rlflow.config.resolve_bypass_mode`).

        Returns:
            DataProto of ``bs * n`` rows (see `build_rollout_output` for the keys).
        """
        self._check_prompts(prompts)
        meta = prompts.meta_info
        want_log_probs = bool(self.config.calculate_log_probs or meta.get("calculate_log_probs", False))
        want_entropy = bool(meta.get("calculate_entropy", False))
        params = resolve_sampling_params(self.config, prompts.meta_info)
        eos, pad = self._token_ids(prompts.meta_info)
        batch = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        rows = len(batch)
        # Every rank gets an equal chunk (the dispatcher pads): rank r holds global rows [r*rows, (r+1)*rows).
        first = int(prompts.meta_info.get("row_offset", 0)) + self.dp_rank * rows
        keys = row_keys(self.config.seed, self._step_id(prompts.meta_info), first, rows)
        self._num_calls += 1
        step = self.config.micro_batch_size or max(rows, 1)
        # the n samples of a prompt share one prefill when a micro-batch holds whole groups of them
        repeats = params.n if params.n > 1 and step % params.n == 0 else 1
        source = prompts if repeats > 1 else batch
        responses, log_probs, entropies, routed = [], [], [], []
        with self.generation_model() as model:
            device = next(model.parameters()).device
            fast = fast_decoder_for(model) or False  # the fused projections, once per call
            # routing for the update (R3); validation batches never reach it
            record = self.config.enable_rollout_routing_replay and not meta.get("validate", False)
            replay = RouterReplay.of(model) if record else None
            for start in range(0, rows, step):
                first_prompt = start // repeats
                part = source.batch[first_prompt : first_prompt + step // repeats].to(device)
                routing = DecodeRouting(replay) if replay is not None else None
                tokens, lps, ents = decode(
                    model,
                    part["input_ids"],
                    part["attention_mask"],
                    part["position_ids"],
                    params,
                    keys[start : start + step].to(device),
                    eos,
                    pad,
                    repeats=repeats,
                    fast=fast,
                    entropy=want_entropy,
                    routing=routing,
                )
                if routing is not None:
                    routed.append(routing.routed)
                responses.append(_pad_right(tokens, params.response_length, pad))
                log_probs.append(_pad_right(lps, params.response_length, 0.0))
                if ents is not None:
                    entropies.append(_pad_right(ents, params.response_length, 0.0))
        out_device = batch.batch["input_ids"].device
        responses_t = torch.cat(responses).to(out_device)
        log_probs_t = torch.cat(log_probs).to(out_device) if want_log_probs else None
        entropy_t = torch.cat(entropies).to(out_device) if want_entropy else None
        return build_rollout_output(
            batch,
            responses_t,
            [] if params.ignore_eos else eos,
            log_probs_t,
            rollout_entropy=entropy_t,
            routed_experts=torch.cat(routed).to(out_device) if routed else None,
        )
