"""Models with recurrent layers (Mamba, linear attention) carry state along the token axis, so a packed row
would leak each sequence's state into the next: their forwards stay padded under use_remove_padding."""

from __future__ import annotations

import torch

from rlflow.models.forward import forward_micro_batch
from rlflow.models.padding import keeps_packed_sequences_apart
from tests.models._micro_batch import padded_micro_batch
from tests.tiny_hybrid_model import tiny_hybrid_config


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    return padded_micro_batch(vocab, [3, 5, 2], [4, 2, 4], seed=3)


def test_a_hybrid_model_with_remove_padding_computes_the_padded_log_probs():
    from transformers import NemotronHForCausalLM

    torch.manual_seed(0)
    model = NemotronHForCausalLM(tiny_hybrid_config(64)).eval()
    assert not keeps_packed_sequences_apart(model.config)
    mb = _batch(64)
    mask = (mb["attention_mask"][:, -4:]).bool()
    with torch.no_grad():
        padded = forward_micro_batch(model, mb, output="log_probs")["log_probs"]
        packed = forward_micro_batch(model, mb, output="log_probs", use_remove_padding=True)["log_probs"]
        # each sequence alone, no padding: the reference
        for i in range(3):
            valid = mb["attention_mask"][i].bool()
            ids = mb["input_ids"][i, valid][None]
            logits = model(input_ids=ids).logits[0].float().log_softmax(-1)
            n_resp = int(mask[i].sum())
            want = logits[-n_resp - 1 : -1].gather(-1, ids[0, -n_resp:, None])[:, 0]
            torch.testing.assert_close(padded[i, :n_resp], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[mask], padded[mask], atol=1e-6, rtol=0)


def test_attention_only_models_keep_packed_sequences_apart():
    from transformers import Qwen2Config

    assert keeps_packed_sequences_apart(Qwen2Config())
    assert keeps_packed_sequences_apart(tiny_hybrid_config(64, ["full_attention", "moe", "mlp"]))
    assert not keeps_packed_sequences_apart(tiny_hybrid_config(64, ["linear_attention", "full_attention"]))


def test_decoding_drops_finished_rows_from_a_hybrid_models_cache():
    """The decoding loop keeps only unfinished rows of the cache; a hybrid model's cache holds Mamba state
    layers (no ``batch_select_indices``) beside the attention KV layers."""
    from transformers import NemotronHForCausalLM

    from rlflow.rollout.decoding import _drop_finished_rows

    torch.manual_seed(0)
    model = NemotronHForCausalLM(tiny_hybrid_config(64)).eval()
    ids = torch.randint(3, 64, (3, 5), generator=torch.Generator().manual_seed(1))
    step = torch.tensor([[7], [8], [9]])
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        full = model(input_ids=step, past_key_values=cache, use_cache=True).logits[:, -1]
        cache = model(input_ids=ids, use_cache=True).past_key_values
        (kept,) = _drop_finished_rows(torch.tensor([False, True, False]), cache, step)
        dropped = model(input_ids=kept, past_key_values=cache, use_cache=True).logits[:, -1]
    torch.testing.assert_close(dropped, full[[0, 2]], atol=1e-5, rtol=0)
