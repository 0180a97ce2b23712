"""The embedded tiny model and tokenizer: round trip after reload, chat template, determinism, cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlflow.models import tiny
from rlflow.models.tiny import TinyModelConfig

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rlflow_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tiny.CACHE_DIR_ENV, str(path))
        yield path


@pytest.fixture(scope="module")
def small_path(cache_dir):
    return tiny.get_tiny_model_path(seed=0, **SMALL)


def _byte_ids(text: str) -> list[int]:
    return [tiny.BYTE_TOKEN_OFFSET + b for b in text.encode("utf-8")]


TEXTS = ["repeat c x4", "a  b\tc\n d ", "  leading and trailing  ", "ä € 😀 #### 1,000", ""]


def test_tokenizer_round_trip_after_reload(small_path):
    from transformers import AutoTokenizer

    built = tiny.build_tiny_tokenizer()
    loaded = AutoTokenizer.from_pretrained(small_path)
    assert len(loaded) == 259 and len(built) == 259
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert loaded.padding_side == "left"
    for text in TEXTS:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == _byte_ids(text), text  # one token per byte: id = 3 + byte
        assert built(text, add_special_tokens=False)["input_ids"] == ids
        assert loaded.decode(ids) == text  # spaces, tabs, newlines and non-ASCII survive
    assert loaded.decode([1, *_byte_ids("hi"), 2, 0], skip_special_tokens=True) == "hi"


def test_chat_template_exact_ids(small_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(small_path)
    messages = [{"role": "user", "content": "repeat c x4"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nrepeat c x4<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    expected = [1, *_byte_ids("user\nrepeat c x4"), 2, *_byte_ids("\n"), 1, *_byte_ids("assistant\n")]
    assert ids == expected and len(ids) == 30
    no_gen = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert no_gen == "<|im_start|>user\nrepeat c x4<|im_end|>\n"


def test_model_deterministic_for_seed():
    config = TinyModelConfig(**SMALL)
    a = tiny.build_tiny_model(config, seed=0).state_dict()
    b = tiny.build_tiny_model(config, seed=0).state_dict()
    c = tiny.build_tiny_model(config, seed=1).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    # building does not disturb the caller's RNG
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny.build_tiny_model(config, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_reload_gives_identical_weights_and_logits(small_path):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(small_path).eval()
    built = tiny.build_tiny_model(TinyModelConfig(**SMALL), seed=0)
    sd_loaded, sd_built = loaded.state_dict(), built.state_dict()
    assert all(torch.equal(sd_loaded[k], sd_built[k]) for k in sd_built)
    x = torch.tensor([[1, 100, 101, 102, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, built(x).logits)
    assert loaded.config.num_attention_heads == 4 and loaded.config.num_key_value_heads == 2
    assert loaded.config.vocab_size == 272 and loaded.config.pad_token_id == 0


def test_default_parameter_count():
    # embed 272*256 + 4 layers * (q 256*256+256, k,v 256*128+128 each, o 256*256, mlp 3*256*768, 2 norms 256)
    # + final norm 256 = 3,219,712 (tied lm_head)
    layer = (256 * 256 + 256) + 2 * (256 * 128 + 128) + 256 * 256 + 3 * 256 * 768 + 2 * 256
    expected = 272 * 256 + 4 * layer + 256
    assert expected == 3_219_712
    with torch.device("meta"):
        model = tiny.build_tiny_model(TinyModelConfig())
    assert sum(p.numel() for p in model.parameters()) == expected


def test_cache_reused(cache_dir, small_path):
    assert Path(small_path).parent == cache_dir
    before = os.stat(Path(small_path) / "model.safetensors").st_mtime_ns
    assert tiny.get_tiny_model_path(seed=0, **SMALL) == small_path
    assert os.stat(Path(small_path) / "model.safetensors").st_mtime_ns == before
    assert tiny.get_tiny_model_path(seed=1, **SMALL) != small_path
    assert not [p for p in cache_dir.iterdir() if ".tmp-" in p.name]


def test_atomic_build_loses_race_cleanly(tmp_path):
    target = tmp_path / "entry"

    def build_while_other_wins(tmp):
        (Path(tmp) / "ours.txt").write_text("ours")
        target.mkdir()  # another process renamed its directory into place meanwhile
        (target / "theirs.txt").write_text("theirs")

    assert tiny.atomic_build_dir(target, build_while_other_wins) == str(target)
    assert sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_atomic_build_failure_leaves_nothing(tmp_path):
    def failing(tmp):
        (Path(tmp) / "half.txt").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tiny.atomic_build_dir(tmp_path / "entry", failing)
    assert list(tmp_path.iterdir()) == []


def test_resolve_model_path(small_path):
    opts = "&".join(f"{k}={v}" for k, v in SMALL.items())
    assert tiny.resolve_model_path(f"rlflow://tiny?seed=0&{opts}") == small_path
    assert tiny.resolve_model_path("~/x") == os.path.expanduser("~/x")
    with pytest.raises(ValueError, match="bad option 'depth=2'"):
        tiny.resolve_model_path("rlflow://tiny?depth=2")
    with pytest.raises(ValueError, match="cannot parse 'big'"):
        tiny.resolve_model_path("rlflow://tiny?hidden_size=big")


def test_config_validation():
    with pytest.raises(ValueError, match="hidden_size=30 must be divisible by num_attention_heads=4"):
        TinyModelConfig(hidden_size=30).validate()
    with pytest.raises(ValueError, match="num_attention_heads=4 must be divisible by num_key_value_heads=3"):
        TinyModelConfig(num_key_value_heads=3).validate()
    with pytest.raises(ValueError, match="vocab_size=100 must be >= 259"):
        TinyModelConfig(vocab_size=100).validate()
    with pytest.raises(TypeError, match="unknown TinyModelConfig field"):
        tiny.get_tiny_model_path(width=3)
