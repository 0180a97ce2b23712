"""verl keys rlflow does not have, each with what to do instead (`rlflow.config.suggest.check_override_keys`).

An unknown key gets "did you mean"; a key that verl has and rlflow deliberately lacks gets this advice
instead, so a ported script fails with the reason and the replacement. Matching is by the key or any
section above it (``trainer.npu_profile`` covers ``trainer.npu_profile.options.level``).
"""

from __future__ import annotations

__all__ = ["MEGATRON_ADVICE", "QUANTIZED_ADVICE", "VERL_UNSUPPORTED", "unsupported_advice"]

QUANTIZED_ADVICE = (
    "a quantization config file (torchao / ModelOpt weights) is not supported: drop the key; "
    "actor_rollout_ref.rollout.quantization=fp8 is rlflow's FP8 rollout (block scaling, the hf engine)"
)
MEGATRON_ADVICE = (
    "rlflow trains on FSDP: on the command line strategy=megatron is read as fsdp2 together with the "
    "megatron.* keys (rlflow.config.megatron_layout); in a config file write strategy: fsdp2"
)

VERL_UNSUPPORTED: dict[str, str] = {
    "actor_rollout_ref.rollout.quantization_config_file": QUANTIZED_ADVICE,
    "trainer.bench_steps": (
        "rlflow has no such key: every step logs its phase times (timing_s/*), and trainer.profile_steps "
        "records traces of chosen steps; drop it"
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
