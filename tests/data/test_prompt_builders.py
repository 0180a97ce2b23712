"""``data.continuous_token`` (`rlflow.data.prompt_builders`): a DeepSeek-V4 checkpoint's own encoder
(``encoding/encoding_dsv4.py``, imported from the tokenizer's directory) renders the prompts; ``auto`` finds
it; off, or without it, the chat template renders them; what cannot be rendered is named before Ray."""

from __future__ import annotations

import pytest

from rlflow.data.io import write_parquet
from rlflow.data.rl_dataset import RLHFDataset
from rlflow.models.loader import load_tokenizer
from rlflow.models.tiny import build_tiny_tokenizer

# A stand-in for the checkpoint's encoder, in its calling convention (the real one ships with the weights).
ENCODER = """
def encode_messages(messages, thinking_mode, reasoning_effort=None):
    assert thinking_mode in ("chat", "thinking"), thinking_mode
    text = "[MAX]" if reasoning_effort == "max" else ""
    for m in messages:
        text += {"system": "{c}", "user": "<U>{c}<A>"}[m["role"]].format(c=m["content"])
    return "[BOS]" + text + ("<think>" if thinking_mode == "thinking" else "</think>")
"""


def _cfg(**overrides):
    from rlflow.config import config_section

    return config_section("data", **{"max_prompt_length": 64, **overrides})


@pytest.fixture
def checkpoint(tmp_path):
    """A tokenizer directory with the stand-in encoder, as a DeepSeek-V4 checkpoint has it."""
    directory = tmp_path / "dsv4"
    build_tiny_tokenizer().save_pretrained(directory)
    (directory / "encoding").mkdir()
    (directory / "encoding" / "encoding_dsv4.py").write_text(ENCODER)
    return str(directory)


def _prompt_ids(dataset: RLHFDataset, index: int = 0) -> list[int]:
    item = dataset[index]
    return item["input_ids"][item["attention_mask"].bool()].tolist()


def test_the_checkpoints_encoder_renders_the_prompts(tmp_path, checkpoint):
    tok = load_tokenizer(checkpoint)
    rows = [
        {
            "prompt": [{"role": "system", "content": "S."}, {"role": "user", "content": "hi"}],
            "data_source": "x",
        }
    ]
    f = write_parquet(rows, tmp_path / "a.parquet")
    for family in ("deepseekv4", "auto"):
        thinking = RLHFDataset(
            f,
            tok,
            _cfg(
                continuous_token={"enable": True, "model_family": family},
                apply_chat_template_kwargs={"enable_thinking": True},
            ),
        )
        assert _prompt_ids(thinking) == tok("[BOS]S.<U>hi<A><think>", add_special_tokens=False)["input_ids"]
    chat = RLHFDataset(
        f,
        tok,
        _cfg(continuous_token={"enable": True}, apply_chat_template_kwargs={"reasoning_effort": "max"}),
    )
    assert _prompt_ids(chat) == tok("[BOS][MAX]S.<U>hi<A></think>", add_special_tokens=False)["input_ids"]
    # off: the chat template, encoder or not
    plain = RLHFDataset(f, tok, _cfg())
    templated = tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert _prompt_ids(plain) == tok(templated, add_special_tokens=False)["input_ids"]


def test_auto_without_an_encoder_is_the_chat_template_and_deepseekv4_needs_one(tmp_path):
    directory = tmp_path / "plain"
    build_tiny_tokenizer().save_pretrained(directory)
    tok = load_tokenizer(str(directory))
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "data_source": "x"}]
    f = write_parquet(rows, tmp_path / "a.parquet")
    auto = RLHFDataset(f, tok, _cfg(continuous_token={"enable": True}))
    templated = tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert _prompt_ids(auto) == tok(templated, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match=r"no DeepSeek-V4 encoder at .*encoding/encoding_dsv4\.py"):
        RLHFDataset(f, tok, _cfg(continuous_token={"enable": True, "model_family": "deepseekv4"}))


def test_an_encoder_error_names_the_row(tmp_path, checkpoint):
    tok = load_tokenizer(checkpoint)
    rows = [
        {"prompt": [{"role": "user", "content": "ok"}], "data_source": "x"},
        {"prompt": [{"role": "tool", "content": "?"}], "data_source": "x"},  # the stand-in knows no tool role
    ]
    f = write_parquet(rows, tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"a\.parquet.*row 1.*the DeepSeek-V4 encoder failed: KeyError"):
        RLHFDataset(f, tok, _cfg(continuous_token={"enable": True}))


def test_continuous_token_settings_are_checked_before_ray(tmp_path, checkpoint):
    from rlflow.trainer.check_config import check_config

    cfg = check_config(
        [
            f"actor_rollout_ref.model.tokenizer_path={checkpoint}",
            "data.continuous_token.enable=True",
            "data.continuous_token.model_family=deepseekv4",
        ],
        "demo",
    )
    assert cfg.data.continuous_token.model_family == "deepseekv4"
    for overrides, message in (
        (
            ["data.continuous_token.enable=True", "data.continuous_token.model_family=deepseekv4"],
            "no DeepSeek-V4 encoder at",
        ),
        (["data.continuous_token.model_family=qwen3"], "model_family='qwen3': rlflow renders prompts"),
        (["data.continuous_token.custom_builder_module=my.builder"], "verl's builder classes are not loaded"),
    ):
        with pytest.raises(ValueError, match=message):
            check_config(overrides, "demo")
