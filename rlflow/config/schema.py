"""Typed schema of the PPO trainer config (``config/ppo_trainer.yaml``), one dataclass per group.

The dataclasses are registered with Hydra's ConfigStore as ``rlflow_ppo_schema``; ``ppo_trainer.yaml``
lists that name first in its defaults list, so composition merges the YAML (and then the command-line
overrides) onto this schema. A key that is not in the schema, or a value of the wrong type, fails at
composition with the key path (Hydra/OmegaConf name it as ``full_key``).

Key paths follow verl (``data.*``, ``actor_rollout_ref.{model,actor,ref,rollout}.*``, ``critic.*``,
``reward_model.*``, ``custom_reward_function.*``, ``algorithm.*``, ``trainer.*``) so that a verl command
line ports with few changes. The defaults here and in the YAML are the same (a test checks it); the YAML
carries the comments. Interpolations (``${...}``) make one knob follow another, e.g. the critic's model
path follows the actor's unless set.

Cross-key rules (batch divisibility, world sizes, files, custom functions) are checked by
`rlflow.config.validate.validate_config`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from rlflow.config.algorithm_schema import (
    AlgorithmConfig,
    CustomFunctionConfig,
    FilterGroupsConfig,
    KLCtrlConfig,
    PFPPOConfig,
    RolloutCorrectionConfig,
)
from rlflow.config.checkpoint_schema import CheckpointContentsSection
from rlflow.config.engine_schema import (
    FSDPConfig,
    MegatronConfig,
    MixedPrecisionSection,
    OptimConfig,
    TiledMLPConfig,
    WrapPolicySection,
)
from rlflow.config.interpolation import II
from rlflow.config.mtp_schema import MtpConfig
from rlflow.config.reward_schema import (
    RewardModelConfig,
    RewardModelPathConfig,
)
from rlflow.config.rollout_schema import EngineKwargsSection, RolloutSection, ValKwargsSection
from rlflow.config.sft_schema import CustomClassSection
from rlflow.config.trainer_schema import RayInitConfig, TrainerConfig

__all__ = [
    "SCHEMA_NAME",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "CheckpointContentsSection",
    "CriticConfig",
    "CriticModelConfig",
    "CustomFunctionConfig",
    "DataConfig",
    "EngineKwargsSection",
    "FSDPConfig",
    "FilterGroupsConfig",
    "KLCtrlConfig",
    "MegatronConfig",
    "MixedPrecisionSection",
    "ModelConfig",
    "OptimConfig",
    "PFPPOConfig",
    "PPOTrainerConfig",
    "PolicyLossConfig",
    "RayInitConfig",
    "RefConfig",
    "RefFSDPConfig",
    "RewardModelConfig",
    "RewardModelPathConfig",
    "RolloutCorrectionConfig",
    "RolloutSection",
    "TiledMLPConfig",
    "TrainerConfig",
    "ValKwargsSection",
    "WrapPolicySection",
    "register_configs",
]

SCHEMA_NAME = "rlflow_ppo_schema"
"""ConfigStore name of `PPOTrainerConfig`; the first entry of ``ppo_trainer.yaml``'s defaults list."""


@dataclass
class ContinuousTokenConfig:
    """``data.continuous_token`` (verl's keys): the prompts rendered by the model family's own encoder
    (`rlflow.data.prompt_builders`). rlflow's single-turn rollout never re-tokenizes, which is what verl's
    continuous-token mode keeps across an agent's turns.

    Attributes:
        enable: render with the family's encoder instead of the chat template.
        model_family: auto (DeepSeek-V4's encoder when the tokenizer's directory has
            ``encoding/encoding_dsv4.py``, else the chat template) | deepseekv4.
        custom_builder_module: verl's own builder classes: null only.
    """

    enable: bool = False
    model_family: str = "auto"
    custom_builder_module: str | None = None


@dataclass
class DataConfig:
    """``data``: prompts, lengths and batch sizes (sizes in prompts, before ``rollout.n``).

    Attributes:
        tokenizer: null, or the policy's tokenizer path (``actor_rollout_ref.model.tokenizer_path``, else its
            ``path``); another is refused (the rollout decodes with the policy's).
        train_files: a parquet/jsonl path or a list of them; None uses the embedded synthetic ``task``.
        val_files: same for validation.
        train_max_samples / val_max_samples: > 0 keeps that many rows of the files (before filtering overlong
            prompts): drawn without replacement with ``seed`` when ``shuffle``, else the first ones; -1 all.
        task: embedded synthetic task (`rlflow.data.tasks.TASKS`) used when the files are None.
        prompt_key: column holding the chat messages.
        reward_fn_key: column naming each row's data source (selects the built-in scorer).
        max_prompt_length: padded prompt length (tokens, after the chat template).
        max_response_length: generated tokens per response (the rollout's ``response_length``).
        train_batch_size: prompts per step (each gets actor_rollout_ref.rollout.n responses).
        gen_batch_size: prompts per generation round (the loader's batch). With ``algorithm.filter_groups``
            on, rounds are generated until ``train_batch_size`` prompts with informative groups are kept;
            off, every step trains on the whole round, as verl does: the trainer then sets
            ``train_batch_size`` to this value, with a warning (`rlflow.config.global_sizes`).
        val_batch_size: prompts per validation batch; None evaluates the whole validation set at once.
        return_raw_chat: also hand the chat messages to the workers (``raw_prompt``).
        return_full_prompt: also hand the templated prompt text (``full_prompts``).
        apply_chat_template_kwargs: extra keyword arguments for ``tokenizer.apply_chat_template``.
        shuffle: shuffle the training prompts every epoch.
        validation_shuffle: the validation prompts in an order drawn from ``seed`` (the same every
            validation), else in file order.
        seed: seed of the training sampler.
        filter_overlong_prompts: drop (count and log) prompts longer than ``max_prompt_length``.
        truncation: what to do with an overlong prompt that is not filtered: error | left | right | middle.
        dataloader_num_workers: worker processes of the data loaders.
        trust_remote_code: load the tokenizer with the custom code its checkpoint ships (verl's key for
            the tokenizer); the workers load it with ``actor_rollout_ref.model.trust_remote_code``, which must
            be true as well.
        image_key / video_key: the columns verl's multimodal datasets keep images / videos in. rlflow
            trains text-only models: a row with a non-empty value there is refused, naming the file and
            row (the text would otherwise be trained on without its images).
        custom_cls: ``path`` / ``name`` of a dataset class to build the training and validation sets with
            instead of ``RLHFDataset`` (verl's key; `rlflow.data.custom_dataset`).
        continuous_token: who renders the prompts (`ContinuousTokenConfig`).
        custom_options: options of that class, which it reads as ``config.get(name)`` or ``config.<name>``
            (verl's scripts add them as ``+data.<name>...``: `rlflow.config.dataset_options`); refused
            without a class.
    """

    tokenizer: str | None = None
    train_files: Any = None
    val_files: Any = None
    train_max_samples: int = -1
    val_max_samples: int = -1
    task: str = "repeat"
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024
    gen_batch_size: int = II("data.train_batch_size")
    val_batch_size: int | None = None
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    shuffle: bool = True
    validation_shuffle: bool = False
    seed: int = 1
    filter_overlong_prompts: bool = False
    truncation: str = "error"
    dataloader_num_workers: int = 8
    trust_remote_code: bool = False
    image_key: str = "images"
    video_key: str = "videos"
    custom_cls: CustomClassSection = field(default_factory=CustomClassSection)
    continuous_token: ContinuousTokenConfig = field(default_factory=ContinuousTokenConfig)
    custom_options: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """``config.get(key, default)``, as verl's dataset classes read their ``data`` config: a data key's
        value, else the ``custom_options`` entry, else ``default``."""
        if key in {f.name for f in fields(self)}:
            return getattr(self, key)
        return self.custom_options.get(key, default)

    def __getattr__(self, name: str) -> Any:
        """``config.<name>`` for a ``custom_options`` entry (reached only for names that are not fields)."""
        options = self.__dict__.get("custom_options")
        if name.startswith("__") or not options or name not in options:
            raise AttributeError(f"data has no key {name!r}")
        return options[name]


@dataclass
class FusedKernelOptions:
    """``actor_rollout_ref.model.fused_kernel_options``.

    Attributes:
        impl_backend: torch (rlflow's chunked fused head).
    """

    impl_backend: str = "torch"


@dataclass
class ModelConfig:
    """``actor_rollout_ref.model``: the policy (also the reference policy and the rollout weights).

    Attributes:
        path: HF directory, hub id, ``rlflow://tiny[?key=value...]`` (random init) or ``rlflow://tiny-sft[/<task>]``;
            None = ``rlflow://tiny-sft``, the tiny model warm-started on ``data.task`` (rlflow.trainer.warm_start).
        attn_implementation: auto | sdpa | eager | flash_attention_2 (see `rlflow.models.loader`).
        use_remove_padding: pack the valid tokens of a micro-batch into one row (no padding compute).
        use_shared_prompts: with remove-padding, pack the samples of a prompt that share a micro-batch
            (the ``n`` responses of GRPO, RLOO, ...) with one copy of the prompt: its forward and
            backward run once, not ``n`` times (`rlflow.models.padding.unpad_shared_prompts`); the same
            log-probs, values and gradients up to float rounding. Actor, reference and critic.
        enable_gradient_checkpointing: recompute each decoder layer in the backward (keeps one
            activation per layer).
        enable_activation_offload: the actor's update keeps the activations its forward saves for the
            backward in host memory (`rlflow.parallel.activation_offload`); with gradient checkpointing,
            one per layer. Same numbers, less accelerator memory, a device-host copy each way.
        override_config: HF config attributes replaced when the model is built (actor, reference,
            rollout), e.g. ``+actor_rollout_ref.model.override_config.attention_dropout=0.0``.
        external_lib: a module name, a ``.py`` file or a list of them, imported by the driver before the
            config is validated and by every worker before it builds its model: modules that register HF
            models, advantage estimators, policy losses or reward managers
            (`rlflow.utils.import_utils.import_external_libs`).
        use_fused_kernels: the actor and the reference compute log-probs and entropy from the hidden
            states chunk by chunk, never holding the whole micro-batch's logits (`rlflow.models.fused_head`).
        fused_kernel_options: ``impl_backend``: torch (the chunked PyTorch head; verl's triton is refused).
        lora_rank: > 0 trains LoRA adapters of this rank on the actor's linear layers, everything else
            frozen (`rlflow.models.lora`); 0 trains every weight. The rollout, the HF export and the
            merger get the merged weights; the reference stays the base model.
        lora_alpha: the adapters' scale is ``lora_alpha / lora_rank``.
        target_modules: ``all-linear`` (every linear layer but the LM head), a list of module-name
            suffixes (``[q_proj,v_proj]``) or one regular expression over the full module name.
        exclude_modules: module-name suffixes (or one regular expression) taken out of the targets.
        lora_adapter_path: a saved PEFT LoRA adapter directory to continue training from (verl's key):
            its rank, alpha and target modules replace ``lora_rank`` / ``lora_alpha`` /
            ``target_modules``, its matrices are the adapters' start (`rlflow.models.peft_adapter`); the
            reference stays the base model. Every actor checkpoint writes its adapters in this format to
            ``actor/lora_adapter``.
        tiled_mlp: the decoder layers' MLP in pieces (`TiledMLPConfig`); actor and reference.
        custom_chat_template: a Jinja chat template replacing the tokenizer's own (verl's key): the
            prompts are rendered with it, and the tokenizers saved with checkpoints and exports carry it.
            Rendered once on a sample conversation before Ray starts.
        mtp: the checkpoint's multi-token-prediction layers on the actor (`rlflow.config.mtp_schema`).
    """

    path: str | None = None
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    attn_implementation: str = "sdpa"
    use_remove_padding: bool = True
    use_shared_prompts: bool = True
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    external_lib: Any = None
    use_fused_kernels: bool = False
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_adapter_path: str | None = None
    tiled_mlp: TiledMLPConfig = field(default_factory=TiledMLPConfig)
    custom_chat_template: str | None = None
    mtp: MtpConfig = field(default_factory=MtpConfig)


@dataclass
class PolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss``: ``loss_mode`` names a registered policy loss
    (`rlflow.algos.losses.register_policy_loss`); the other keys are read by the KL-Cov / Clip-Cov losses
    (`rlflow.algos.cov_losses`, verl's keys and defaults).

    Attributes:
        loss_mode: vanilla | gspo | gpg | geo_mean | sapo | cispo | kl_cov | clip_cov | a loss registered
            by user code.
        clip_cov_ratio: Clip-Cov: share of the mini-batch's valid tokens whose gradient is cut, in (0, 1].
        clip_cov_lb / clip_cov_ub: Clip-Cov: the covariance interval the cut tokens are drawn from.
        kl_cov_ratio: KL-Cov: share of the valid tokens (largest covariance) given the KL penalty, in (0, 1].
        ppo_kl_coef: KL-Cov: weight of ``|log_prob - old_log_prob|`` on those tokens, >= 0.
    """

    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1


@dataclass
class RouterReplayConfig:
    """``actor_rollout_ref.actor.router_replay``: routing replay of a mixture-of-experts actor (verl's keys,
    `rlflow.models.router_replay`).

    Attributes:
        mode: disabled | R2 (the old-log-prob pass records each token's experts, the update's forwards
            replay them) | R3 (the rollout records them while sampling, needs
            ``rollout.enable_rollout_routing_replay``; the old-log-prob pass and the update replay them).
        record_file / replay_file: verl's files of recorded routing: null only (the routing travels in
            the batch as ``routed_experts``).
    """

    mode: str = "disabled"
    record_file: str | None = None
    replay_file: str | None = None


@dataclass
class QATConfig:
    """``actor_rollout_ref.actor.qat``: quantization-aware training of 4-bit weights (verl's keys, also
    spelled ``actor.fsdp_config.qat.*`` and ``actor.megatron.qat.*``; `rlflow.models.qat`). The forward
    sees the quantized weights, the gradient updates the full-precision ones, and the rollout decodes with
    the quantized weights.

    Attributes:
        enable: QAT on.
        mode: w4a16 (NVFP4 weights: blocks of ``group_size`` with E4M3 scales) | mxfp4_experts (MXFP4 routed
            experts: blocks of 32, power-of-two scales); verl's w4a4 (activations too) is refused.
        group_size: NVFP4's block: 16 only.
        ignore_patterns: module names left in full precision (``re:<regex>`` or a name pattern).
        activation_observer: how w4a4 observes activation scales: its default only (w4a16 quantizes none).
        quantization_config_path: verl's vLLM quantization config: null only (the hf rollout gets the
            quantized weights at each weight sync).
    """

    enable: bool = False
    mode: str = "w4a16"
    group_size: int = 16
    ignore_patterns: list[str] = field(default_factory=lambda: ["lm_head", "embed_tokens", "re:.*mlp.gate$"])
    activation_observer: str = "static_minmax"
    quantization_config_path: str | None = None


@dataclass
class ActorConfig:
    """``actor_rollout_ref.actor``: the PPO policy update (verl key names).

    Attributes:
        strategy: fsdp (FSDP1) | fsdp2.
        ppo_mini_batch_size: prompts per optimizer step (times ``rollout.n`` responses), over all ranks.
        ppo_micro_batch_size_per_gpu: responses per forward/backward on one rank (fixed batching).
        ppo_micro_batch_size: verl's deprecated global form (all ranks); when set,
            ``ppo_micro_batch_size_per_gpu`` = it / the data-parallel size (`rlflow.config.global_sizes`).
        use_dynamic_bsz: micro-batches by token budget ``ppo_max_token_len_per_gpu`` instead.
        clip_ratio_low / clip_ratio_high: asymmetric clip (None = ``clip_ratio``).
        clip_ratio_c: dual-clip constant for negative advantages (Ye et al. 2020), > 1.
        tau_pos / tau_neg: SAPO's gate temperatures for positive / other advantages (``loss_mode=sapo``).
        loss_agg_mode: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm.
        loss_scale_factor: ``seq-mean-token-sum-norm``'s divisor of each sequence's loss sum (null: the
            response length ``data.max_response_length``; Dr. GRPO's constant).
        tis_imp_ratio_cap: truncated importance sampling between the rollout engine's and the trainer's
            probabilities (Yao et al. 2025): weights ``min(exp(old_log_prob - rollout_log_prob), cap)``
            multiply the per-token policy loss; -1 = off; needs ``rollout.calculate_log_probs``.
        moe_aux_loss_coef / moe_z_loss_coef: a mixture-of-experts actor's router losses added to its loss,
            summed over the MoE layers as Megatron-LM does (its ``moe_aux_loss_coeff`` / ``moe_z_loss_coeff``,
            `rlflow.algos.moe`): Switch load balancing and ST-MoE's z-loss over each micro-batch's tokens,
            weighted by its share of the mini-batch's tokens; 0 = off. Needs a Hugging Face MoE model
            (``output_router_logits``) and Ulysses SP 1.
        router_replay: replay of a mixture-of-experts actor's routing (`RouterReplayConfig`).
        qat: quantization-aware training (`QATConfig`).
        use_torch_compile: the log-prob and entropy kernels on the logits run through ``torch.compile``
            (`rlflow.utils.logit_blocks`, verl's key); null = on CUDA only (verl's default there; on CPU
            inductor's C++ build costs ~20 s per process, more than the tiny model's kernels take).
        profile_ranks / profile_ranks_all / profile_discrete: the ranks that record ``torch.profiler``
            traces on the steps of ``trainer.profile_steps``, one per step or one per call
            (`rlflow.single_controller.profiling`); none by default.
        checkpoint: what the actor's checkpoints hold (`rlflow.config.checkpoint_schema`).
    """

    strategy: str = "fsdp2"
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = 8
    ppo_micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    tis_imp_ratio_cap: float = -1.0
    moe_aux_loss_coef: float = 0.0
    moe_z_loss_coef: float = 0.0
    use_torch_compile: bool | None = None
    profile_ranks: list[int] | None = None
    profile_ranks_all: bool = False
    profile_discrete: bool = False
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    qat: QATConfig = field(default_factory=QATConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    checkpoint: CheckpointContentsSection = field(default_factory=CheckpointContentsSection)


@dataclass
class RefFSDPConfig:
    """``actor_rollout_ref.ref.fsdp_config``: the reference model's sharding. Its precision and strategy
    are the actor's (so reference and old log-probs differ only by the weights); the other keys default
    to the actor's and may differ (a forward-only model's sharding does not change its numbers)."""

    param_offload: bool = False
    fsdp_size: int = II("actor_rollout_ref.actor.fsdp_config.fsdp_size")
    reshard_after_forward: bool = II("actor_rollout_ref.actor.fsdp_config.reshard_after_forward")
    forward_prefetch: bool = II("actor_rollout_ref.actor.fsdp_config.forward_prefetch")
    offload_policy: bool = False
    model_dtype: str = II("actor_rollout_ref.actor.fsdp_config.model_dtype")
    wrap_policy: WrapPolicySection = field(default_factory=WrapPolicySection)


@dataclass
class RefConfig:
    """``actor_rollout_ref.ref``: reference-policy log-probs (made only with a KL term).

    Attributes:
        log_prob_micro_batch_size: verl's deprecated global form of ``log_prob_micro_batch_size_per_gpu``
            (`rlflow.config.global_sizes`).
        sync_ref_model: every ``ref_model_sync_steps`` training steps, after the actor's update, move the
            reference toward the actor: ``ref <- alpha * actor + (1 - alpha) * ref`` (TR-DPO's update,
            arXiv:2404.09656; `rlflow.parallel.weight_mixing`); the reference is then checkpointed too.
        ref_model_sync_steps: steps between two syncs.
        ref_model_mixup_alpha: ``alpha`` in (0, 1] (1 copies the actor).
        strategy: verl's key; the actor's (the reference shards like the actor so that reference and
            old log-probs differ only by the weights: another value is refused).
        use_torch_compile: as the actor's (its value by default).
        profile_ranks / profile_ranks_all / profile_discrete: as the actor's.
    """

    strategy: str = II("actor_rollout_ref.actor.strategy")
    log_prob_micro_batch_size_per_gpu: int | None = 16
    log_prob_micro_batch_size: int | None = None
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    ulysses_sequence_parallel_size: int = II("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    use_torch_compile: bool | None = II("actor_rollout_ref.actor.use_torch_compile")
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    sync_ref_model: bool = False
    ref_model_sync_steps: int = 512
    ref_model_mixup_alpha: float = 0.6
    profile_ranks: list[int] | None = None
    profile_ranks_all: bool = False
    profile_discrete: bool = False


@dataclass
class ActorRolloutRefConfig:
    """``actor_rollout_ref``: the policy model and its three uses (train, generate, reference).

    Attributes:
        hybrid_engine: verl's switch for the actor and its rollout engine sharing one process and the
            weights; rlflow always runs them that way (true; false is refused).
        nccl_timeout: seconds a collective of the actor's or the reference's process group may wait
            before it fails (NCCL on GPU, gloo on CPU), as in verl.
    """

    hybrid_engine: bool = True
    nccl_timeout: float = 600
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)


@dataclass
class CriticModelConfig:
    """``critic.model``: the value model; by default the actor's model with a fresh scalar head.

    Attributes:
        override_config: HF config attributes replaced when the value model is built.
        enable_activation_offload: as the actor's (``actor_rollout_ref.model``), for the critic's update.
        use_shared_prompts: as the actor's, for the critic's forwards (follows the actor's).
        lora_rank: > 0 trains LoRA adapters of this rank on the value model's linear layers and its value
            head in full, everything else frozen (`rlflow.models.lora`; verl's key, PEFT's token
            classification with the head in ``modules_to_save``); 0 trains every weight. Checkpoints hold
            the adapters (sharded), a PEFT adapter directory ``critic/lora_adapter`` (the head among its
            ``modules_to_save``) and, with ``hf_model`` saved, the merged model.
        lora_alpha: the adapters' scale is ``lora_alpha / lora_rank``.
        target_modules: ``all-linear`` (every linear layer but the value head), a list of module-name
            suffixes (``[q_proj, v_proj]``) or one regular expression matched against whole module names.
        tiled_mlp: as the actor's (`TiledMLPConfig`), for the value model.
    """

    path: str | None = II("actor_rollout_ref.model.path")
    tokenizer_path: str | None = II("actor_rollout_ref.model.tokenizer_path")
    trust_remote_code: bool = False
    attn_implementation: str = II("actor_rollout_ref.model.attn_implementation")
    use_remove_padding: bool = II("actor_rollout_ref.model.use_remove_padding")
    use_shared_prompts: bool = II("actor_rollout_ref.model.use_shared_prompts")
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    tiled_mlp: TiledMLPConfig = field(default_factory=TiledMLPConfig)


@dataclass
class CriticConfig:
    """``critic``: the value model, its own parallel layout and its update.

    Attributes:
        config_path: optional YAML whose keys override this group (`apply_critic_config_file`).
        enable: None = a critic iff ``algorithm.adv_estimator`` is gae.
        world_size: ranks of the critic group; None = all ranks of the pool, else <= the actor's.
        cliprange_value: value clipping around the old values (PPO2 value loss).
        ppo_micro_batch_size: verl's deprecated global form of ``ppo_micro_batch_size_per_gpu``
            (`rlflow.config.global_sizes`).
        forward_micro_batch_size: the same for ``forward_micro_batch_size_per_gpu``.
        nccl_timeout: seconds a collective of the critic's process group may wait (default: the actor's).
        checkpoint: what the critic's checkpoints hold (`rlflow.config.checkpoint_schema`).
        profile_ranks / profile_ranks_all / profile_discrete: as the actor's.
        rollout_n: verl's copy of ``actor_rollout_ref.rollout.n`` in the critic's section (the responses
            per prompt its mini-batches are counted in); it must equal it.
    """

    config_path: str | None = None
    enable: bool | None = None
    rollout_n: int = II("actor_rollout_ref.rollout.n")
    strategy: str = "fsdp2"
    world_size: int | None = None
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1.0e-5))
    ppo_mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    ppo_micro_batch_size_per_gpu: int | None = 8
    forward_micro_batch_size_per_gpu: int | None = II("critic.ppo_micro_batch_size_per_gpu")
    ppo_micro_batch_size: int | None = None
    forward_micro_batch_size: int | None = None
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = II("critic.ppo_max_token_len_per_gpu")
    ppo_epochs: int = II("actor_rollout_ref.actor.ppo_epochs")
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    grad_clip: float = 1.0
    cliprange_value: float = 0.5
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    ulysses_sequence_parallel_size: int = 1
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    checkpoint: CheckpointContentsSection = field(default_factory=CheckpointContentsSection)
    nccl_timeout: float = II("actor_rollout_ref.nccl_timeout")
    profile_ranks: list[int] | None = None
    profile_ranks_all: bool = False
    profile_discrete: bool = False


@dataclass
class CustomRewardFunctionConfig(CustomFunctionConfig):
    """``custom_reward_function``: the user's score function, plus ``reward_kwargs`` passed to every call."""

    name: str | None = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class PPOTrainerConfig:
    """The whole PPO trainer config (root of ``ppo_trainer.yaml``)."""

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)


def register_configs() -> None:
    """Register `PPOTrainerConfig` as ``rlflow_ppo_schema`` in Hydra's ConfigStore (idempotent).

    `rlflow.config.load_config` calls it before composing (this module imports without Hydra, so a
    worker-only environment can build typed configs); call it again after something cleared the store.
    """
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=PPOTrainerConfig)
