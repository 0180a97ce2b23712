"""verl keys for features rlflow does not have, accepted at the value that leaves them off.

verl's generated config lists these keys with a default that switches the feature off (an agent loop, a
curriculum sampler, rollout tracing...), and ported command lines often spell that default out.
On the command line (`rlflow.config.aliases.rewrite_overrides`) such a key with its off value is logged
and dropped; any other value is refused, naming the key, what the feature is and what to do instead.
`INERT_ANY` keys only mean something beside a refused switch (``skip_dump_dir`` without
``skip_rollout``), so any value of theirs is dropped. `NULL_IS_UNSET` keys are rlflow's own, which verl's
generated config writes as null where verl fills them in from elsewhere; their null is dropped (rlflow's
default then means what verl's null means).
"""

from __future__ import annotations

import logging
from dataclasses import fields

from rlflow.config.override_syntax import note_once, unquote
from rlflow.config.schema import QATConfig
from rlflow.config.verl_unsupported import QUANTIZED_ADVICE as _QUANTIZED

_QAT_KEYS = tuple(f.name for f in fields(QATConfig))  # verl's QAT section

__all__ = ["DEFAULT_ONLY", "INERT_ANY", "NULL_IS_UNSET", "drop_default_only"]

logger = logging.getLogger(__name__)

_NULL = ("null",)
_FALSE = ("false",)
_AGENT = (
    "verl's agent loop (multi-turn rollouts with tools, served engines) is not supported: rlflow's rollout "
    "is single-turn; drop the key"
)
_SCHEDULE = (
    "verl fills it in with the run's step count; rlflow's learning-rate schedule spans the run's optimizer "
    "steps (trainer.total_training_steps, or total_epochs x batches): drop the key"
)
_TRACE = "verl's rollout tracing (weave / mlflow spans of agent loops) is not supported: drop the key"
_SAMPLER = (
    "custom (curriculum) samplers are not supported: the training prompts are shuffled with data.seed "
    "(data.shuffle); order or subsample the files to steer what a run sees"
)
_DATAGEN = "verl's dynamic data generation is not supported: write the parquet files before the run"

DEFAULT_ONLY: dict[str, tuple[tuple[str, ...], str]] = {
    "actor_rollout_ref.actor.optim.total_training_steps": (("-1",), _SCHEDULE),
    "critic.optim.total_training_steps": (("-1",), _SCHEDULE),
    "actor_rollout_ref.rollout.over_sample_rate": (
        ("0", "0.0"),
        "verl's agent loop samples extra prompts and aborts the slowest; rlflow generates every prompt of the "
        "batch: set 0 or drop the key",
    ),
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": (
        _NULL,
        "the batch sizes verl's vLLM captures CUDA graphs for; rlflow leaves them to vLLM: drop the key",
    ),
    "actor_rollout_ref.rollout.trace.backend": (_NULL, _TRACE),
    "actor_rollout_ref.rollout.trace.token2text": (_FALSE, _TRACE),
    "actor_rollout_ref.rollout.skip_rollout": (
        _FALSE,
        "verl's debugging switch that dumps the first rollouts and replays them; rlflow generates every step "
        "(trainer.rollout_data_dir writes the rollouts out for inspection): drop the key",
    ),
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": (_NULL, _AGENT),
    "actor_rollout_ref.rollout.agent.custom_async_server.path": (_NULL, _AGENT),
    "actor_rollout_ref.rollout.agent.custom_async_server.name": (_NULL, _AGENT),
    "data.sampler.class_path": (_NULL, _SAMPLER),
    "data.sampler.class_name": (_NULL, _SAMPLER),
    "data.datagen.path": (_NULL, _DATAGEN),
    "data.datagen.name": (_NULL, _DATAGEN),
    "reward_model.max_length": (
        _NULL,
        "truncating the reward model's input is not supported: it scores each whole (prompt + response); "
        "drop the key",
    ),
    "reward_model.ulysses_sequence_parallel_size": (
        ("1",),
        "the reward model runs as one full copy per rank (forward only): drop the key",
    ),
    "trainer.esi_redundant_time": (
        ("0",),
        "verl saves a checkpoint before an elastic (ESI) instance expires; rlflow saves every "
        "trainer.save_freq steps: drop the key",
    ),
    "reward.reward_manager.source": (
        ("register",),
        "loading a reward manager class from a file is not supported: register it with "
        "rlflow.reward.register_reward_manager in a module named by actor_rollout_ref.model.external_lib "
        "and set reward.reward_manager.name to its name",
    ),
    "reward.reward_model.enable_resource_pool": (
        _FALSE,
        "the reward model shares the placement group of the other roles (one full copy per rank): drop the key",
    ),
    "reward.compute_score_kwargs": (
        ("{}",),
        "options of the built-in scorers are not read: wrap the scorer (e.g. rlflow.reward.gsm8k.compute_score "
        "with method='flexible') in a custom_reward_function, or pass custom_reward_function.reward_kwargs to "
        "your own",
    ),
    "actor_rollout_ref.rollout.quantization_config_file": (_NULL, _QUANTIZED),
    "actor_rollout_ref.ref.fsdp_config.qat.enable": (
        _FALSE,
        "the reference quantizes its weights as the actor's QAT does (actor_rollout_ref.actor.qat): drop the key",
    ),
    "trainer.v1.trainer_mode": (
        ("sync",),
        "verl's asynchronous trainers (generation of the next batches overlapped with the update, rollouts up "
        "to some steps off-policy) are not supported: rlflow's steps are synchronous, as trainer_mode=sync; "
        "drop the key",
    ),
    **{
        f"actor_rollout_ref.ref.router_replay.{key}": (
            off,
            "only the actor replays routing (actor_rollout_ref.actor.router_replay.mode); the reference "
            "computes its own: drop the key",
        )
        for key, off in (("mode", ("disabled",)), ("record_file", _NULL), ("replay_file", _NULL))
    },
    "trainer.del_local_ckpt_after_load": (
        _FALSE,
        "rlflow keeps the local checkpoint it resumed from: drop the key",
    ),
}
"""verl key -> (its off values, lower-case; why rlflow lacks the feature and what to do)."""

INERT_ANY: dict[str, str] = {
    "actor_rollout_ref.rollout.skip_dump_dir": "it is read only with rollout.skip_rollout=true, which rlflow refuses",
    "actor_rollout_ref.rollout.agent.num_workers": "verl's agent-loop workers; rlflow's rollout runs in the actor's workers",
    "reward.reward_manager.module.path": "it is read only with reward.reward_manager.source=importlib, which rlflow refuses",
    "reward.reward_manager.module.name": "it is read only with reward.reward_manager.source=importlib, which rlflow refuses",
    "reward.reward_model.n_gpus_per_node": "it is read only with reward.reward_model.enable_resource_pool=true, which rlflow refuses",
    "reward.reward_model.nnodes": "it is read only with reward.reward_model.enable_resource_pool=true, which rlflow refuses",
    "data.image_patch_size": (
        "the vision processor's patch size; rlflow's data is text (a row with an image or video column is "
        "refused when the dataset is read)"
    ),
    "trainer.use_v1": (
        "which of verl's two trainer implementations runs (its legacy loop or the one on its transfer queue); "
        "rlflow's trainer is one synchronous loop, computing what both compute in their sync mode"
    ),
    **{
        f"trainer.v1.{key}": "it is read only with an asynchronous trainer.v1.trainer_mode, which rlflow refuses"
        for key in (
            "colocate_async.num_warmup_batches",
            "separate_async.num_warmup_batches",
            "separate_async.parameter_sync_step",
            "separate_async.hybrid_rollout.enable_switch",
            "separate_async.hybrid_rollout.switch_threshold_ratio",
            "separate_async.hybrid_rollout.adaptive_switch_threshold",
        )
    },
    **{
        f"{section}.use_orig_params": (
            "FSDP1's flat parameters (false, verl's default) and its original ones (true) give the same AdamW "
            "updates (rlflow's weight decay is uniform); rlflow's FSDP1 always keeps the original parameters "
            "(LoRA and frozen parameters need them) and FSDP2 has no flat parameters"
        )
        for section in (
            "actor_rollout_ref.actor.fsdp_config",
            "actor_rollout_ref.ref.fsdp_config",
            "critic.fsdp_config",
            "critic.model.fsdp_config",
        )
    },
    **{
        f"actor_rollout_ref.rollout.qat.{name}": (
            "the rollout decodes with the actor's QAT weights (actor_rollout_ref.actor.qat), quantized at each "
            "weight sync; verl's rollout.qat tells its vLLM worker whether to build quantizers itself"
        )
        for name in (*_QAT_KEYS, "bypass_te_fp8_assert")
    },
    **{
        f"actor_rollout_ref.ref.fsdp_config.qat.{name}": (
            "the reference quantizes its weights as the actor's QAT does (actor_rollout_ref.actor.qat)"
        )
        for name in _QAT_KEYS[1:]
    },
    "trainer.ray_wait_register_center_timeout": (
        "how long verl waits for its workers to register; rlflow's worker groups start under their own timeouts"
    ),
}
"""verl key -> why any value of it changes nothing here."""


_LEGACY_RM = (
    "verl's legacy reward-model section, which its reward.reward_model.* replaced (rlflow reads either)"
)
NULL_IS_UNSET: dict[str, str] = {
    "actor_rollout_ref.actor.optim.warmup_style": "the schedule is lr_scheduler_type's (null: constant)",
    "critic.optim.warmup_style": "the schedule is lr_scheduler_type's (null: constant)",
    "data.gen_batch_size": "prompts per generation round default to data.train_batch_size",
    "data.seed": "the sampler's seed defaults to 1, verl's value for a null seed",
    **{
        f"reward_model.{key}": _LEGACY_RM
        for key in (
            "enable",
            "reward_manager",
            "num_workers",
            "model.trust_remote_code",
            *(
                f"{section}.{name}"
                for section in ("rollout", "inference")
                for name in (
                    "name",
                    "gpu_memory_utilization",
                    "tensor_model_parallel_size",
                    "prompt_length",
                    "response_length",
                )
            ),
        )
    },
}
"""verl key -> why its null (verl's "not set here") keeps rlflow's default."""


def _normal(value: str) -> str:
    text = unquote(value).strip().lower()
    return "null" if text in ("none", "~", "") else text


def drop_default_only(key: str, value: str) -> bool:
    """Whether an override of ``key`` to ``value`` is dropped here (logged once): a `DEFAULT_ONLY` key at
    its off value, an `INERT_ANY` key or a `NULL_IS_UNSET` key at null; False for every other key.

    Raises:
        ValueError: a `DEFAULT_ONLY` key at another value, naming the key and what to do.
    """
    if key in INERT_ANY:
        note_once(logger, key, "config key %s=%s changes nothing: %s", key, value, INERT_ANY[key])
        return True
    if key in NULL_IS_UNSET and _normal(value) == "null":
        note_once(logger, key, "config key %s=null keeps rlflow's default: %s", key, NULL_IS_UNSET[key])
        return True
    if key not in DEFAULT_ONLY:
        return False
    off, why = DEFAULT_ONLY[key]
    if _normal(value) not in off:
        raise ValueError(f"{key}={unquote(value)!r}: {why}")
    note_once(logger, key, "config key %s=%s changes nothing: %s", key, value, why)
    return True
