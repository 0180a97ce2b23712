"""Multi-token prediction: the layers read from a Nemotron-H checkpoint compute, inside the model's forward,
the depth-by-depth cross-entropy a hand-written reference computes with the same blocks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlflow.models.forward import forward_micro_batch
from rlflow.models.loader import load_causal_lm
from rlflow.models.mtp import MTPSpec, checkpoint_tensors, depth_streams, install_mtp
from tests.models._micro_batch import padded_micro_batch
from tests.tiny_hybrid_model import MAIN_PATTERN, hybrid_model_with_mtp_blocks, save_tiny_hybrid_model

BATCH_SEED = 5


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    return padded_micro_batch(vocab, [3, 5, 2], [4, 2, 4], seed=BATCH_SEED)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _reference_sums(full, tensors, mb, depths: int) -> torch.Tensor:
    """Each depth's cross-entropy over the response tokens, sequence by sequence without padding, with the
    blocks of ``full``'s layers 3 and 4 (the MTP layer's) applied ``depths`` times (one repeated layer)."""
    eps = full.config.layer_norm_epsilon
    n_main = len(MAIN_PATTERN)
    sums = torch.zeros(depths, dtype=torch.float64)
    response_len = mb["responses"].shape[1]
    with torch.no_grad():
        for i in range(mb["input_ids"].shape[0]):
            valid = mb["attention_mask"][i].bool()
            ids = mb["input_ids"][i, valid]
            n_resp = int(mb["attention_mask"][i, -response_len:].sum())
            main = full.model.embeddings(ids[None])
            for layer in full.model.layers[:n_main]:
                main = layer(main)
            h = full.model.norm_f(main)
            for k in range(1, depths + 1):
                n = ids.shape[0] - k  # positions t with a token x[t + k]
                e = full.model.embeddings(ids[None, k:])
                x = (
                    torch.cat(
                        [
                            _rms(e, tensors["mtp.layers.0.enorm.weight"], eps),
                            _rms(h[:, :n], tensors["mtp.layers.0.hnorm.weight"], eps),
                        ],
                        -1,
                    )
                    @ tensors["mtp.layers.0.eh_proj.weight"].t()
                )
                for layer in full.model.layers[n_main:]:
                    x = layer(x)
                h = _rms(x, tensors["mtp.layers.1.final_layernorm.weight"], eps)
                logits = full.lm_head(h)[0].double()
                # position t predicts x[t + k + 1]: the response tokens are the last n_resp of ids
                targets = torch.arange(ids.shape[0] - n_resp, ids.shape[0]) - k - 1
                targets = targets[targets >= 0]
                sums[k - 1] += F.cross_entropy(logits[targets], ids[targets + k + 1], reduction="sum")
    return sums


@pytest.mark.parametrize("remove_padding", [False, True])
def test_nemotron_h_mtp_layers_load_and_compute_the_reference_loss(tmp_path, remove_padding):
    path = save_tiny_hybrid_model(tmp_path / "nh", with_mtp=True)
    model = load_causal_lm(path)
    predictor = install_mtp(model, MTPSpec(depths=2, train=True, repeated=True, loss_scale=0.3), path)
    # every MTP weight is the checkpoint's
    main, mtp = checkpoint_tensors(model, model.state_dict())
    full = hybrid_model_with_mtp_blocks(model.config.vocab_size)
    from tests.tiny_hybrid_model import mtp_checkpoint_tensors

    tensors = mtp_checkpoint_tensors(full)
    assert sorted(mtp) == sorted(tensors)
    for name, tensor in tensors.items():
        torch.testing.assert_close(mtp[name], tensor, atol=0, rtol=0)
    assert not any(name.startswith("mtp") for name in main)
    assert len(predictor.layers) == 1
    model.eval()
    mb = _batch(model.config.vocab_size)
    out = forward_micro_batch(model, mb, output="log_probs", use_remove_padding=remove_padding, mtp=True)
    want = _reference_sums(full, tensors, mb, depths=2)
    torch.testing.assert_close(
        out["mtp_loss_sums"].double(), want, atol=2e-4 * float(want.abs().max()), rtol=0
    )
    # each depth predicts the response tokens at least k + 1 tokens into their row: all 10 at depth 1, the
    # 2-token prompt's first response token not at depth 2
    assert out["mtp_counts"].tolist() == [10.0, 9.0]


def test_depth_streams_roll_tokens_labels_and_mask_within_rows():
    ids = torch.tensor([[0, 0, 6, 7, 8, 9, 0]])  # pad | prompt 6 7 | response 8 9 | pad
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    response_mask = mask[:, -3:]
    (i1, i2), (l1, l2), (m1, m2) = depth_streams(ids, mask, response_mask, 2)
    assert i1.tolist() == [[0, 6, 7, 8, 9, 0, 0]] and l1.tolist() == [[6, 7, 8, 9, 0, 0, 0]]
    # depth 1: position t reads x[t+1], predicts x[t+2]; the response tokens 8, 9 are predicted at t = 2, 3
    assert m1.int().tolist() == [[0, 0, 1, 1, 0, 0, 0]]
    assert i2.tolist() == [[6, 7, 8, 9, 0, 0, 0]] and l2.tolist() == [[7, 8, 9, 0, 0, 0, 0]]
    assert m2.int().tolist() == [[0, 0, 1, 0, 0, 0, 0]]  # 8 from t = 1 would be padding: only 9, from t = 2


def test_detach_encoder_trains_the_mtp_layers_only_and_packed_equals_padded():
    from rlflow.models.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(TinyModelConfig())
    install_mtp(model, MTPSpec(depths=2, train=True, detach_encoder=True), None)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.mtp.parameters():
            p.normal_(0, 0.05) if p.dim() > 1 else p.fill_(1.0)
    mb = _batch(model.config.vocab_size)
    padded = forward_micro_batch(model, mb, output="log_probs", mtp=True)
    packed = forward_micro_batch(model, mb, output="log_probs", use_remove_padding=True, mtp=True)
    torch.testing.assert_close(packed["mtp_loss_sums"], padded["mtp_loss_sums"], atol=1e-4, rtol=0)
    # the workers' packed attention (sequences found from the positions): the MTP blocks follow it
    from rlflow.models.attention import set_packed_attention

    set_packed_attention(model)
    with torch.no_grad():
        kernel = forward_micro_batch(model, mb, output="log_probs", use_remove_padding=True, mtp=True)
    torch.testing.assert_close(kernel["mtp_loss_sums"], padded["mtp_loss_sums"].detach(), atol=1e-4, rtol=0)
    # random MTP weights on the tiny model: near the cross-entropy of a uniform guess at every depth
    per_token = padded["mtp_loss_sums"].detach() / padded["mtp_counts"]
    torch.testing.assert_close(
        per_token, torch.full((2,), math.log(model.config.vocab_size)), atol=0.3, rtol=0
    )
    padded["mtp_loss_sums"].sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(
        g is not None and float(g.abs().sum()) > 0 for n, g in grads.items() if n.startswith("mtp.layers.0")
    )
    assert all(g is None for n, g in grads.items() if not n.startswith("mtp."))


def test_the_mtp_loss_runs_through_the_fused_head():
    """``use_fused_kernels`` replaces the LM head after the MTP layers are built: the loss is the same."""
    from rlflow.models.fused_head import install_fused_head
    from rlflow.models.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(TinyModelConfig())
    install_mtp(model, MTPSpec(depths=2, train=True), None)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.mtp.parameters():
            p.normal_(0, 0.05) if p.dim() > 1 else p.fill_(1.0)
    mb = _batch(model.config.vocab_size)
    plain = forward_micro_batch(model, mb, output="log_probs", use_remove_padding=True, mtp=True)
    install_fused_head(model)
    fused = forward_micro_batch(model, mb, output="log_probs", use_remove_padding=True, mtp=True)
    torch.testing.assert_close(fused["mtp_loss_sums"], plain["mtp_loss_sums"], atol=1e-4, rtol=0)
    torch.testing.assert_close(fused["log_probs"], plain["log_probs"], atol=1e-5, rtol=0)


def test_deepseek_layout_names_and_unsupported_architectures(tmp_path):
    from transformers import Qwen3NextConfig

    from rlflow.models.mtp import mtp_layout
    from rlflow.models.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(TinyModelConfig())
    install_mtp(model, MTPSpec(depths=1), str(tmp_path))  # a directory without MTP weights: fresh layers
    # initialised as the architecture's own layers: unit norms, N(0, initializer_range^2) matrices
    assert torch.equal(model.mtp.layers[0].enorm.weight, torch.ones(model.config.hidden_size))
    std = float(model.mtp.layers[0].eh_proj.weight.std())
    assert abs(std - model.config.initializer_range) < 0.1 * model.config.initializer_range
    n = model.config.num_hidden_layers
    _, mtp = checkpoint_tensors(model, model.state_dict())
    assert f"model.layers.{n}.eh_proj.weight" in mtp and f"model.layers.{n}.shared_head.norm.weight" in mtp
    assert f"model.layers.{n}.self_attn.q_proj.weight" in mtp and f"model.layers.{n}.enorm.weight" in mtp
    assert not any(p.requires_grad for p in model.mtp.parameters())  # loaded and saved, not trained
    with pytest.raises(ValueError, match="qwen3_next"):
        mtp_layout(Qwen3NextConfig())
