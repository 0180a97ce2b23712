"""The sections every trained role shares: its optimizer (``*.optim``), its sharding (``*.fsdp_config``) and
its model's tiled MLP (``*.model.tiled_mlp``).

Re-exported by `rlflow.config.schema` (where the roles' sections use them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "FSDPConfig",
    "Fp8Section",
    "MegatronConfig",
    "MixedPrecisionSection",
    "OptimConfig",
    "TiledMLPConfig",
    "WrapPolicySection",
]


@dataclass
class OptimConfig:
    """``*.optim``: AdamW with linear warm-up then a constant or cosine schedule (`rlflow.engine.optim`).

    Attributes:
        lr: peak learning rate.
        lr_warmup_steps: warm-up steps; -1 uses ``lr_warmup_steps_ratio * total_training_steps``.
        lr_warmup_steps_ratio: warm-up length as a fraction of the run's optimizer steps.
        warmup_style: constant | cosine (cosine decays to ``min_lr_ratio * lr``); verl's older name of
            ``lr_scheduler_type``.
        lr_scheduler_type: constant | cosine; null = ``warmup_style``.
        min_lr_ratio: floor of the cosine schedule, as a fraction of ``lr``.
        num_cycles: cosine cycles over the post-warm-up steps (0.5 = one half cosine down to the floor).
        weight_decay: decoupled weight decay (AdamW).
        betas: AdamW ``[beta1, beta2]``.
        eps: AdamW epsilon.
    """

    lr: float = 1.0e-6
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    warmup_style: str = "constant"
    lr_scheduler_type: str | None = None
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1.0e-8

    @property
    def scheduler_type(self) -> str:
        """The schedule in effect: ``lr_scheduler_type``, else ``warmup_style``."""
        return self.lr_scheduler_type or self.warmup_style


@dataclass
class MixedPrecisionSection:
    """``*.fsdp_config.mixed_precision``: dtypes FSDP computes, reduces and keeps buffers in
    (`rlflow.parallel.fsdp.mixed_precision_dtypes`). ``param_dtype: bf16`` with ``reduce_dtype: fp32``
    is the usual GPU recipe, and the fast one on CPUs with bf16 dot products (AVX512-BF16, AMX:
    docs/benchmarks.md); all fp32 (the default) is exact.

    Attributes:
        param_dtype: compute dtype of the gathered parameters: fp32 | bf16 | fp16 (or float32, ...).
        reduce_dtype: dtype of the gradient reduce-scatter / all-reduce.
        buffer_dtype: dtype of module buffers; FSDP1 only (an addition to verl's keys).
    """

    param_dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    buffer_dtype: str = "fp32"


@dataclass
class Fp8Section:
    """``*.fsdp_config.fp8``: the linear layers of the role's decoder layers (experts included) with FP8
    numerics, Transformer Engine's recipes emulated (`rlflow.models.fp8`: each GEMM operand on its FP8
    grid, FP32 products; slower than the plain dtype, not faster). The embeddings, the heads, the routers
    and the attention products keep the compute dtype.

    Attributes:
        format: None (off) | ``e4m3`` | ``hybrid`` (E4M3 forward operands, E5M2 gradients).
        recipe: ``tensorwise`` (one current scale per tensor) | ``blockwise`` (128 x 128 weight blocks,
            1 x 128 activation and gradient blocks) | ``mxfp8`` (1 x 32 blocks, power-of-two scales).
    """

    format: str | None = None
    recipe: str = "blockwise"


@dataclass
class WrapPolicySection:
    """``*.fsdp_config.wrap_policy`` (verl's keys): rlflow makes every decoder layer one FSDP unit and
    the root one more (`rlflow.parallel.fsdp.apply_fsdp`).

    Attributes:
        min_num_params: verl's size-based wrapping; 0 only (the layer-based units).
        transformer_layer_cls_to_wrap: class names of the layers to wrap; None = the model's decoder
            layers; when given, they must be those (checked when the model is built, naming the key).
    """

    min_num_params: int = 0
    transformer_layer_cls_to_wrap: list[str] | None = None


@dataclass
class FSDPConfig:
    """``*.fsdp_config``: how one role is sharded (`rlflow.parallel.fsdp.apply_fsdp`).

    Attributes:
        fsdp_size: ranks one parameter is sharded over; -1 = the whole role; smaller = hybrid (HSDP).
        reshard_after_forward: free gathered weights after forward (ZeRO-3) or keep them (ZeRO-2).
        forward_prefetch: gather the next decoder layer's weights as a layer starts its forward
            (overlaps communication with compute; one more layer's weights held).
        grad_offload: older verl's gradient offload; gradients stay with their shards (false; true refused).
        offload_policy: verl's FSDP2 offload switch; true only together with ``param_offload``, rlflow's
            switch, which with fsdp2 is FSDP2's ``CPUOffloadPolicy``.
        model_dtype: dtype of the weights the role keeps and its optimizer updates: fp32 (default) or
            bf16 (verl's key: halves the weights' and the optimizer state's memory, bf16 updates);
            ``mixed_precision.param_dtype`` sets the compute dtype.
        wrap_policy: the FSDP units (`WrapPolicySection`).
        fp8: FP8 numerics in the decoder layers (`Fp8Section`).
    """

    fsdp_size: int = -1
    param_offload: bool = False
    optimizer_offload: bool = False
    grad_offload: bool = False
    reshard_after_forward: bool = True
    forward_prefetch: bool = False
    offload_policy: bool = False
    model_dtype: str = "fp32"
    wrap_policy: WrapPolicySection = field(default_factory=WrapPolicySection)
    mixed_precision: MixedPrecisionSection = field(default_factory=MixedPrecisionSection)
    fp8: Fp8Section = field(default_factory=Fp8Section)


@dataclass
class MegatronConfig:
    """``*.megatron``: verl's Megatron-LM layout of a role, for ported Megatron scripts; the role runs on
    FSDP2 (`rlflow.config.megatron_layout` reads ``strategy=megatron`` and the other Megatron keys onto
    rlflow's). The sizes are checked as Megatron checks them and logged; FSDP2 shards every weight over all
    the role's ranks, which holds at most what one rank of this layout holds.

    Attributes:
        tensor_model_parallel_size: Megatron's TP; TP x PP x (Ulysses SP) must divide the role's ranks.
        pipeline_model_parallel_size: Megatron's PP.
        virtual_pipeline_model_parallel_size: interleaved pipeline stages per rank (null or >= 1; needs PP > 1).
        expert_model_parallel_size: Megatron's EP; PP x EP x ETP must divide the role's ranks.
        expert_tensor_parallel_size: Megatron's ETP (null = TP's).
        use_dist_checkpointing: verl starts from a Megatron checkpoint converted from the Hugging Face one;
            rlflow starts from ``model.path`` (those same weights) and needs ``dist_checkpointing_path`` set,
            as verl does.
        dist_checkpointing_path: that converted checkpoint (logged, not read).
    """

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: str | None = None


@dataclass
class TiledMLPConfig:
    """``model.tiled_mlp`` (actor, critic, SFT): each decoder layer's MLP over the tokens in pieces
    (`rlflow.models.tiled_mlp`).

    Attributes:
        enabled: run the MLP in ``num_shards`` pieces, each under activation checkpointing: its
            ``tokens x intermediate_size`` activations exist for one piece at a time, for one more MLP
            forward per training step. The same outputs and gradients up to float rounding. Dense MLP
            blocks only (mixture-of-experts blocks are refused).
        num_shards: pieces per forward (>= 1).
    """

    enabled: bool = False
    num_shards: int = 4
