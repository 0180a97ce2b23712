"""Typed ``actor_rollout_ref.rollout`` section of the PPO trainer config (part of
`rlflow.config.schema.PPOTrainerConfig`, which re-exports it; its checks: `rlflow.config.rollout_checks`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlflow.config.interpolation import II

__all__ = ["EngineKwargsSection", "MultiTurnSection", "RolloutSection", "ValKwargsSection"]


@dataclass
class ValKwargsSection:
    """``actor_rollout_ref.rollout.val_kwargs``: sampling for validation (greedy by default, so validation
    scores are deterministic).

    Attributes:
        temperature: softmax temperature (0 with ``do_sample=false`` is greedy).
        top_k: keep the k most likely tokens (-1 or 0 = off).
        top_p: nucleus mass (1.0 = off).
        do_sample: sample (true) or take the argmax (false).
        n: samples per prompt.
    """

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = False
    n: int = 1


@dataclass
class MultiTurnSection:
    """``actor_rollout_ref.rollout.multi_turn`` (verl's keys): rlflow generates single-turn responses.

    Attributes:
        enable: multi-turn tool-calling rollouts; only false is supported.
        format: the tool-call chat format of multi-turn rollouts; verl's default ``hermes`` (which its
            single-turn scripts pass too) is accepted, any other value refused.
    """

    enable: bool = False
    format: str = "hermes"


@dataclass
class EngineKwargsSection:
    """``actor_rollout_ref.rollout.engine_kwargs``: extra keyword arguments of the rollout engine, one
    free-form section per engine (verl's layout); only the running engine's section is read.

    Attributes:
        vllm: passed to ``vllm.LLM`` with ``rollout.name=vllm`` (`rlflow.rollout.vllm.vllm_engine_kwargs`);
            the keys rlflow sets from its own rollout keys, or needs for the weight sync, are refused.
            With ``name=hf`` nothing reads them (a warning says so).
        sglang: verl's SGLang options; rlflow has no SGLang engine (``name=sglang`` is refused), so they
            are accepted for ported scripts and ignored, with a warning.
        trtllm: verl's TensorRT-LLM options: as ``sglang`` (no such engine here; accepted, warned).
    """

    vllm: dict[str, Any] = field(default_factory=dict)
    sglang: dict[str, Any] = field(default_factory=dict)
    trtllm: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutSection:
    """``actor_rollout_ref.rollout``: generation (`rlflow.rollout`). The engine options after
    ``val_kwargs`` are additions to verl's keys so that its vLLM knobs can be set.

    Attributes:
        name: hf (embedded, CPU too) | vllm (GPU extra).
        mode: sync | async, verl's two ways to drive the engine (async: a served engine fed request by
            request through verl's agent loop, verl's default since it deprecated sync). rlflow's rollouts
            are single-turn calls on the actor workers: both values run that engine and sample the same
            responses (the driver logs the mode); what async serves beyond that (multi-turn, agent loops)
            is refused by its own keys.
        multi_turn: verl's multi-turn section; single-turn only (``enable=false``).
        temperature: softmax temperature; 0 means greedy (as in vLLM); log-probs are then taken at 1.
        top_k: keep the k most likely tokens; -1 (or 0) = off.
        top_p: nucleus sampling mass in (0, 1]; 1.0 = off (Holtzman et al. 2019, arXiv:1904.09751).
        do_sample: sample (true) or greedy argmax (false).
        n: responses per prompt (GRPO group size); rows are interleaved per prompt.
        prompt_length: maximum prompt width; wider prompts raise ``ValueError``.
        response_length: maximum generated tokens per response (the width of ``responses``).
        micro_batch_size: rows (after the ``n`` repeat) decoded together; None = the whole batch.
        seed: base seed of the sampling noise (counter-based: keyed by step and global row).
        calculate_log_probs: also return ``rollout_log_probs`` (and log ``training/rollout_probs_diff_*``).
        enable_rollout_routing_replay: a mixture-of-experts actor: also return each token's experts as
            ``routed_experts`` (`rlflow.models.router_replay`), which ``actor.router_replay.mode=R3`` replays.
        log_prob_micro_batch_size_per_gpu: responses per forward of the old-log-prob pass on one rank.
        log_prob_micro_batch_size: verl's deprecated global form of it (`rlflow.config.global_sizes`).
        log_prob_use_dynamic_bsz: token-budget micro-batches for the old-log-prob pass.
        log_prob_max_token_len_per_gpu: token budget per micro-batch of that pass.
        val_kwargs: sampling used for validation batches.
        free_cache_engine: hf: drop the gathered generation replica after each call (true) or keep its
            memory for the next one; vllm: sleep the engine between calls.
        dtype: dtype of the generation replica / vLLM engine; None = the actor's parameter dtype.
        quantization: None, or ``fp8``: the hf engine decodes with FP8 numerics, verl's FP8 rollout
            (DeepSeek's block scaling: weights in 128 x 128 blocks quantized at each weight sync,
            activations in 1 x 128 blocks per token; `rlflow.models.fp8`, emulated in FP32).
        tensor_model_parallel_size: vllm: tensor-parallel size of the engine.
        data_parallel_size / expert_parallel_size: verl's engine-internal data / expert parallelism;
            1 only (each actor rank runs its own engine, so the rollout is data-parallel over the
            actor's ranks already; the models rlflow trains have no experts to spread).
        gpu_memory_utilization: vllm: fraction of GPU memory the engine may take.
        enforce_eager: vllm: disable CUDA graphs.
        max_num_batched_tokens: vllm: scheduler token budget per step.
        max_num_seqs: vllm: scheduler sequence budget per step.
        max_model_len: vllm: context length; None = ``prompt_length + response_length``.
        enable_chunked_prefill: vllm: chunked prefill.
        enable_prefix_caching: vllm: reuse the KV cache of a prompt prefix already computed (the ``n``
            responses of one prompt share it); the hf engine prefills each row once in any case.
        ignore_eos: always generate ``response_length`` tokens (benchmarks; an EOS is an ordinary token).
        min_tokens: no EOS before this many tokens (sampling masks it; log-probs are of the full softmax).
        update_weights_bucket_megabytes: bringing the actor's weights into the engine (hf replica, vllm)
            all-gathers them in buckets of at most this many MiB, one collective per bucket; peak extra
            memory about two buckets (verl's key, also spelled ``checkpoint_engine.<key>``).
        engine_kwargs: per-engine extra options (`EngineKwargsSection`).
        profile_ranks / profile_ranks_all / profile_discrete: as the actor's, for ``generate_sequences``.
    """

    name: str = "hf"
    mode: str = "async"
    multi_turn: MultiTurnSection = field(default_factory=MultiTurnSection)
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    n: int = 1
    prompt_length: int = II("data.max_prompt_length")
    response_length: int = II("data.max_response_length")
    micro_batch_size: int | None = None
    seed: int = 0
    calculate_log_probs: bool = False
    enable_rollout_routing_replay: bool = False
    log_prob_micro_batch_size_per_gpu: int | None = 16
    log_prob_micro_batch_size: int | None = None
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    val_kwargs: ValKwargsSection = field(default_factory=ValKwargsSection)
    free_cache_engine: bool = True
    dtype: str | None = None
    quantization: str | None = None
    tensor_model_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    ignore_eos: bool = False
    min_tokens: int = 0
    update_weights_bucket_megabytes: int = 512
    engine_kwargs: EngineKwargsSection = field(default_factory=EngineKwargsSection)
    profile_ranks: list[int] | None = None
    profile_ranks_all: bool = False
    profile_discrete: bool = False
