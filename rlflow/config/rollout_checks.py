"""Checks of ``actor_rollout_ref.rollout`` (part of `rlflow.config.validate.validate_config`)."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from rlflow.config.checks import at_least, choice, flag, number, value_at

__all__ = ["ROLLOUT_MODES", "ROLLOUT_NAMES", "VLLM_ENGINE_KWARGS_OWNED", "check_rollout"]

VLLM_ENGINE_KWARGS_OWNED: dict[str, str] = {
    "model": "actor_rollout_ref.model.path",
    "tensor_parallel_size": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "dtype": "actor_rollout_ref.rollout.dtype",
    "gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "enforce_eager": "actor_rollout_ref.rollout.enforce_eager",
    "max_model_len": "actor_rollout_ref.rollout.max_model_len",
    "max_num_seqs": "actor_rollout_ref.rollout.max_num_seqs",
    "max_num_batched_tokens": "actor_rollout_ref.rollout.max_num_batched_tokens",
    "enable_chunked_prefill": "actor_rollout_ref.rollout.enable_chunked_prefill",
    "enable_prefix_caching": "actor_rollout_ref.rollout.enable_prefix_caching",
    "enable_sleep_mode": "actor_rollout_ref.rollout.free_cache_engine",
    "seed": "actor_rollout_ref.rollout.seed",
    "load_format": "nothing: the engine starts with dummy weights and receives the actor's every step",
    "skip_tokenizer_init": "nothing: the engine gets token ids and returns token ids",
    "logprobs_mode": "nothing: rollout log-probs are of the processed (temperature-scaled) distribution",
}
"""``vllm.LLM`` arguments rlflow sets itself -> the key that sets them (``engine_kwargs.vllm`` may not)."""

ROLLOUT = "actor_rollout_ref.rollout"
logger = logging.getLogger(__name__)

ROLLOUT_NAMES = ("hf", "vllm")
"""``actor_rollout_ref.rollout.name`` values: the engines of `rlflow.rollout.ROLLOUT_CLASSES` (a test keeps
the two equal; the rollout package sits above the config, so the names are listed here)."""

ROLLOUT_MODES = ("sync", "async")
"""``actor_rollout_ref.rollout.mode`` values. verl's ``async`` serves the engine to its agent loop; for
the single-turn rollouts rlflow has, both run the same engine call (see `RolloutSection`)."""


def _check_sampling(cfg: DictConfig, prefix: str) -> None:
    do_sample = flag(cfg, f"{prefix}.do_sample")
    temperature = at_least(cfg, f"{prefix}.temperature", 0.0, integer=False)
    if do_sample and temperature <= 0:
        raise ValueError(f"{prefix}.temperature={temperature!r} must be > 0 when {prefix}.do_sample=true")
    value = number(cfg, f"{prefix}.top_p")
    if not 0 < value <= 1:
        raise ValueError(f"{prefix}.top_p={value!r} must be in (0, 1]")
    at_least(cfg, f"{prefix}.top_k", -1)
    n = at_least(cfg, f"{prefix}.n", 1)
    if n > 1 and not do_sample and prefix.endswith("val_kwargs"):
        # validation only measures: n identical responses give the one response's score, at n times the cost
        logger.warning(
            "%s.n=%d with %s.do_sample=false: the %d greedy responses of each validation prompt are identical, so "
            "the scores are those of one response at %d times its cost; set %s.do_sample=true and a temperature "
            "> 0 to sample them, or n=1",
            prefix, n, prefix, n, n, prefix,
        )  # fmt: skip
    elif n > 1 and not do_sample:
        raise ValueError(
            f"{prefix}.n={n} with {prefix}.do_sample=false: the {n} greedy responses of a prompt are "
            f"identical (no group baseline, no pass@k); set {prefix}.do_sample=true and a temperature > 0"
        )


def check_rollout(cfg: DictConfig) -> None:
    """``actor_rollout_ref.rollout``: engine, sampling (training and validation), lengths, engine limits."""
    choice(cfg, f"{ROLLOUT}.name", ROLLOUT_NAMES)
    mode = value_at(cfg, f"{ROLLOUT}.mode")
    if mode not in ROLLOUT_MODES:
        raise ValueError(
            f"{ROLLOUT}.mode={mode!r}: expected one of {list(ROLLOUT_MODES)} (verl's rollout modes; rlflow runs "
            "its single-turn engine on the actor workers for both)"
        )
    if flag(cfg, f"{ROLLOUT}.multi_turn.enable"):
        raise ValueError(
            f"{ROLLOUT}.multi_turn.enable=true: rlflow generates single-turn responses only; multi-turn "
            "tool-calling rollouts are not implemented"
        )
    fmt = value_at(cfg, f"{ROLLOUT}.multi_turn.format")
    if fmt != "hermes":
        raise ValueError(
            f"{ROLLOUT}.multi_turn.format={fmt!r}: the tool-call format of multi-turn rollouts, which rlflow "
            "does not have; only verl's default 'hermes' (which single-turn scripts pass) is accepted — drop "
            "the key"
        )
    _check_engine_kwargs(cfg)
    _check_sampling(cfg, ROLLOUT)
    _check_sampling(cfg, f"{ROLLOUT}.val_kwargs")
    prompt_length = at_least(cfg, f"{ROLLOUT}.prompt_length", 1)
    max_prompt = value_at(cfg, "data.max_prompt_length")
    if prompt_length < max_prompt:
        raise ValueError(
            f"{ROLLOUT}.prompt_length={prompt_length} must be >= data.max_prompt_length={max_prompt}"
        )
    at_least(cfg, f"{ROLLOUT}.response_length", 1)
    at_least(cfg, f"{ROLLOUT}.micro_batch_size", 1, allow_none=True)
    at_least(cfg, f"{ROLLOUT}.update_weights_bucket_megabytes", 1)
    flag(cfg, f"{ROLLOUT}.ignore_eos")
    min_tokens = at_least(cfg, f"{ROLLOUT}.min_tokens", 0)
    if min_tokens > value_at(cfg, f"{ROLLOUT}.response_length"):
        raise ValueError(
            f"{ROLLOUT}.min_tokens={min_tokens} must be <= {ROLLOUT}.response_length="
            f"{value_at(cfg, f'{ROLLOUT}.response_length')}"
        )
    tp = at_least(cfg, f"{ROLLOUT}.tensor_model_parallel_size", 1)
    for key, why in (
        ("data_parallel_size", "each actor rank runs its own engine, so the rollout is data-parallel over "
         "the actor's ranks already"),
        ("expert_parallel_size", "rlflow shards models with FSDP only and spreads no experts"),
    ):  # fmt: skip
        size = at_least(cfg, f"{ROLLOUT}.{key}", 1)
        if size != 1:
            raise ValueError(f"{ROLLOUT}.{key}={size}: {why}; set it to 1 (or drop the key)")
    if value_at(cfg, f"{ROLLOUT}.name") == "vllm":
        _check_vllm(cfg, tp)
    value = number(cfg, f"{ROLLOUT}.gpu_memory_utilization")
    if not 0 < value <= 1:
        raise ValueError(f"{ROLLOUT}.gpu_memory_utilization={value!r} must be in (0, 1]")


def _check_vllm(cfg: DictConfig, tp: int) -> None:
    """What the vLLM rollout cannot do (rlflow/rollout/vllm.py), refused before anything starts."""
    if value_at(cfg, "trainer.device") == "cpu":
        raise ValueError(
            f"{ROLLOUT}.name=vllm with trainer.device=cpu: the vLLM engine runs on CUDA only; set "
            f"{ROLLOUT}.name=hf for CPU runs"
        )
    if tp > 1:
        raise ValueError(
            f"{ROLLOUT}.tensor_model_parallel_size={tp}: the vLLM rollout runs one engine per actor rank, each "
            "rank seeing one GPU, so tensor parallelism inside the engine is not supported; set it to 1 (the "
            "rollout is data-parallel over the actor's ranks)"
        )
    truncated = value_at(cfg, f"{ROLLOUT}.top_k") > 0 or value_at(cfg, f"{ROLLOUT}.top_p") < 1
    if truncated and value_at(cfg, f"{ROLLOUT}.calculate_log_probs"):
        raise ValueError(
            f"{ROLLOUT}.calculate_log_probs=true with top_k/top_p on: vLLM reports log-probs of the truncated, "
            "renormalised distribution, not the trainer's log_softmax(logits / temperature); turn top_k/top_p "
            f"off or set {ROLLOUT}.name=hf"
        )


def _check_engine_kwargs(cfg: DictConfig) -> None:
    """``engine_kwargs.vllm`` may not set what rlflow's own keys set (the engines warn about the sections
    they do not read: `rlflow.rollout.base.warn_unread_engine_kwargs`)."""
    vllm = OmegaConf.to_container(value_at(cfg, f"{ROLLOUT}.engine_kwargs.vllm"), resolve=True) or {}
    for key in vllm:
        if key in VLLM_ENGINE_KWARGS_OWNED:
            raise ValueError(
                f"{ROLLOUT}.engine_kwargs.vllm.{key}: rlflow sets vllm.LLM's {key!r} itself; set "
                f"{VLLM_ENGINE_KWARGS_OWNED[key]} instead"
            )
