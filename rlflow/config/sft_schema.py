"""Typed schema of the SFT trainer config (``config/sft_trainer.yaml``), verl's ``fsdp_sft_trainer`` keys.

Registered with Hydra's ConfigStore as ``rlflow_sft_schema`` (first in ``sft_trainer.yaml``'s defaults
list), so an unknown key or a wrongly typed value fails at composition naming the key path. Keys follow
verl's ``sft_trainer.yaml`` (``data.train_batch_size``, ``data.micro_batch_size_per_gpu``,
``data.max_length``, ``model.partial_pretrain``, ``optim.lr``, ``ulysses_sequence_parallel_size``,
``use_remove_padding``, ``trainer.total_epochs`` ...); the verl keys rlflow does not support are in the
schema so that a ported command line gets a clear refusal from `rlflow.config.sft_validate` instead of
"not a config key". The defaults are sized for the embedded tiny model and task on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlflow.config.engine_schema import MixedPrecisionSection, TiledMLPConfig, WrapPolicySection

__all__ = [
    "SFT_SCHEMA_NAME",
    "SFTConfig",
    "SFTDataConfig",
    "SFTFSDPConfig",
    "SFTModelConfig",
    "SFTOptimConfig",
    "SFTTrainerSection",
    "register_sft_configs",
]

SFT_SCHEMA_NAME = "rlflow_sft_schema"


@dataclass
class MultiturnSection:
    """``data.multiturn`` (verl): multi-turn conversations; not supported (validation refuses it)."""

    enable: bool = False
    messages_key: str = "messages"


@dataclass
class CustomClassSection:
    """``data.custom_cls`` (verl's key): a dataset class of the user's, ``name`` in the Python file ``path``.
    PPO builds its datasets with it (`rlflow.data.custom_dataset`); the SFT trainer refuses it."""

    path: str | None = None
    name: str | None = None


@dataclass
class SFTDataConfig:
    """``data``: the prompt/response pairs and the batch sizes.

    Attributes:
        train_batch_size: samples per optimizer step, over all ranks.
        micro_batch_size: verl's deprecated spelling; refused (use ``micro_batch_size_per_gpu``).
        micro_batch_size_per_gpu: samples per forward/backward on one rank (also the validation batch).
        use_dynamic_bsz: micro-batches by token budget ``max_token_len_per_gpu`` instead.
        max_token_len_per_gpu: token budget of one micro-batch with ``use_dynamic_bsz``.
        train_files / val_files: parquet/jsonl path(s); None = the embedded synthetic ``task``.
        task: embedded task (`rlflow.data.tasks.TASKS`) when the files are None.
        prompt_key / response_key: columns of the prompt and the response; a dotted path reaches into a
            nested column (``reward_model.ground_truth``, the embedded tasks' answer).
        prompt_dict_keys / response_dict_keys: verl's way into a dict column (``['question']``): the keys
            are applied in order after ``prompt_key`` / ``response_key``.
        max_length: longest prompt + response (tokens, after the chat template and the eos token).
        truncation: an overlong sample: error | left (keep the end) | right (keep the start).
        balance_dp_token: verl's switch for dividing the loss by the tokens of all ranks; rlflow always
            does (the loss is the mean over every response token of the batch), so false is refused.
        apply_chat_template_kwargs: extra arguments for ``tokenizer.apply_chat_template``.
        shuffle / seed: the training order (seeded per epoch, resumable).
    """

    train_batch_size: int = 32
    micro_batch_size: int | None = None
    micro_batch_size_per_gpu: int = 16
    use_dynamic_bsz: bool = False
    max_token_len_per_gpu: int = 2048
    train_files: Any = None
    val_files: Any = None
    task: str = "repeat"
    prompt_key: str = "prompt"
    response_key: str = "reward_model.ground_truth"
    prompt_dict_keys: list[str] | None = None
    response_dict_keys: list[str] | None = None
    multiturn: MultiturnSection = field(default_factory=MultiturnSection)
    max_length: int = 64
    truncation: str = "error"
    balance_dp_token: bool = True
    chat_template: str | None = None
    custom_cls: CustomClassSection = field(default_factory=CustomClassSection)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    shuffle: bool = True
    seed: int = 1


@dataclass
class SFTFSDPConfig:
    """``model.fsdp_config``: sharding of the model (verl's names where they exist).

    Attributes:
        model_dtype: dtype of the master weights (fp32 | bf16 ...).
        cpu_offload / offload_params: verl's two spellings of parameter + optimizer CPU offload.
        fsdp_size: ranks one parameter is sharded over; -1 = all.
        reshard_after_forward: ZeRO-3 (true) or ZeRO-2 (false).
        mixed_precision: compute / reduce / buffer dtypes.
    """

    model_dtype: str = "fp32"
    wrap_policy: WrapPolicySection = field(default_factory=WrapPolicySection)
    cpu_offload: bool = False
    offload_params: bool = False
    fsdp_size: int = -1
    reshard_after_forward: bool = True
    mixed_precision: MixedPrecisionSection = field(default_factory=MixedPrecisionSection)


@dataclass
class SFTModelConfig:
    """``model``: the model to fine-tune.

    Attributes:
        partial_pretrain: HF directory, hub id or ``rlflow://tiny[?...]`` (the random-init tiny model).
        strategy: fsdp | fsdp2.
        external_lib: a module imported before the model is built (registers custom architectures).
        lora_rank / lora_alpha / target_modules: LoRA (verl); ``lora_rank > 0`` is refused.
        use_liger: Liger kernels (verl); refused.
        tiled_mlp: the decoder layers' MLP in checkpointed pieces (`rlflow.config.engine_schema.TiledMLPConfig`).
    """

    partial_pretrain: str = "rlflow://tiny"
    strategy: str = "fsdp2"
    trust_remote_code: bool = False
    attn_implementation: str = "sdpa"
    enable_gradient_checkpointing: bool = False
    external_lib: str | None = None
    fsdp_config: SFTFSDPConfig = field(default_factory=SFTFSDPConfig)
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: Any = "all-linear"
    use_liger: bool = False
    tiled_mlp: TiledMLPConfig = field(default_factory=TiledMLPConfig)


@dataclass
class SFTOptimConfig:
    """``optim`` (verl's SFT names): AdamW, linear warm-up, then constant or cosine.

    Attributes:
        warmup_steps_ratio: warm-up length as a fraction of the run's optimizer steps.
        clip_grad: gradient-norm clip.
        lr_scheduler: constant | cosine (cosine decays to ``min_lr_ratio * lr``).
    """

    lr: float = 1.0e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1.0e-8
    weight_decay: float = 0.01
    warmup_steps_ratio: float = 0.1
    clip_grad: float = 1.0
    lr_scheduler: str = "cosine"
    min_lr_ratio: float = 0.0


@dataclass
class SFTTrainerSection:
    """``trainer``: run length, resources, logging, checkpoints.

    Attributes:
        total_training_steps: None = ``total_epochs`` times the steps per epoch.
        save_freq / test_freq: every N steps; -1 = only at the end (save) / never (validation during
            the run; a final validation always runs when there is a validation set).
        default_local_dir: checkpoints: ``global_step_<n>/`` (sharded state for resuming) with a full HF
            model in ``global_step_<n>/huggingface`` (what ``actor_rollout_ref.model.path`` takes).
        default_hdfs_dir: verl's key: a directory (or ``hdfs://...``) every complete checkpoint is
            copied to, with its own pointer file (`rlflow.utils.checkpoint_files`); null = no copy.
        resume_mode: auto (the latest checkpoint in ``default_local_dir``) | disable | resume_path.
        resume_path: verl's older spelling of ``resume_from_path``.
        n_gpus_per_node: ranks per node (processes on CPU); under ``torchrun`` the launcher's world size
            must equal ``nnodes × n_gpus_per_node``.
        cpu_linear_kernel: the PPO trainer's key (`rlflow.models.cpu_linear`): auto | aten | onednn; each
            rank resolves ``auto`` where it runs.
    """

    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    default_hdfs_dir: str | None = None
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    resume_path: str | None = None
    project_name: str = "rlflow-sft"
    experiment_name: str = "tiny_sft"
    total_epochs: int = 1
    total_training_steps: int | None = None
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    log_dir: str | None = None
    seed: int = 1
    save_freq: int = -1
    test_freq: int = -1
    max_ckpt_to_keep: int | None = None
    nnodes: int = 1
    n_gpus_per_node: int = 1
    device: str = "auto"
    cpu_linear_kernel: str = "auto"


@dataclass
class SFTConfig:
    """The whole SFT config."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    ulysses_sequence_parallel_size: int = 1
    use_remove_padding: bool = True
    trainer: SFTTrainerSection = field(default_factory=SFTTrainerSection)


def register_sft_configs() -> None:
    """Register `SFTConfig` as ``rlflow_sft_schema`` in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SFT_SCHEMA_NAME, node=SFTConfig)
