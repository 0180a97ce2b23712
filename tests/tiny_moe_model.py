"""A tiny mixture-of-experts causal LM for the tests (Qwen3-MoE: 4 experts, 2 per token, every layer
sparse): `tiny_moe_config` for engine tests, `save_tiny_moe_model` with the embedded tiny model's
tokenizer for runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_moe_config(vocab_size: int, hidden_size: int, max_position_embeddings: int, **extra: Any) -> Any:
    """A 2-layer ``Qwen3MoeConfig``: 4 heads (2 KV heads), 4 experts of width ``hidden_size / 2``, top 2."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size // 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        **extra,
    )


def save_tiny_moe_model(out: Path) -> str:
    """Write the model (hidden 64, seed 0) and the tiny tokenizer to ``out``; returns ``str(out)``."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    from rlflow.models.tiny import TinyModelConfig, build_tiny_tokenizer

    tiny = TinyModelConfig()
    config = tiny_moe_config(
        tiny.vocab_size, 64, tiny.max_position_embeddings, pad_token_id=0, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    return str(out)
