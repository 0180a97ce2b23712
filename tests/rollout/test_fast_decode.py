"""`FastDecoder`: the HF rollout's decoding steps without transformers' per-step forward give
transformers' tokens and log-probs, for each architecture it takes; other models keep the plain path."""

from __future__ import annotations

import pytest
import torch

from rlflow.models.attention import GENERATION_ATTENTION
from rlflow.rollout import fast_decode
from rlflow.rollout.base import SamplingParams
from rlflow.rollout.decoding import decode
from rlflow.rollout.fast_decode import FastDecoder, Projection, fast_decoder_for, packed_projections_available

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _model(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    import transformers

    configs = {
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
        "llama_bias": ("LlamaConfig", "LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
        "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    }
    config_cls, model_cls, extra = configs[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    model = getattr(transformers, model_cls)(config).to(dtype).eval()
    with torch.no_grad():  # random biases (transformers initialises them to 0)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.2)
    model.config._attn_implementation = GENERATION_ATTENTION
    return model


def _prompts() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4], mask[2, :1] = 0, 0  # left padding
    ids = ids * mask
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _decode(model, fast, eos, repeats=1, **params):
    ids, mask, pos = _prompts()
    p = SamplingParams(
        temperature=params.get("temperature", 1.0), top_p=1.0, top_k=-1, do_sample=True, n=repeats, response_length=12,
        min_tokens=params.get("min_tokens", 0),
    )  # fmt: skip
    keys = torch.arange(ids.shape[0] * repeats)
    return decode(model, ids, mask, pos, p, keys, eos, 0, repeats=repeats, fast=fast)[:2]


@pytest.mark.parametrize("kind", ["qwen2", "llama_bias", "mistral", "qwen3"])
def test_fast_steps_give_transformers_tokens_and_log_probs(kind):
    model = _model(kind)
    assert fast_decoder_for(model) is not None
    # an EOS that rows draw early, so rows leave the cache mid-way; two samples per prompt share a prefill
    probe, _ = _decode(model, False, [])
    eos = [int(probe[:, 2:6].flatten().mode().values)]
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    for kwargs in ({}, {"repeats": 2, "min_tokens": 3}):
        calls.clear()
        tokens, log_probs = _decode(model, True, eos, **kwargs)
        assert len(calls) == 1  # transformers ran the prefill only
        ref_tokens, ref_log_probs = _decode(model, False, eos, **kwargs)
        assert torch.equal(tokens, ref_tokens)
        assert (tokens == eos[0]).any()
        torch.testing.assert_close(log_probs, ref_log_probs, rtol=0, atol=2e-6)
    handle.remove()


def test_bf16_step_matches_transformers_to_bf16_precision():
    model = _model("qwen2", torch.bfloat16)
    ids, mask, pos = _prompts()
    p = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, n=1, response_length=6, ignore_eos=True
    )
    keys = torch.arange(4)
    tokens, fast, _ = decode(model, ids, mask, pos, p, keys, [], 0, fast=True)
    ref_tokens, plain, _ = decode(model, ids, mask, pos, p, keys, [], 0, fast=False)
    # bf16 rounding may flip a draw; up to the first difference of each row the log-probs agree to it
    same = (tokens == ref_tokens).long().cumprod(-1).bool()
    assert same[:, 0].all() and same.float().mean() > 0.5
    diff = (fast - plain).abs()[same]
    assert diff.max() < 0.1 and diff.mean() < 0.02, diff


def test_other_models_keep_transformers_forward():
    import transformers

    assert (
        fast_decoder_for(_model("mistral").__class__(transformers.MistralConfig(**COMMON, sliding_window=8)))
        is None
    )
    gelu = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, hidden_act="gelu"))
    assert fast_decoder_for(gelu) is None
    moe = transformers.Qwen2MoeForCausalLM(
        transformers.Qwen2MoeConfig(**COMMON, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16)
    )
    assert fast_decoder_for(moe) is None


@pytest.mark.parametrize("with_bias", [False, True])
def test_projection_gives_f_linear_for_any_row_count(with_bias):
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(48, 40, generator=g)
    bias = torch.randn(48, generator=g) if with_bias else None
    x = torch.randn(16, 40, generator=g)
    expected = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    for pack in (True, False):
        projection = Projection(weight, bias, pack=pack, min_bytes=0)
        assert projection.packed == (pack and packed_projections_available())
        for rows in (16, 5, 1):  # rows leave the batch as they finish
            out = projection(x[:rows])
            assert out.shape == (rows, 48) and out.dtype == torch.float32
            # fp32 products of 40 terms of scale ~6: rounding ~1e-6
            torch.testing.assert_close(out.double(), expected[:rows], rtol=0, atol=2e-5)


def test_packed_projection_keeps_the_weight_of_its_generation_call():
    if not packed_projections_available():
        pytest.skip("this torch build has no oneDNN")
    weight, x = torch.randn(8, 4), torch.randn(2, 4)
    projection = Projection(weight, None, min_bytes=0)
    assert projection.packed and not Projection(weight, None).packed  # 128 bytes: below PACK_MIN_BYTES
    before = projection(x)
    weight.add_(1.0)  # an optimizer step after the call: the call's copy does not follow
    torch.testing.assert_close(projection(x), before)


def test_every_weight_is_packed_when_the_model_outgrows_the_last_level_cache(monkeypatch):
    """Weights streamed from memory on every step: the small ones pack too. Weights that stay in cache:
    only those of at least PACK_MIN_BYTES (none in the tiny model)."""
    if not packed_projections_available():
        pytest.skip("this torch build has no oneDNN")
    model = _model("qwen2")
    weights = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))

    def projections(decoder):
        return [p for layer in decoder.layers for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]

    monkeypatch.setattr(fast_decode, "last_level_cache_bytes", lambda: weights)  # fits exactly
    assert not any(p.packed for p in projections(FastDecoder(model)))
    monkeypatch.setattr(fast_decode, "last_level_cache_bytes", lambda: weights - 1)
    fitted = FastDecoder(model)
    assert all(p.packed for p in projections(fitted)) and fitted.lm_head.packed
    monkeypatch.undo()
    assert fast_decode.last_level_cache_bytes() >= 1 << 20  # this machine's, read from sysfs or defaulted


def test_the_last_level_cache_size_is_read_or_defaulted(monkeypatch, tmp_path):
    for index, size in (("index0", "48K"), ("index2", "1024K"), ("index3", "32768K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    real_path = fast_decode.Path
    read = fast_decode.last_level_cache_bytes.__wrapped__  # the reader itself, not its cached value
    monkeypatch.setattr(fast_decode, "Path", lambda p: tmp_path if "cpu0/cache" in p else real_path(p))
    assert read() == 32 << 20
    (tmp_path / "index3" / "size").write_text("64M\n")
    assert read() == 64 << 20
    monkeypatch.setattr(fast_decode, "Path", lambda p: tmp_path / "missing")
    assert read() == 32 << 20  # the default


def test_packed_and_plain_decoding_agree():
    """The oneDNN kernel sums in another order than MKL's: same tokens, log-probs to float rounding."""
    model = _model("qwen2")
    ids, mask, pos = _prompts()
    p = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, n=1, response_length=12, ignore_eos=True
    )
    keys = torch.arange(4)
    packed, plain = FastDecoder(model, min_bytes=0), FastDecoder(model, pack=False)
    assert packed.lm_head.packed == packed_projections_available() and not plain.lm_head.packed
    runs = [decode(model, ids, mask, pos, p, keys, [], 0, fast=fast) for fast in (packed, plain)]
    assert torch.equal(runs[0][0], runs[1][0])
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=0, atol=2e-6)


def test_packed_bf16_projection_matches_f_linear_to_bf16_rounding():
    if not packed_projections_available():
        pytest.skip("this torch build has no oneDNN")
    g = torch.Generator().manual_seed(3)
    weight, bias, x = (
        torch.randn(64, 48, generator=g),
        torch.randn(64, generator=g),
        torch.randn(9, 48, generator=g),
    )
    projection = Projection(weight.bfloat16(), bias.bfloat16(), min_bytes=0)
    assert projection.packed
    out = projection(x.bfloat16())
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(
        x.bfloat16().double(), weight.bfloat16().double(), bias.bfloat16().double()
    )
    # outputs of scale ~7 rounded to bf16 (8 bits of mantissa): within 2 ** -8 relative, plus the sum's rounding
    torch.testing.assert_close(out.double(), expected, rtol=2**-7, atol=0.1)


def test_onednn_linear_models_decode_fast_and_agree_with_aten():
    """A model whose linear layers compute through oneDNN (``trainer.cpu_linear_kernel=onednn``) keeps the
    fast decoding steps, and its generation replica computes like it (the prefill's products through
    oneDNN): the same tokens as the ``F.linear`` model, log-probs to float rounding."""
    import copy

    import transformers

    from rlflow.models.cpu_linear import OneDNNLinear, install_onednn_linear
    from rlflow.rollout.hf import build_generation_replica
    from rlflow.utils.onednn import onednn_linear_available

    if not onednn_linear_available():
        pytest.skip("this torch build has no oneDNN")
    # wide enough that the prefill's products (36 rows x 256 x 1024) pass cpu_linear.MIN_MACS
    config = transformers.Qwen2Config(**{**COMMON, "hidden_size": 256, "intermediate_size": 1024})
    torch.manual_seed(0)
    aten = transformers.Qwen2ForCausalLM(config).eval()
    aten.config._attn_implementation = GENERATION_ATTENTION
    onednn = copy.deepcopy(aten)
    install_onednn_linear(onednn)
    assert fast_decoder_for(onednn) is not None

    def classes(model):
        return {type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)}

    replica = build_generation_replica(onednn)
    assert classes(replica) == {OneDNNLinear} and classes(build_generation_replica(aten)) == {torch.nn.Linear}
    with torch.no_grad():  # what sync_replica_weights copies: parameters and buffers (rotary inv_freq)
        for (name, target), (source_name, source) in zip(
            [*replica.named_parameters(), *replica.named_buffers()],
            [*onednn.named_parameters(), *onednn.named_buffers()],
            strict=True,
        ):
            assert name == source_name
            target.copy_(source)
    ids, mask, pos = _prompts()
    p = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, n=1, response_length=12, ignore_eos=True
    )
    runs = [decode(m, ids, mask, pos, p, torch.arange(4), [], 0) for m in (replica, onednn, aten)]
    for tokens, log_probs, _ in runs[:2]:
        assert torch.equal(tokens, runs[2][0])
        torch.testing.assert_close(log_probs, runs[2][1], rtol=0, atol=2e-5)
