"""Cross-key checks of the PPO trainer config, run by the driver before any Ray actor starts.

`validate_config` raises a ``ValueError`` whose message starts with the offending key path on the first
problem it finds (it never collects, never asserts). The schema (`rlflow.config.schema`) already
rejects unknown keys and wrong types at composition; this module checks what one key cannot say alone:

* names: strategies, loss aggregation, advantage estimator and policy loss (the `core_algos` registries,
  so user-registered ones pass), KL estimators, rollout engine, warm-up style, truncation, resume mode;
* numbers: learning rates, clip ratios, sampling temperature, step counts;
* layout: world size ``trainer.nnodes × trainer.n_gpus_per_node``; the critic's world size; Ulysses sizes
  divide the world sizes and the model's heads; batch divisibility (below);
* the critic: needed iff ``algorithm.adv_estimator`` was registered with ``needs_critic=True`` (gae)
  unless ``critic.enable`` says otherwise;
* files: data files, local model paths, the resume checkpoint, custom reward / advantage functions.

Batch divisibility, per role (actor; critic when there is one), with ``n = actor_rollout_ref.rollout.n``
and ``dp = world size / ulysses_sequence_parallel_size``::

    data.train_batch_size × n          % dp == 0
    ppo_mini_batch_size <= data.train_batch_size, and divides it
    ppo_mini_batch_size × n            % dp == 0
    (ppo_mini_batch_size × n / dp)     % ppo_micro_batch_size_per_gpu == 0   (fixed micro-batches)
    ppo_max_token_len_per_gpu × sp     >= prompt_length + response_length     (dynamic micro-batches)
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlflow.algos.advantages import ADV_ESTIMATOR_INFO, ADV_ESTIMATOR_REGISTRY
from rlflow.algos.losses import AGG_LOSS_MODES
from rlflow.config.checkpoint_checks import check_checkpoint_contents
from rlflow.config.checks import (
    KL_ESTIMATORS,
    at_least,
    choice,
    fixed_micro_size,
    flag,
    in_range,
    kl_name,
    number,
    optional_flag,
    positive,
    value_at,
)
from rlflow.config.correction_checks import check_rollout_correction
from rlflow.config.file_checks import check_data_tokenizer, check_files, check_user_code
from rlflow.config.lora_checks import check_lora
from rlflow.config.loss_checks import check_policy_loss
from rlflow.config.megatron_checks import check_megatron, check_router_replay_settings
from rlflow.config.mtp_schema import check_mtp
from rlflow.config.quantization_checks import check_fp8, check_qat
from rlflow.config.resource_checks import check_local_resources
from rlflow.config.reward_checks import check_filter_groups, check_pf_ppo, check_reward_model
from rlflow.config.rollout_checks import ROLLOUT_NAMES, check_rollout
from rlflow.config.schema import PPOTrainerConfig
from rlflow.config.suggest import schema_keys
from rlflow.config.trainer_checks import check_trainer
from rlflow.config.verl_unsupported import MEGATRON_ADVICE
from rlflow.data.tasks import TASKS
from rlflow.models.loader import ATTN_IMPLEMENTATIONS
from rlflow.utils.dtypes import DTYPES as _DTYPE_TABLE

__all__ = ["KL_ESTIMATORS", "ROLLOUT_NAMES", "need_critic", "need_reference_policy", "validate_config"]

logger = logging.getLogger(__name__)

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"

STRATEGIES = ("fsdp", "fsdp2")
WARMUP_STYLES = ("constant", "cosine")
TRUNCATIONS = ("error", "left", "right", "middle")
KL_CTRL_TYPES = ("fixed", "adaptive")
DTYPES = tuple(_DTYPE_TABLE)
MODEL_DTYPES = ("fp32", "float32", "bf16", "bfloat16")  # fsdp_config.model_dtype (weights and optimizer)

# --------------------------------------------------------------------------- derived facts


def _estimator_needs_critic(name: str) -> bool:
    """Whether the registered estimator ``name`` uses critic values (False for an unknown name)."""
    info = ADV_ESTIMATOR_INFO.get(str(name))
    return bool(info is not None and info.needs_critic)


def need_critic(cfg: Any) -> bool:
    """True when the run has a critic: ``critic.enable`` if set, else whether ``algorithm.adv_estimator``
    was registered as needing one (``register_adv_est(..., needs_critic=True)``, e.g. gae).

    Args:
        cfg: the composed trainer config (a ``DictConfig`` or the typed `PPOTrainerConfig`).
    """
    enable = cfg.critic.enable
    if enable is None:
        return _estimator_needs_critic(cfg.algorithm.adv_estimator)
    return bool(enable)


def need_reference_policy(cfg: Any) -> bool:
    """True when a reference policy is needed: KL in the reward or KL as an actor loss.

    Args:
        cfg: the composed trainer config (a ``DictConfig`` or the typed `PPOTrainerConfig`).
    """
    return bool(cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss)


def update_is_on_policy(cfg: Any) -> bool:
    """True when the actor's update reuses its own forward as the old policy's log-probs: one PPO epoch
    over one mini-batch that holds the whole step (``ppo_mini_batch_size == data.train_batch_size``),
    so every micro-batch's forward runs on the weights that generated the responses and
    ``old_log_probs`` would equal its detached log-probs. The trainer then skips the separate
    ``compute_log_prob`` pass, unless something reads them before the update: the KL penalty in the
    reward (``algorithm.use_kl_in_reward``) or the rollout/trainer comparison
    (``rollout.calculate_log_probs``).

    Args:
        cfg: the composed trainer config (a ``DictConfig`` or the typed `PPOTrainerConfig`).
    """
    actor = cfg.actor_rollout_ref.actor
    if bool(cfg.algorithm.rollout_correction.bypass_mode):
        return False  # the rollout's log-probs are the old policy's (`RayPPOTrainer`)
    return (
        int(actor.ppo_epochs) == 1
        and int(actor.ppo_mini_batch_size) == int(cfg.data.train_batch_size)
        and not bool(cfg.actor_rollout_ref.rollout.calculate_log_probs)
        and not bool(cfg.algorithm.use_kl_in_reward)
    )


def needed_roles(cfg: Any) -> list[str]:
    """The worker groups a run starts, in start order: ``actor`` (with its rollout), then ``ref``,
    ``critic`` and ``reward_model`` when the config needs them.

    Args:
        cfg: the composed trainer config (a ``DictConfig`` or the typed `PPOTrainerConfig`).
    """
    roles = ["actor"]
    if need_reference_policy(cfg):
        roles.append("ref")
    if need_critic(cfg):
        roles.append("critic")
    if cfg.reward_model.enable:
        roles.append("reward_model")
    return roles


def _world_size(cfg: DictConfig) -> int:
    nnodes = at_least(cfg, "trainer.nnodes", 1)
    per_node = at_least(cfg, "trainer.n_gpus_per_node", 1)
    return nnodes * per_node


# --------------------------------------------------------------------------- groups


FREE_FORM_KEYS = schema_keys(PPOTrainerConfig)[1]
"""Mappings whose keys are the user's own (``dict`` fields of the schema, e.g.
``+custom_reward_function.reward_kwargs.k=v``)."""


@functools.cache
def _schema_tree() -> dict:
    """The default config as nested dicts: the key tree of the schema (built once, it is slow)."""
    return OmegaConf.to_container(OmegaConf.structured(PPOTrainerConfig))


def _check_known_keys(tree: dict, schema: dict, prefix: str = "") -> None:
    """Every key of ``tree`` is in ``schema`` (keys appended with Hydra's ``+key=value`` are refused)."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in schema:
            raise ValueError(
                f"{path} is not a config key (appended with '+'?); keys of {prefix or 'the root'}: "
                f"{sorted(schema)}"
            )
        if isinstance(value, dict) and isinstance(schema[key], dict) and path not in FREE_FORM_KEYS:
            _check_known_keys(value, schema[key], path)


def _check_data(cfg: DictConfig) -> None:
    for key in ("max_prompt_length", "max_response_length", "train_batch_size"):
        at_least(cfg, f"data.{key}", 1)
    at_least(cfg, "data.val_batch_size", 1, allow_none=True)
    at_least(cfg, "data.dataloader_num_workers", 0)
    choice(cfg, "data.truncation", TRUNCATIONS)
    if flag(cfg, "data.trust_remote_code") and not flag(cfg, "actor_rollout_ref.model.trust_remote_code"):
        raise ValueError(
            "data.trust_remote_code=true: every worker loads the tokenizer with "
            "actor_rollout_ref.model.trust_remote_code, which is false; set it to true as well"
        )
    if value_at(cfg, "data.train_files") is None or value_at(cfg, "data.val_files") is None:
        choice(cfg, "data.task", tuple(TASKS))
    check_data_tokenizer(cfg)


def _check_algorithm(cfg: DictConfig) -> None:
    estimator = choice(cfg, "algorithm.adv_estimator", tuple(ADV_ESTIMATOR_REGISTRY))
    if estimator == "grpo_passk" and int(value_at(cfg, "actor_rollout_ref.rollout.n")) < 2:
        raise ValueError(
            "algorithm.adv_estimator=grpo_passk needs actor_rollout_ref.rollout.n >= 2: each prompt's best "
            "response learns from its margin over the second best"
        )
    in_range(cfg, "algorithm.gamma", 0.0, 1.0)
    in_range(cfg, "algorithm.lam", 0.0, 1.0)
    flag(cfg, "algorithm.use_kl_in_reward")
    kl_name(cfg, "algorithm.kl_penalty")
    kind = choice(cfg, "algorithm.kl_ctrl.type", KL_CTRL_TYPES)
    at_least(cfg, "algorithm.kl_ctrl.kl_coef", 0.0, integer=False)
    if kind == "adaptive":
        positive(cfg, "algorithm.kl_ctrl.target_kl")
        positive(cfg, "algorithm.kl_ctrl.horizon")


def _check_optim(cfg: DictConfig, prefix: str) -> None:
    positive(cfg, f"{prefix}.lr")
    at_least(cfg, f"{prefix}.lr_warmup_steps", -1)
    in_range(cfg, f"{prefix}.lr_warmup_steps_ratio", 0.0, 1.0)
    style = choice(cfg, f"{prefix}.warmup_style", WARMUP_STYLES)
    kind = value_at(cfg, f"{prefix}.lr_scheduler_type")
    if kind is not None:
        choice(cfg, f"{prefix}.lr_scheduler_type", WARMUP_STYLES)
        if kind != style and value_at(cfg, f"{prefix}.warmup_style") != "constant":
            raise ValueError(
                f"{prefix}.lr_scheduler_type={kind!r} and {prefix}.warmup_style={style!r} disagree; set only "
                "lr_scheduler_type"
            )
    positive(cfg, f"{prefix}.num_cycles")
    in_range(cfg, f"{prefix}.min_lr_ratio", 0.0, 1.0)
    at_least(cfg, f"{prefix}.weight_decay", 0.0, integer=False)
    positive(cfg, f"{prefix}.eps")
    betas = value_at(cfg, f"{prefix}.betas")
    if len(betas) != 2:
        raise ValueError(f"{prefix}.betas={list(betas)!r} must hold two numbers")
    for i in range(2):
        in_range(cfg, f"{prefix}.betas[{i}]", 0.0, 1.0, high_open=True)


def _check_fsdp(cfg: DictConfig, prefix: str) -> None:
    if flag(cfg, f"{prefix}.grad_offload") and not flag(cfg, f"{prefix}.param_offload"):
        raise ValueError(
            f"{prefix}.grad_offload=true without {prefix}.param_offload: rlflow keeps gradients with their "
            f"parameter shards, so they live in host memory exactly when the weights do; set "
            f"{prefix}.param_offload=true too, or grad_offload=false"
        )
    _check_sharding(cfg, prefix)
    for name in ("param_dtype", "reduce_dtype", "buffer_dtype"):
        choice(cfg, f"{prefix}.mixed_precision.{name}", DTYPES)


def _check_sharding(cfg: DictConfig, prefix: str) -> None:
    """``fsdp_size``, ``model_dtype`` and ``wrap_policy`` of an ``fsdp_config`` section (``prefix``)."""
    size = number(cfg, f"{prefix}.fsdp_size", integer=True)
    if size != -1 and size < 1:
        raise ValueError(f"{prefix}.fsdp_size={size} must be -1 (all ranks of the role) or >= 1")
    if flag(cfg, f"{prefix}.offload_policy") and not flag(cfg, f"{prefix}.param_offload"):
        raise ValueError(
            f"{prefix}.offload_policy=true without {prefix}.param_offload=true: rlflow's offload switch is "
            "param_offload (with fsdp2 it is FSDP2's CPUOffloadPolicy, what offload_policy asks for); set it "
            "too, as verl's scripts do, or drop offload_policy"
        )
    dtype = value_at(cfg, f"{prefix}.model_dtype")
    if dtype not in MODEL_DTYPES:
        raise ValueError(
            f"{prefix}.model_dtype={dtype!r}: the weights the role keeps (and its optimizer updates) are "
            f"one of {list(MODEL_DTYPES)}; fp16 weights need loss scaling, which rlflow does not do: keep "
            f"fp32 (or bf16) and set {prefix}.mixed_precision.param_dtype to compute in a lower precision"
        )
    role = prefix.removesuffix(".fsdp_config")
    if dtype in ("bf16", "bfloat16") and role != REF:  # the reference is never updated
        lr = float(value_at(cfg, f"{role}.optim.lr"))
        logger.warning(
            "%s.model_dtype=%s: the weights are updated in bf16 (8 significant bits): an Adam step of about "
            "lr=%g changes only weights smaller than about %.1g and rounds away the rest; keep fp32 weights "
            "(mixed_precision.param_dtype=bf16 computes in bf16) unless memory forbids them",
            prefix,
            dtype,
            lr,
            256 * lr,
        )
    if value_at(cfg, f"{prefix}.wrap_policy.min_num_params") != 0:
        raise ValueError(
            f"{prefix}.wrap_policy.min_num_params={value_at(cfg, f'{prefix}.wrap_policy.min_num_params')}: "
            "rlflow makes every decoder layer one FSDP unit (size-based wrapping is not supported); keep 0"
        )
    layers = value_at(cfg, f"{prefix}.wrap_policy.transformer_layer_cls_to_wrap")
    if layers is not None and (
        not isinstance(layers, list | ListConfig) or not all(isinstance(n, str) for n in layers)
    ):
        raise ValueError(
            f"{prefix}.wrap_policy.transformer_layer_cls_to_wrap={layers!r} must be a list of names"
        )


def _check_model(cfg: DictConfig, prefix: str) -> None:
    choice(
        cfg,
        f"{prefix}.attn_implementation",
        tuple(ATTN_IMPLEMENTATIONS),
    )
    flag(cfg, f"{prefix}.use_remove_padding")
    flag(cfg, f"{prefix}.use_shared_prompts")
    flag(cfg, f"{prefix}.tiled_mlp.enabled")
    at_least(cfg, f"{prefix}.tiled_mlp.num_shards", 1)


FUSED_KERNEL_BACKENDS = ("torch",)
"""``actor_rollout_ref.model.fused_kernel_options.impl_backend`` values (`rlflow.models.fused_head`)."""


def _strategy(cfg: DictConfig, key: str) -> str:
    """A role's ``strategy``, one of `STRATEGIES`; verl's ``megatron`` is refused with what to do."""
    if value_at(cfg, key) == "megatron":
        raise ValueError(f"{key}=megatron: {MEGATRON_ADVICE}")
    return choice(cfg, key, STRATEGIES)


def _check_fused_kernels(cfg: DictConfig) -> None:
    flag(cfg, f"{MODEL}.use_fused_kernels")
    backend = value_at(cfg, f"{MODEL}.fused_kernel_options.impl_backend")
    if backend not in FUSED_KERNEL_BACKENDS:
        raise ValueError(
            f"{MODEL}.fused_kernel_options.impl_backend={backend!r}: rlflow's fused LM head is the chunked "
            f"PyTorch one ({list(FUSED_KERNEL_BACKENDS)}; verl's triton kernel is not built): set it to torch "
            "(same numbers, the same memory bound: one chunk of logits)"
        )


def _check_actor(cfg: DictConfig) -> None:
    if not flag(cfg, "actor_rollout_ref.hybrid_engine"):
        raise ValueError(
            "actor_rollout_ref.hybrid_engine=false: rlflow's rollout engine always lives in the actor's workers "
            "and generates with the actor's weights (verl's hybrid engine); a separate rollout group is not "
            "supported — drop the key"
        )
    positive(cfg, "actor_rollout_ref.nccl_timeout")
    check_checkpoint_contents(cfg, f"{ACTOR}.checkpoint")
    check_router_replay_settings(cfg)
    _check_model(cfg, MODEL)
    _check_fused_kernels(cfg)
    _strategy(cfg, f"{ACTOR}.strategy")
    if value_at(cfg, "actor_rollout_ref.ref.strategy") != value_at(cfg, f"{ACTOR}.strategy"):
        raise ValueError(
            f"actor_rollout_ref.ref.strategy={value_at(cfg, 'actor_rollout_ref.ref.strategy')!r}: the reference "
            f"shards like the actor ({ACTOR}.strategy={value_at(cfg, f'{ACTOR}.strategy')!r}) so that reference "
            "and old log-probs differ only by the weights; set it to the actor's or drop it"
        )
    choice(
        cfg,
        f"{ACTOR}.loss_agg_mode",
        AGG_LOSS_MODES,
    )
    check_policy_loss(cfg)
    if flag(cfg, f"{ACTOR}.use_kl_loss"):
        kl_name(cfg, f"{ACTOR}.kl_loss_type")
        at_least(cfg, f"{ACTOR}.kl_loss_coef", 0.0, integer=False)
    number(cfg, f"{ACTOR}.entropy_coeff")
    clip = positive(cfg, f"{ACTOR}.clip_ratio")
    low = positive(cfg, f"{ACTOR}.clip_ratio_low", allow_none=True)
    cispo = value_at(cfg, f"{ACTOR}.policy_loss.loss_mode") == "cispo"  # >= 1: no lower bound on its weight
    if (clip if low is None else low) >= 1 and not cispo:
        key = f"{ACTOR}.clip_ratio" if low is None else f"{ACTOR}.clip_ratio_low"
        raise ValueError(
            f"{key}={clip if low is None else low!r} must be < 1 (the ratio is clipped at 1 - it; with "
            "policy_loss.loss_mode=cispo a value >= 1 leaves its weight without a lower bound)"
        )
    positive(cfg, f"{ACTOR}.clip_ratio_high", allow_none=True)
    clip_c = number(cfg, f"{ACTOR}.clip_ratio_c")
    if not clip_c > 1:
        raise ValueError(f"{ACTOR}.clip_ratio_c={clip_c!r} must be > 1 (dual-clip bound)")
    positive(cfg, f"{ACTOR}.grad_clip")
    cap = number(cfg, f"{ACTOR}.tis_imp_ratio_cap")
    if cap != -1 and not cap > 0:
        raise ValueError(f"{ACTOR}.tis_imp_ratio_cap={cap!r} must be -1 (off) or > 0")
    if cap > 0 and not value_at(cfg, f"{ROLLOUT}.calculate_log_probs"):
        raise ValueError(
            f"{ACTOR}.tis_imp_ratio_cap={cap!r} needs the rollout's log-probs: set {ROLLOUT}.calculate_log_probs=true"
        )
    at_least(cfg, f"{ACTOR}.ppo_epochs", 1)
    _check_optim(cfg, f"{ACTOR}.optim")
    _check_fsdp(cfg, f"{ACTOR}.fsdp_config")
    _check_sharding(cfg, "actor_rollout_ref.ref.fsdp_config")


def _check_critic(cfg: DictConfig) -> None:
    enable = optional_flag(cfg, "critic.enable", "a critic exactly when the estimator needs one")
    estimator = value_at(cfg, "algorithm.adv_estimator")
    if enable is False and _estimator_needs_critic(estimator):
        raise ValueError(
            f"critic.enable=false but algorithm.adv_estimator={estimator} needs a critic (its values); "
            "set critic.enable=null or true, or choose an estimator without a critic (e.g. grpo)"
        )
    if not need_critic(cfg):
        if value_at(cfg, "trainer.critic_warmup") > 0:
            raise ValueError(f"trainer.critic_warmup={value_at(cfg, 'trainer.critic_warmup')} needs a critic")
        return
    _check_model(cfg, "critic.model")
    rollout_n, n = value_at(cfg, "critic.rollout_n"), value_at(cfg, "actor_rollout_ref.rollout.n")
    if rollout_n != n:
        raise ValueError(
            f"critic.rollout_n={rollout_n} must equal actor_rollout_ref.rollout.n={n} (verl's copy of it, the "
            "responses per prompt the critic's mini-batches count); drop the key or set both"
        )
    _strategy(cfg, "critic.strategy")
    choice(
        cfg,
        "critic.loss_agg_mode",
        AGG_LOSS_MODES,
    )
    positive(cfg, "critic.cliprange_value")
    positive(cfg, "critic.grad_clip")
    positive(cfg, "critic.nccl_timeout")
    check_checkpoint_contents(cfg, "critic.checkpoint")
    at_least(cfg, "critic.ppo_epochs", 1)
    _check_optim(cfg, "critic.optim")
    _check_fsdp(cfg, "critic.fsdp_config")


# --------------------------------------------------------------------------- layout and batch sizes


def _check_sp(cfg: DictConfig, prefix: str, world: int, heads: int | None, kv_heads: int | None) -> int:
    """Check ``prefix.ulysses_sequence_parallel_size`` against the role's world size and the heads."""
    key = f"{prefix}.ulysses_sequence_parallel_size"
    sp = at_least(cfg, key, 1)
    if world % sp:
        raise ValueError(f"{key}={sp} must divide the world size {world} of {prefix}")
    if heads is not None and heads % sp:
        raise ValueError(f"{key}={sp} must divide the model's num_attention_heads={heads}")
    if kv_heads is not None and kv_heads % sp and sp % kv_heads:
        raise ValueError(
            f"{key}={sp} must divide the model's num_key_value_heads={kv_heads} or be a multiple of it"
        )
    return sp


def _check_fsdp_size(cfg: DictConfig, prefix: str, world: int) -> None:
    size = value_at(cfg, f"{prefix}.fsdp_config.fsdp_size")
    if size != -1 and world % size:
        raise ValueError(
            f"{prefix}.fsdp_config.fsdp_size={size} must divide the world size {world} of {prefix}"
        )


def _check_token_budget(cfg: DictConfig, key: str, sp: int) -> None:
    """With dynamic batching one micro-batch (``budget × sp`` tokens) must hold the longest sequence."""
    budget = at_least(cfg, key, 1)
    longest = value_at(cfg, f"{ROLLOUT}.prompt_length") + value_at(cfg, f"{ROLLOUT}.response_length")
    if budget * sp < longest:
        raise ValueError(
            f"{key}={budget} (× ulysses size {sp}) must be >= the longest sequence, {ROLLOUT}.prompt_length "
            f"+ response_length = {longest}"
        )


def _check_micro(cfg: DictConfig, dynamic_key: str, micro_key: str, budget_key: str, sp: int) -> None:
    """A micro-batch size >= 1 (fixed batching) or a token budget that fits a sequence (dynamic)."""
    if flag(cfg, dynamic_key):
        _check_token_budget(cfg, budget_key, sp)
    else:
        fixed_micro_size(cfg, micro_key, dynamic_key)


def _check_ppo_batches(cfg: DictConfig, prefix: str, dp: int, sp: int) -> None:
    """Divisibility of the train, mini- and micro-batches of one role with data-parallel size ``dp``."""
    train = value_at(cfg, "data.train_batch_size")
    n = value_at(cfg, f"{ROLLOUT}.n")
    if (train * n) % dp:
        raise ValueError(
            f"data.train_batch_size={train} × {ROLLOUT}.n={n} = {train * n} responses must be divisible by "
            f"the data-parallel size {dp} of {prefix} (world size / ulysses_sequence_parallel_size)"
        )
    key = f"{prefix}.ppo_mini_batch_size"
    mini = at_least(cfg, key, 1)
    if mini > train or train % mini:
        raise ValueError(f"{key}={mini} must be <= data.train_batch_size={train} and divide it")
    if (mini * n) % dp:
        raise ValueError(
            f"{key}={mini} × {ROLLOUT}.n={n} = {mini * n} responses must be divisible by the data-parallel "
            f"size {dp} of {prefix} (world size / ulysses_sequence_parallel_size)"
        )
    if flag(cfg, f"{prefix}.use_dynamic_bsz"):
        _check_token_budget(cfg, f"{prefix}.ppo_max_token_len_per_gpu", sp)
        return
    micro_key = f"{prefix}.ppo_micro_batch_size_per_gpu"
    micro = fixed_micro_size(cfg, micro_key, f"{prefix}.use_dynamic_bsz")
    per_rank = mini * n // dp
    if micro < per_rank and per_rank % micro:  # a larger micro-batch just holds the whole mini-batch
        raise ValueError(
            f"{micro_key}={micro} must divide the {per_rank} responses each rank of {prefix} gets per "
            f"mini-batch ({key}={mini} × {ROLLOUT}.n={n} / data-parallel size {dp})"
        )


def _check_ref_sync(cfg: DictConfig) -> None:
    """``ref.sync_ref_model``: a reference that exists, a period and a mixing weight."""
    if not flag(cfg, f"{REF}.sync_ref_model"):
        return
    if not need_reference_policy(cfg):
        raise ValueError(
            f"{REF}.sync_ref_model=true but this run has no reference policy (neither "
            f"{ACTOR}.use_kl_loss nor algorithm.use_kl_in_reward is on): there is nothing to sync"
        )
    at_least(cfg, f"{REF}.ref_model_sync_steps", 1)
    alpha = number(cfg, f"{REF}.ref_model_mixup_alpha")
    if not 0 < alpha <= 1:
        raise ValueError(f"{REF}.ref_model_mixup_alpha={alpha!r} must be in (0, 1]")


def _check_layout(cfg: DictConfig, heads: int | None, kv_heads: int | None) -> None:
    world = _world_size(cfg)
    sp = _check_sp(cfg, ACTOR, world, heads, kv_heads)
    _check_fsdp_size(cfg, ACTOR, world)
    _check_fsdp_size(cfg, "actor_rollout_ref.ref", world)
    check_megatron(cfg, ACTOR, world, sp)
    _check_ppo_batches(cfg, ACTOR, world // sp, sp)
    for prefix in (ROLLOUT, REF):
        _check_micro(
            cfg,
            f"{prefix}.log_prob_use_dynamic_bsz",
            f"{prefix}.log_prob_micro_batch_size_per_gpu",
            f"{prefix}.log_prob_max_token_len_per_gpu",
            sp,
        )
    if need_reference_policy(cfg):
        check_megatron(cfg, REF, world, _check_sp(cfg, REF, world, heads, kv_heads))
    _check_ref_sync(cfg)
    if not need_critic(cfg):
        return
    critic_world = at_least(cfg, "critic.world_size", 1, allow_none=True) or world
    if critic_world > world:
        raise ValueError(
            f"critic.world_size={critic_world} must be <= the actor world size {world} "
            "(trainer.nnodes × trainer.n_gpus_per_node)"
        )
    critic_sp = _check_sp(cfg, "critic", critic_world, heads, kv_heads)
    _check_fsdp_size(cfg, "critic", critic_world)
    check_megatron(cfg, "critic", critic_world, critic_sp)
    _check_ppo_batches(cfg, "critic", critic_world // critic_sp, critic_sp)
    _check_micro(
        cfg,
        "critic.use_dynamic_bsz",
        "critic.forward_micro_batch_size_per_gpu",
        "critic.forward_max_token_len_per_gpu",
        critic_sp,
    )


# --------------------------------------------------------------------------- entry point


def validate_config(
    cfg: DictConfig | Any, *, num_attention_heads: int | None = None, num_key_value_heads: int | None = None
) -> None:
    """Check the trainer config; raise ``ValueError`` naming the key path of the first problem.

    Cheap checks come first (unknown keys, names and numbers, then layout and batch divisibility), then the file
    system and the import of custom functions. See the module docstring for the rules.

    Args:
        cfg: the composed config (`rlflow.config.loading.load_config` or ``@hydra.main``), after
            `rlflow.config.loading.apply_critic_config_file`; a ``PPOTrainerConfig`` or a plain dict
            also works.
        num_attention_heads: the model's query heads; when given, every Ulysses size (actor, ref,
            critic) must divide it.
        num_key_value_heads: the model's key/value heads; when given, every Ulysses size must divide it
            or be a multiple of it.

    Raises:
        ValueError: the message starts with the key path, e.g. ``critic.ppo_micro_batch_size_per_gpu=3
            must divide the 8 responses each rank of critic gets per mini-batch ...``.
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg) if not isinstance(cfg, dict) else OmegaConf.create(cfg)
    _check_known_keys(OmegaConf.to_container(cfg), _schema_tree())
    check_trainer(cfg)
    _check_data(cfg)
    _check_algorithm(cfg)
    _check_actor(cfg)
    check_lora(cfg)
    check_rollout(cfg)
    check_fp8(cfg)
    check_qat(cfg)
    check_mtp(cfg)
    _check_critic(cfg)
    check_reward_model(cfg)
    check_filter_groups(cfg)
    check_pf_ppo(cfg)
    check_rollout_correction(cfg)
    _check_layout(cfg, num_attention_heads, num_key_value_heads)
    check_files(cfg, critic=need_critic(cfg))
    check_user_code(cfg)
    check_local_resources(cfg)
