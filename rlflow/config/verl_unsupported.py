"""verl keys rlflow does not have, each with what to do instead (`rlflow.config.suggest.check_override_keys`).

An unknown key gets "did you mean"; a key that verl has and rlflow deliberately lacks gets this advice
instead, so a ported script fails with the reason and the replacement. Matching is by the key or any
section above it (``actor_rollout_ref.rollout.engine_kwargs.trtllm`` covers ``...engine_kwargs.trtllm.x``).
"""

from __future__ import annotations

__all__ = ["MEGATRON_ADVICE", "VERL_UNSUPPORTED", "unsupported_advice"]

_TRTLLM = (
    "a TensorRT-LLM engine option: rlflow's rollout engines are hf and vllm "
    "(actor_rollout_ref.rollout.name); vLLM's batch limits are rollout.max_num_seqs and "
    "rollout.max_num_batched_tokens. Drop the key"
)
_QUANTIZED = (
    "a quantized rollout engine (vLLM with fp8 / torchao weights) is not supported: drop the key; the rollout "
    "computes in actor_rollout_ref.rollout.dtype (null = the actor's precision)"
)
MEGATRON_ADVICE = (
    "rlflow trains on FSDP: on the command line strategy=megatron is read as fsdp2 together with the "
    "megatron.* keys (rlflow.config.megatron_layout); in a config file write strategy: fsdp2"
)
_CRITIC_LORA = (
    "LoRA adapters are for the actor only (actor_rollout_ref.model.lora_rank): the critic trains every weight; "
    "drop the key, or give the critic a smaller model (critic.model.path)"
)

VERL_UNSUPPORTED: dict[str, str] = {
    "actor_rollout_ref.model.use_liger": (
        "Liger kernels (Triton GPU kernels) are not part of rlflow: drop the key; "
        "actor_rollout_ref.model.use_fused_kernels=true bounds the LM head's memory (a chunked PyTorch head)"
    ),
    "actor_rollout_ref.rollout.quantization": _QUANTIZED,
    "actor_rollout_ref.rollout.quantization_config_file": _QUANTIZED,
    "actor_rollout_ref.rollout.max_batch_size": _TRTLLM,
    "actor_rollout_ref.rollout.engine_kwargs.trtllm": _TRTLLM,
    "reward_model.sandbox_fusion_url": (
        "verl's SandboxFusion code-execution service (with reward_manager=prime): rlflow has no sandbox client; "
        "score code with a custom_reward_function (custom_reward_function.path / name) that calls your sandbox"
    ),
    "trainer.bench_steps": (
        "rlflow has no such key: every step logs its phase times (timing_s/*), and trainer.profile_steps "
        "records traces of chosen steps; drop it"
    ),
    **{f"critic.model.{key}": _CRITIC_LORA for key in ("lora_rank", "lora_alpha", "target_modules")},
    "trainer.npu_profile": (
        "verl's Ascend NPU profiler (trainer.npu_profile.*): rlflow records torch.profiler traces with "
        "trainer.profile_steps and each role's profile_ranks (or verl's global_profiler.* layout); drop it"
    ),
    "profile": (
        "verl's Ascend NPU profiler section (profile.options.*): rlflow records torch.profiler traces with "
        "trainer.profile_steps and each role's profile_ranks (or verl's global_profiler.* layout); drop it"
    ),
    "data.custom_cls": (
        "a dataset class of your own (verl's multimodal recipes): rlflow's RLHFDataset reads parquet / jsonl "
        "chat prompts (data.prompt_key) and is not replaceable; convert the data to that layout"
    ),
    "data.sampling_ratios": (
        "per-file sampling ratios are not supported: the training files are concatenated and shuffled; "
        "repeat or subsample the files to weight them"
    ),
    "reward_model.strategy": (
        "the reward model runs as one full copy per rank (forward only, no FSDP): drop the key"
    ),
}
"""verl key (or section) -> why rlflow lacks it and what to do."""


def unsupported_advice(key: str) -> str | None:
    """The advice for ``key`` or the nearest section above it in `VERL_UNSUPPORTED`; None if neither."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        advice = VERL_UNSUPPORTED.get(".".join(parts[:i]))
        if advice is not None:
            return advice
    return None
