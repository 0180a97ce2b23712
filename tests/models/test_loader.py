"""Loaders for the actor/ref (causal LM), critic (token-level value model) and reward model."""

from __future__ import annotations

import logging

import pytest
import torch

from rlflow.models import loader, tiny

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny.save_tiny_model(tmp_path_factory.mktemp("tiny"), tiny.TinyModelConfig(**SMALL), seed=0)


def _inputs():
    ids = torch.tensor([[0, 0, 1, 100, 101, 2], [1, 102, 103, 104, 105, 2]])
    mask = (ids != 0).long()
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return ids, mask, pos


def test_resolve_attn_implementation():
    if not torch.cuda.is_available():
        assert loader.resolve_attn_implementation("auto") == "sdpa"
        assert loader.resolve_attn_implementation(None) == "sdpa"
        with pytest.raises(ValueError, match=r"flash_attention_2.*needs the flash-attn package"):
            loader.resolve_attn_implementation("flash_attention_2")
    assert loader.resolve_attn_implementation("eager") == "eager"
    assert loader.resolve_attn_implementation("sdpa") == "sdpa"
    with pytest.raises(ValueError, match="attn_implementation='flash3' is not one of"):
        loader.resolve_attn_implementation("flash3")


def test_resolve_dtype():
    assert loader.resolve_dtype("bf16") is torch.bfloat16
    assert loader.resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="dtype='int8'"):
        loader.resolve_dtype("int8")


def test_load_tokenizer(path):
    tok = loader.load_tokenizer(path)
    assert tok.pad_token_id == 0 and tok.padding_side == "left"
    assert loader.load_tokenizer(path, padding_side="right").padding_side == "right"


def test_load_tokenizer_sets_missing_pad_to_eos(path, tmp_path):
    tok = loader.load_tokenizer(path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    reloaded = loader.load_tokenizer(str(tmp_path))
    assert reloaded.pad_token_id == reloaded.eos_token_id == 2


def test_load_causal_lm_matches_checkpoint(path):
    model = loader.load_causal_lm(path, dtype="float32", attn_implementation="auto").eval()
    built = tiny.build_tiny_model(tiny.TinyModelConfig(**SMALL), seed=0)
    assert model.config._attn_implementation == (
        "sdpa" if not loader.flash_attn_available() else "flash_attention_2"
    )
    ids, mask, pos = _inputs()
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        ref = built(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    bf16 = loader.load_causal_lm(path, dtype="bf16", attn_implementation="eager")
    assert next(bf16.parameters()).dtype is torch.bfloat16


@pytest.mark.parametrize(
    "fn", [loader.load_tokenizer, loader.load_causal_lm, loader.load_value_model, loader.load_reward_model]
)
def test_missing_path_is_named(fn, tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ValueError, match="no_such_model"):
        fn(missing)


def test_value_model_from_causal_lm(path, caplog):
    with caplog.at_level(logging.WARNING, logger="rlflow.models.loader"):
        critic = loader.load_value_model(path, seed=0, attn_implementation="sdpa")
    assert "has no value head" in caplog.text and path in caplog.text
    lm = tiny.build_tiny_model(tiny.TinyModelConfig(**SMALL), seed=0)
    # backbone weights come from the checkpoint
    assert torch.equal(critic.model.embed_tokens.weight, lm.model.embed_tokens.weight)
    assert torch.equal(critic.model.layers[1].mlp.up_proj.weight, lm.model.layers[1].mlp.up_proj.weight)
    # head: N(0, 0.02^2) from a generator seeded with the seed, bias 0
    expected = torch.randn((1, 32), generator=torch.Generator().manual_seed(0)) * 0.02
    torch.testing.assert_close(critic.score.weight, expected, rtol=0, atol=0)
    assert torch.equal(critic.score.bias, torch.zeros(1))
    other = loader.load_value_model(path, seed=1)
    assert not torch.equal(other.score.weight, critic.score.weight)
    # token-level values; no dropout, so train mode is deterministic and equals the manual computation
    critic.train()
    ids, mask, pos = _inputs()
    v1 = critic(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    v2 = critic(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert v1.shape == (2, 6, 1) and torch.equal(v1, v2)
    hidden = critic.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    torch.testing.assert_close(v1, hidden @ critic.score.weight.T + critic.score.bias, rtol=1e-6, atol=1e-7)


def test_value_model_keeps_trained_head(path, tmp_path):
    critic = loader.load_value_model(path, seed=0)
    with torch.no_grad():
        critic.score.weight.fill_(0.5)
        critic.score.bias.fill_(-1.0)
    critic.save_pretrained(tmp_path)
    reloaded = loader.load_value_model(str(tmp_path), seed=7)
    assert torch.equal(reloaded.score.weight, torch.full((1, 32), 0.5))
    assert torch.equal(reloaded.score.bias, torch.tensor([-1.0]))
    assert reloaded.dropout.p == 0.0


def test_reward_model_requires_head(path, tmp_path):
    with pytest.raises(ValueError, match=f"reward-model checkpoint '{path}' lacks weights"):
        loader.load_reward_model(path)
    rm = loader.load_reward_model(path, allow_random_head=True, seed=0)
    expected = torch.randn((1, 32), generator=torch.Generator().manual_seed(0)) * 0.02
    torch.testing.assert_close(rm.score.weight, expected, rtol=0, atol=0)
    rm.save_pretrained(tmp_path)
    again = loader.load_reward_model(str(tmp_path))
    assert torch.equal(again.score.weight, rm.score.weight) and not again.training
