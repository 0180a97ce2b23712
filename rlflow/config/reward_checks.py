"""Checks of ``reward_model`` and of the batch selections by reward, ``algorithm.filter_groups`` and
``algorithm.pf_ppo`` (part of `rlflow.config.validate.validate_config`)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlflow.algos.pf_ppo import PF_PPO_METHODS
from rlflow.config.checks import at_least, fixed_micro_size, flag, number, positive, value_at
from rlflow.reward.dapo import OverlongBuffer
from rlflow.reward.registry import (
    BUILTIN_REWARD_MANAGERS,
    check_reward_manager_kwargs,
    get_reward_manager_cls,
)

__all__ = ["FILTER_METRICS", "check_filter_groups", "check_pf_ppo", "check_reward_model", "reward_kwargs"]

FILTER_METRICS = ("seq_reward", "seq_final_reward")
"""``algorithm.filter_groups.metric`` values computed from the rewards; any other name is read from the
score function's extra info (``acc``, ``score``, ...), checked at the first step."""


def reward_kwargs(cfg: DictConfig) -> dict:
    """``reward_model.reward_kwargs`` as a plain dict."""
    value = value_at(cfg, "reward_model.reward_kwargs")
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else dict(value or {})


def check_reward_model(cfg: DictConfig) -> None:
    """The reward manager, its keyword arguments, the scoring pool and the reward model."""
    manager = value_at(cfg, "reward_model.reward_manager")
    kwargs = reward_kwargs(cfg)
    if manager == "dapo":
        OverlongBuffer.from_reward_kwargs(kwargs, int(value_at(cfg, "data.max_response_length")))
    elif manager in ("naive", "prime"):
        if kwargs:
            raise ValueError(
                f"reward_model.reward_kwargs={kwargs}: the {manager} reward manager takes no keyword arguments "
                "(keyword arguments of the score function go to custom_reward_function.reward_kwargs; the "
                "overlong buffer needs reward_model.reward_manager=dapo)"
            )
    else:
        cls = get_reward_manager_cls(str(manager))  # a user-registered one (external_lib), or an error
        check_reward_manager_kwargs(str(manager), cls, kwargs)
        for key in ("reward_model.num_workers", "reward_model.timeout_s"):
            if value_at(cfg, key):
                raise ValueError(
                    f"{key}={value_at(cfg, key)!r} with reward_model.reward_manager={manager!r}: the scoring "
                    f"pool belongs to the built-in managers {list(BUILTIN_REWARD_MANAGERS)}; a registered manager "
                    "scores in its own way"
                )
    if flag(cfg, "reward_model.launch_reward_fn_async"):
        raise ValueError(
            "reward_model.launch_reward_fn_async=true is not supported; use reward_model.num_workers for a "
            "process pool instead"
        )
    at_least(cfg, "reward_model.num_workers", 0)
    positive(cfg, "reward_model.timeout_s", allow_none=True)
    number(cfg, "reward_model.timeout_score")
    _check_sandbox(cfg)
    _check_inference(cfg)
    if not flag(cfg, "reward_model.enable"):
        return
    if value_at(cfg, "reward_model.model.path") is None:
        raise ValueError("reward_model.model.path must be set when reward_model.enable=true")
    if value_at(cfg, "reward_model.model.input_tokenizer") is not None and not flag(
        cfg, "data.return_raw_chat"
    ):
        raise ValueError(
            "reward_model.model.input_tokenizer is set (the reward model re-tokenizes each conversation with its "
            "own chat template): it needs the prompts' chat messages, set data.return_raw_chat=true"
        )
    if not flag(cfg, "reward_model.use_dynamic_bsz"):
        fixed_micro_size(cfg, "reward_model.micro_batch_size_per_gpu", "reward_model.use_dynamic_bsz")
        return
    key = "reward_model.forward_max_token_len_per_gpu"
    budget = at_least(cfg, key, 1)
    longest = value_at(cfg, "reward_model.inference.prompt_length") + value_at(
        cfg, "reward_model.inference.response_length"
    )
    if budget < longest:
        raise ValueError(
            f"{key}={budget} must be >= the longest sequence the reward model scores, "
            f"reward_model.inference.prompt_length + response_length = {longest}"
        )


def _check_sandbox(cfg: DictConfig) -> None:
    """``reward_model.sandbox_fusion``: an http(s) URL for the default scorer, positive limits."""
    key = "reward_model.sandbox_fusion"
    at_least(cfg, f"{key}.max_concurrent", 1)
    at_least(cfg, f"{key}.memory_limit_mb", 1)
    url = value_at(cfg, f"{key}.url")
    if url is None:
        return
    if not str(url).startswith(("http://", "https://")):
        raise ValueError(f"{key}.url={url!r} must be an http:// or https:// URL (the run_code endpoint)")
    if value_at(cfg, "custom_reward_function.path"):
        raise ValueError(
            f"{key}.url with custom_reward_function.path: the sandbox runs the default scorer's code tasks; a "
            "custom score function calls its sandbox itself (rlflow.reward.sandbox_fusion.score_code); drop one"
        )


def _check_inference(cfg: DictConfig) -> None:
    """``reward_model.inference``: the engine rlflow has, and input limits that cover the data's."""
    prefix = "reward_model.inference"
    name = value_at(cfg, f"{prefix}.name")
    if name != "hf":
        raise ValueError(
            f"{prefix}.name={name!r}: rlflow scores with the reward model's sequence-classification forward in "
            f"its own worker group, not a served engine; set {prefix}.name=hf (batching: "
            "reward_model.micro_batch_size_per_gpu)"
        )
    tp = at_least(cfg, f"{prefix}.tensor_model_parallel_size", 1)
    if tp != 1:
        raise ValueError(
            f"{prefix}.tensor_model_parallel_size={tp}: every rank of the reward-model group holds the whole "
            "model and scores its share of the batch; set it to 1"
        )
    fraction = number(cfg, f"{prefix}.gpu_memory_utilization")
    if not 0 < fraction <= 1:
        raise ValueError(f"{prefix}.gpu_memory_utilization={fraction!r} must be in (0, 1]")
    for side in ("prompt", "response"):
        limit = at_least(cfg, f"{prefix}.{side}_length", 1)
        data = value_at(cfg, f"data.max_{side}_length")
        if limit < data:
            raise ValueError(
                f"{prefix}.{side}_length={limit} is shorter than data.max_{side}_length={data}: the reward "
                f"model scores the policy's {side}s as they are; raise it (or leave it unset to follow the data)"
            )


def check_filter_groups(cfg: DictConfig) -> None:
    """DAPO's dynamic sampling and ``data.gen_batch_size``."""
    prefix = "algorithm.filter_groups"
    gen = at_least(cfg, "data.gen_batch_size", 1)
    train = int(value_at(cfg, "data.train_batch_size"))
    if not flag(cfg, f"{prefix}.enable"):
        if gen != train:
            raise ValueError(
                f"data.gen_batch_size={gen} differs from data.train_batch_size={train} with {prefix}.enable="
                f"false: rounds of a size other than the step's are for dynamic sampling ({prefix}.enable=true); "
                "the trainer (prepare_config) reads this config as verl does, every step training on all "
                "data.gen_batch_size prompts (rlflow.config.global_sizes.step_size_from_gen_batch_size)"
            )
        return
    metric = value_at(cfg, f"{prefix}.metric")
    if not metric:
        raise ValueError(
            f"{prefix}.metric must be set when {prefix}.enable=true: a key of the score function's "
            f"extra info (acc, score, ...) or one of {list(FILTER_METRICS)}"
        )
    int(value_at(cfg, f"{prefix}.max_num_gen_batches"))
    if metric == "seq_final_reward" and flag(cfg, "algorithm.use_kl_in_reward"):
        raise ValueError(
            f"{prefix}.metric=seq_final_reward with algorithm.use_kl_in_reward=true: groups are filtered "
            "before the reference policy runs, so the KL-penalised reward is not known yet; use seq_reward"
        )
    if int(value_at(cfg, "actor_rollout_ref.rollout.n")) < 2:
        raise ValueError(
            f"{prefix}.enable=true with actor_rollout_ref.rollout.n=1: every group has one response and is "
            "kept, so filtering does nothing; sample several responses per prompt"
        )


def check_pf_ppo(cfg: DictConfig) -> None:
    """PF-PPO's redrawn batch (``algorithm.use_pf_ppo``, ``algorithm.pf_ppo.*``)."""
    if not flag(cfg, "algorithm.use_pf_ppo"):
        return
    method = value_at(cfg, "algorithm.pf_ppo.reweight_method")
    if method not in PF_PPO_METHODS:
        raise ValueError(
            f"algorithm.pf_ppo.reweight_method={method!r} is not one of {list(PF_PPO_METHODS)} "
            "(rlflow.algos.pf_ppo.pf_ppo_weights says what each draws)"
        )
    at_least(cfg, "algorithm.pf_ppo.weight_pow", 0, integer=False)
