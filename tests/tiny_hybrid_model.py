"""A tiny hybrid Mamba / attention / mixture-of-experts causal LM for the tests (Nemotron-H: layers
``M*E``), optionally with a multi-token-prediction layer (``*E``) in the checkpoint layout Nemotron-H ships
(``mtp.layers.{i}.*``, the fusion on the first block, the final norm on the last)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAIN_PATTERN = ["linear_attention", "full_attention", "moe"]
MTP_PATTERN = ["full_attention", "moe"]


def tiny_hybrid_config(vocab_size: int, layer_types: list[str] | None = None, mtp_layers: int = 0) -> Any:
    """A Nemotron-H config of hidden size 32: 4 heads (2 KV heads, no RoPE), Mamba heads of 8, 4 experts of
    width 16 (top 2) and a shared expert."""
    from transformers import NemotronHConfig

    return NemotronHConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        layer_types=list(layer_types or MAIN_PATTERN),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=1,
        chunk_size=8,
        intermediate_size=64,
        moe_intermediate_size=16,
        moe_shared_expert_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        num_nextn_predict_layers=mtp_layers,
        mtp_layers_block_type=list(MTP_PATTERN),
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def hybrid_model_with_mtp_blocks(vocab_size: int, seed: int = 0) -> Any:
    """A Nemotron-H model whose last two layers (``*E``) stand for the MTP layer's blocks: the tests take
    the MTP weights from them and compute the MTP forward with them by hand."""
    import torch
    from transformers import NemotronHForCausalLM

    torch.manual_seed(seed)
    return NemotronHForCausalLM(tiny_hybrid_config(vocab_size, MAIN_PATTERN + MTP_PATTERN)).eval()


def mtp_checkpoint_tensors(full: Any, seed: int = 1) -> dict[str, Any]:
    """The MTP layer's tensors in Nemotron-H's checkpoint names: the blocks from ``full``'s last two
    layers, random fusion norms / projection and final norm."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n_main, hidden = len(MAIN_PATTERN), full.config.hidden_size
    tensors = {}
    for name, param in full.state_dict().items():
        for j in range(len(MTP_PATTERN)):
            prefix = f"model.layers.{n_main + j}."
            if name.startswith(prefix):
                tensors[f"mtp.layers.{j}." + name[len(prefix) :]] = param.detach().clone()
    tensors["mtp.layers.0.enorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    tensors["mtp.layers.0.hnorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    tensors["mtp.layers.0.eh_proj.weight"] = 0.1 * torch.randn(hidden, 2 * hidden, generator=gen)
    tensors[f"mtp.layers.{len(MTP_PATTERN) - 1}.final_layernorm.weight"] = 1 + 0.1 * torch.randn(
        hidden, generator=gen
    )
    return tensors


def save_tiny_hybrid_model(out: Path, with_mtp: bool = False) -> str:
    """Write the main model (``M*E``, seed 0), with ``with_mtp`` its MTP layer's tensors beside it (a second
    safetensors file listed in the index, ``num_nextn_predict_layers=1``), and the tiny tokenizer."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import NemotronHForCausalLM

    from rlflow.models.tiny import TinyModelConfig, build_tiny_tokenizer

    vocab = TinyModelConfig().vocab_size
    full = hybrid_model_with_mtp_blocks(vocab)
    torch.manual_seed(0)
    main = NemotronHForCausalLM(tiny_hybrid_config(vocab, mtp_layers=1 if with_mtp else 0))
    n_main = len(MAIN_PATTERN)
    state = {
        k: v for k, v in full.state_dict().items() if not any(f"layers.{n_main + j}." in k for j in range(2))
    }
    main.load_state_dict(state, strict=True)
    main.save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    if with_mtp:
        mtp = mtp_checkpoint_tensors(full)
        save_file({k: v.contiguous() for k, v in mtp.items()}, str(out / "model-mtp.safetensors"))
        weight_map = {k: "model.safetensors" for k in main.state_dict()}
        weight_map.update({k: "model-mtp.safetensors" for k in mtp})
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    return str(out)
