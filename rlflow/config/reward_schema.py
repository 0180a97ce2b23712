"""The reward section of the trainer config (``reward_model``): the reward model, the reward manager and
the SandboxFusion service of code tasks.

Re-exported by `rlflow.config.schema`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlflow.config.interpolation import II

__all__ = [
    "RewardModelConfig",
    "RewardModelInferenceConfig",
    "RewardModelOffloadConfig",
    "RewardModelPathConfig",
    "SandboxFusionSection",
]


@dataclass
class RewardModelOffloadConfig:
    """``reward_model.model.fsdp_config`` (verl's name; the reward model is one plain copy per rank).

    Attributes:
        param_offload: keep the reward model's weights in host memory between scoring calls, on the device
            only while it scores (frees accelerator memory for the colocated roles; nothing to do on CPU).
    """

    param_offload: bool = False


@dataclass
class RewardModelPathConfig:
    """``reward_model.model``.

    Attributes:
        use_remove_padding: score packed rows (the valid tokens only), as the actor and critic forwards
            do; follows ``actor_rollout_ref.model.use_remove_padding`` in the YAML.
        input_tokenizer: the tokenizer the data was made with (the policy's), for a reward model with its
            own tokenizer and chat template: each conversation is decoded and re-encoded with the reward
            model's (`rlflow.reward.retokenize`; needs ``data.return_raw_chat``); None = the reward model
            reads the policy's tokens as they are (same tokenizer).
    """

    path: str | None = None
    input_tokenizer: str | None = None
    trust_remote_code: bool = False
    use_remove_padding: bool = II("actor_rollout_ref.model.use_remove_padding")
    fsdp_config: RewardModelOffloadConfig = field(default_factory=RewardModelOffloadConfig)


@dataclass
class RewardModelInferenceConfig:
    """``reward_model.inference``: how the reward model runs (verl's reward-loop keys).

    rlflow scores with the model's sequence-classification forward in the reward-model worker group, on the
    policy's tokens as they are (one tokenizer), data-parallel over the group's ranks.

    Attributes:
        name: the engine; ``hf`` (the forward in the worker group) is the one rlflow has: verl's served
            ``vllm`` / ``sglang`` reward engines are refused with that advice.
        gpu_memory_utilization: on CUDA, the fraction of the GPU's memory the reward-model process may hold
            (``torch.cuda.set_per_process_memory_fraction``: a cap, not a pre-allocation); unused on CPU.
        tensor_model_parallel_size: 1 (every rank holds the whole reward model); larger is refused.
        prompt_length: longest prompt (tokens) the reward model scores; must cover ``data.max_prompt_length``.
        response_length: longest response it scores; must cover ``data.max_response_length``. Each batch is
            checked against both before scoring.
    """

    name: str = "hf"
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    prompt_length: int = II("data.max_prompt_length")
    response_length: int = II("data.max_response_length")


@dataclass
class SandboxFusionSection:
    """``reward_model.sandbox_fusion``: a SandboxFusion service that runs the code answers of code tasks
    (data sources ``codecontests``, ``apps``, ``codeforces``, ``taco``) for the default scorer
    (`rlflow.reward.sandbox_fusion`).

    Attributes:
        url: the service's ``run_code`` endpoint (``http://host:8080/run_code``); null = none, and code
            tasks cannot be scored by the default scorer.
        max_concurrent: requests one scoring process keeps in flight.
        memory_limit_mb: memory limit of one run.
    """

    url: str | None = None
    max_concurrent: int = 64
    memory_limit_mb: int = 1024


@dataclass
class RewardModelConfig:
    """``reward_model``: an optional model-based reward and the reward manager settings.

    Attributes:
        reward_manager: naive (score function per sample) | dapo (plus DAPO's overlong penalty) | prime
            (verl's: naive scoring in a process pool, by default ``min(64, CPUs)`` processes and a 300 s
            per-sample timeout).
        reward_kwargs: keyword arguments of the reward manager (verl's spelling): dapo takes
            ``overlong_buffer_cfg.{enable,len,penalty_factor,log}`` and ``max_resp_len``
            (`rlflow.reward.dapo`); naive takes none.
        num_workers: > 0 scores in a process pool of that size.
        timeout_s: per-sample timeout with the pool (None = none); a timed-out sample gets ``timeout_score``.
        use_reward_loop: verl's switch between its two reward paths; rlflow has one (the reward-model group's
            scores, then the reward manager), which both values run; the driver logs which it is.
        micro_batch_size_per_gpu: samples per scoring forward on one rank.
        micro_batch_size: verl's deprecated global form of it (`rlflow.config.global_sizes`).
        use_dynamic_bsz: score in micro-batches under ``forward_max_token_len_per_gpu`` valid tokens each
            (balanced) instead.
        forward_max_token_len_per_gpu: that token budget (>= the longest scored sequence).
    """

    enable: bool = False
    model: RewardModelPathConfig = field(default_factory=RewardModelPathConfig)
    use_reward_loop: bool = False
    inference: RewardModelInferenceConfig = field(default_factory=RewardModelInferenceConfig)
    micro_batch_size_per_gpu: int | None = 16
    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    forward_max_token_len_per_gpu: int = 32768
    reward_manager: str = "naive"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    sandbox_fusion: SandboxFusionSection = field(default_factory=SandboxFusionSection)
    launch_reward_fn_async: bool = False
    num_workers: int = 0
    timeout_s: float | None = None
    timeout_score: float = 0.0
