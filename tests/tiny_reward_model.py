"""A tiny sequence-classification reward model for the tests: the embedded tiny model's architecture with
one output, seed 0, and the policy's tokenizer (rlflow's reward model reads the policy's tokens)."""

from __future__ import annotations

from pathlib import Path


def save_tiny_reward_model(out: Path) -> str:
    """Write the model and tokenizer to ``out``; returns ``str(out)``."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlflow.models.loader import load_tokenizer
    from rlflow.models.tiny import get_tiny_model_path

    base = get_tiny_model_path()
    config = AutoConfig.from_pretrained(base)
    config.num_labels = 1
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    load_tokenizer(base).save_pretrained(out)
    return str(out)
