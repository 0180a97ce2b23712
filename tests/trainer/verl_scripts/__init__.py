"""Override lists of verl example scripts (facts: the keys and values each script passes to
``verl.trainer.main_ppo``), with the environment edits that fit them to a 2-core CPU machine.

Kept: every key and value of the script. Edited, marked ``# env``: data and model paths (dropped: the
embedded task and tiny model stand in), GPU counts, batch sizes and sequence lengths, the rollout engine
(vLLM / SGLang need a GPU: ``hf``), tensor parallelism (1), the fused-kernel backend (triton is a GPU
kernel: ``torch``), the device, wandb, the data loader's worker processes (0 on 2 cores: the scripts
keep verl's default 8). The scripts' names are those of verl's ``examples/`` (and ``recipe/dapo``)
directories.
"""

from __future__ import annotations

from .engines import GRPO_MOONLIGHT_16B_AUTOMODEL, GRPO_QWEN3_8B_MINDSPEED, PPO_QWEN3_30B_VEOMNI
from .grpo import (
    GRPO_GLM41V_9B,
    GRPO_MISTRAL31_24B,
    GRPO_QWEN2_7B,
    GRPO_QWEN2_7B_SEQ_BALANCE,
    GRPO_QWEN2_7B_SYNC_REF_MODEL,
    GRPO_QWEN3_8B_NPU,
    GRPO_QWEN3_VL_30B_A3B_FSDP,
    GRPO_QWEN3_VL_30B_FSDP2,
    GRPO_QWEN25_3B_LORA,
)
from .megatron import (
    GMPO_QWEN25_7B_MEGATRON,
    GRPO_NEMOTRON_35_LIGHTNING_MEGATRON,
    GRPO_QWEN2_7B_MATH_MEGATRON,
    GRPO_QWEN3_VL_30B_MEGATRON,
    PPO_MOONLIGHT16B_A3B_MEGATRON,
)
from .outcome import (
    DAPO_7B_MATH,
    GMPO_QWEN3_8B,
    GPG_QWEN2_7B_MATH,
    REINFORCE_PP_QWEN2_7B_MATH,
    REMAX_QWEN25_3B_SEQ_BALANCE,
    RLOO_QWEN2_7B,
    SAPO_QWEN3_30B,
)
from .ppo import (
    DEEPSEEK7B_SP2,
    DEEPSEEK7B_SP2_EARLY_2025,
    PPO_DEEPSEEK7B_SANDBOX_FUSION,
    PPO_QWEN2_7B_RM,
    PPO_QWEN2_7B_RM_SEQ_BALANCE_FUSED,
    PPO_QWEN2_7B_RM_SEQ_BALANCE_NSYS,
    PPO_QWEN2_7B_SEQ_BALANCE,
)

__all__ = [
    "DAPO_7B_MATH",
    "DEEPSEEK7B_SP2",
    "DEEPSEEK7B_SP2_EARLY_2025",
    "GMPO_QWEN3_8B",
    "GMPO_QWEN25_7B_MEGATRON",
    "GPG_QWEN2_7B_MATH",
    "GRPO_GLM41V_9B",
    "GRPO_MISTRAL31_24B",
    "GRPO_MOONLIGHT_16B_AUTOMODEL",
    "GRPO_NEMOTRON_35_LIGHTNING_MEGATRON",
    "GRPO_QWEN2_7B",
    "GRPO_QWEN2_7B_MATH_MEGATRON",
    "GRPO_QWEN2_7B_SEQ_BALANCE",
    "GRPO_QWEN2_7B_SYNC_REF_MODEL",
    "GRPO_QWEN3_8B_MINDSPEED",
    "GRPO_QWEN3_8B_NPU",
    "GRPO_QWEN3_VL_30B_A3B_FSDP",
    "GRPO_QWEN3_VL_30B_FSDP2",
    "GRPO_QWEN3_VL_30B_MEGATRON",
    "GRPO_QWEN25_3B_LORA",
    "PPO_DEEPSEEK7B_SANDBOX_FUSION",
    "PPO_MOONLIGHT16B_A3B_MEGATRON",
    "PPO_QWEN2_7B_RM",
    "PPO_QWEN2_7B_RM_SEQ_BALANCE_FUSED",
    "PPO_QWEN2_7B_RM_SEQ_BALANCE_NSYS",
    "PPO_QWEN2_7B_SEQ_BALANCE",
    "PPO_QWEN3_30B_VEOMNI",
    "REINFORCE_PP_QWEN2_7B_MATH",
    "REMAX_QWEN25_3B_SEQ_BALANCE",
    "RLOO_QWEN2_7B",
    "SAPO_QWEN3_30B",
]
