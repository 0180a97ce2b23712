"""Per-call sampling resolution from the rollout section, engine selection and the vLLM install error
(the section's validation is in tests/config/test_config.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlflow.rollout import ROLLOUT_CLASSES, get_rollout_class
from rlflow.rollout.base import build_rollout_output, resolve_sampling_params
from rlflow.rollout.hf import HFRollout

from ._tiny import make_prompts, rollout_config, tiny_model


def test_engine_names_agree_with_the_config_validation():
    from rlflow.config.validate import ROLLOUT_NAMES

    assert set(ROLLOUT_NAMES) == set(ROLLOUT_CLASSES)


def test_resolve_sampling_params_precedence():
    cfg = rollout_config(temperature=0.9, top_k=20, n=4, response_length=16)
    train = resolve_sampling_params(cfg, {})
    assert (train.temperature, train.top_k, train.n, train.do_sample, train.greedy) == (
        0.9,
        20,
        4,
        True,
        False,
    )
    val = resolve_sampling_params(cfg, {"validate": True})
    assert (val.temperature, val.top_k, val.n, val.do_sample, val.greedy) == (0.0, -1, 1, False, True)
    assert val.response_length == 16 and val.logprob_temperature == 1.0
    over = resolve_sampling_params(cfg, {"validate": True, "n": 3, "temperature": 0.5, "response_length": 8})
    assert (over.n, over.temperature, over.response_length, over.do_sample) == (3, 0.5, 8, False)
    with pytest.raises(ValueError, match=r"meta_info\.top_p"):
        resolve_sampling_params(cfg, {"top_p": 1.5})


def test_get_rollout_class():
    assert get_rollout_class("hf") is HFRollout
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name='sglang'"):
        get_rollout_class("sglang")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_missing_gives_install_command():
    cls = get_rollout_class("vllm")  # importing the module works without vLLM
    with pytest.raises(ImportError, match=r"pip install rlflow\[vllm\]"):
        cls(torch.nn.Linear(2, 2), rollout_config(name="vllm"))


def test_build_rollout_output_hand_checked():
    prompts = make_prompts(
        [[7, 8], [7, 8, 9, 10], [11, 12, 13]], width=4, non_tensors={"uid": ["a", "b", "c"]}
    )
    responses = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0]])
    log_probs = -torch.arange(1.0, 13.0).reshape(3, 4)
    out = build_rollout_output(prompts, responses, [2], log_probs)
    assert out.batch["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert out.batch["attention_mask"].tolist() == [
        [0, 0, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1, 0, 0, 0],
    ]
    assert out.batch["position_ids"].tolist() == [
        [0, 0, 0, 1, 2, 3, 4, 5],
        [0, 1, 2, 3, 4, 5, 6, 7],
        [0, 0, 1, 2, 3, 4, 5, 6],
    ]
    assert out.batch["input_ids"].tolist()[1] == [7, 8, 9, 10, 5, 6, 7, 8]
    assert out.batch["rollout_log_probs"].tolist() == [
        [-1.0, -2.0, 0.0, 0.0],
        [-5.0, -6.0, -7.0, -8.0],
        [-9.0, 0.0, 0.0, 0.0],
    ]
    assert list(out.non_tensor_batch["uid"]) == ["a", "b", "c"]
    # several EOS ids: whichever comes first ends the response
    multi = build_rollout_output(prompts, responses, [6, 7])
    assert multi.batch["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]


def test_bad_prompts_raise():
    rollout = HFRollout(tiny_model(), rollout_config(response_length=2, prompt_length=4))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.prompt_length=4"):
        rollout.generate_sequences(make_prompts([[5] * 6], width=6, meta_info={"eos_token_id": 2}))
    with pytest.raises(ValueError, match="eos_token_id"):
        HFRollout(torch.nn.Linear(2, 2), rollout_config()).generate_sequences(make_prompts([[5]], width=2))
    with pytest.raises(ValueError, match="all-zero attention_mask"):
        rollout.generate_sequences(make_prompts([[5, 6], []], width=3, meta_info={"eos_token_id": 2}))


def test_vllm_sampling_kwargs_mapping():
    from rlflow.rollout.vllm import to_vllm_sampling_kwargs

    cfg = rollout_config(temperature=0.7, top_k=0, top_p=0.9, response_length=32)
    kw = to_vllm_sampling_kwargs(
        resolve_sampling_params(cfg, {}), seed=123, calculate_log_probs=True, stop_token_ids=(2, 5)
    )
    assert kw == {
        "n": 1,
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "seed": 123,
        "detokenize": False,
        "stop_token_ids": [2, 5],
        "ignore_eos": False,
        "min_tokens": 0,
        "logprobs": 0,
    }
    greedy = to_vllm_sampling_kwargs(resolve_sampling_params(cfg, {"validate": True}), 0, False)
    assert greedy["temperature"] == 0.0 and "logprobs" not in greedy
    # rollout.ignore_eos: no stop ids at all (the engine would stop at them); min_tokens passes through
    cfg = rollout_config(ignore_eos=True, min_tokens=4, response_length=32)
    kw = to_vllm_sampling_kwargs(resolve_sampling_params(cfg, {}), 0, False, stop_token_ids=(2,))
    assert kw["ignore_eos"] is True and kw["stop_token_ids"] == [] and kw["min_tokens"] == 4


def test_vllm_engine_kwargs_mapping():
    from rlflow.rollout.vllm import vllm_dtype, vllm_engine_kwargs

    cfg = rollout_config(prompt_length=24, response_length=40, gpu_memory_utilization=0.4, seed=7)
    kw = vllm_engine_kwargs(cfg, "/models/tiny", torch.bfloat16)
    assert kw["model"] == "/models/tiny" and kw["tensor_parallel_size"] == 1
    assert kw["dtype"] == "bfloat16"  # rollout.dtype null: the actor's compute dtype
    assert kw["max_model_len"] == 64  # prompt + response when max_model_len is null
    assert kw["gpu_memory_utilization"] == 0.4 and kw["seed"] == 7
    assert kw["enable_sleep_mode"] is cfg.free_cache_engine
    # the weights come from the actor, token ids in and out, log-probs of logits / temperature
    assert (kw["load_format"], kw["skip_tokenizer_init"], kw["logprobs_mode"]) == (
        "dummy",
        True,
        "processed_logprobs",
    )
    assert "enable_return_routed_experts" not in kw  # older vLLMs do not know the argument
    routed = vllm_engine_kwargs(rollout_config(enable_rollout_routing_replay=True), "/models/tiny")
    assert routed["enable_return_routed_experts"] is True  # R3: each completion's experts
    assert vllm_dtype("fp32", torch.bfloat16) == "float32"  # rollout.dtype wins
    assert vllm_dtype(None, None) == "auto"
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.dtype"):
        vllm_dtype("int8")


def test_engine_kwargs_vllm_reach_the_engine_and_cannot_replace_rlflows_own(caplog):
    """verl's ``rollout.engine_kwargs.<engine>.*``: the vLLM section goes to ``vllm.LLM`` (plain or ``+``
    overrides, as verl's scripts pass them); what rlflow sets from one of its rollout keys is that key, what it
    sets otherwise is refused;
    the sections the running engine does not read (vllm under hf, sglang always) get a warning."""
    from rlflow.config import load_config, to_typed
    from rlflow.rollout.vllm import vllm_engine_kwargs
    from rlflow.trainer.main_ppo import prepare_config

    def typed(*overrides: str):
        return to_typed(
            prepare_config(load_config(list(overrides), config_name="demo_two_ranks"), build_warm_start=False)
        )

    cfg = typed(
        "actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=ascend",
        "+actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=32",
    )
    kw = vllm_engine_kwargs(cfg.actor_rollout_ref.rollout, "/models/tiny")
    assert kw["disable_mm_preprocessor_cache"] is True and kw["swap_space"] == 4
    assert kw["load_format"] == "dummy" and kw["model"] == "/models/tiny"
    HFRollout(tiny_model(), cfg.actor_rollout_ref.rollout)  # the engine that reads neither section says so
    assert (
        "engine_kwargs.vllm.{disable_mm_preprocessor_cache,swap_space}: vLLM options, not read by the hf"
        in (caplog.text)
    )
    assert (
        "engine_kwargs.sglang.{attention_backend}: SGLang options, not read by the hf engine" in caplog.text
    )
    assert "engine_kwargs.trtllm.{batch_wait_timeout_iters}: TensorRT-LLM options, not read by" in caplog.text
    with pytest.raises(
        ValueError, match=r"engine_kwargs\.vllm\.load_format: rlflow sets vllm\.LLM's 'load_format'.*dummy"
    ):
        typed("actor_rollout_ref.rollout.engine_kwargs.vllm.load_format=1")
    # an argument rlflow sets from one of its rollout keys is that key (verl's scripts pass vllm's spelling)
    assert typed("actor_rollout_ref.rollout.engine_kwargs.vllm.seed=7").actor_rollout_ref.rollout.seed == 7
