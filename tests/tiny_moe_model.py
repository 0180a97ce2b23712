"""A tiny mixture-of-experts causal LM for the tests (Qwen3-MoE: 4 experts, 2 per token, every layer
sparse) with the embedded tiny model's tokenizer, seed 0."""

from __future__ import annotations

from pathlib import Path


def save_tiny_moe_model(out: Path) -> str:
    """Write the model and tokenizer to ``out``; returns ``str(out)``."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rlflow.models.tiny import TinyModelConfig, build_tiny_tokenizer

    tiny = TinyModelConfig()
    config = Qwen3MoeConfig(
        vocab_size=tiny.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    return str(out)
