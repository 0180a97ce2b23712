"""Driver-side metrics (rlflow.trainer.metrics) and FLOPs / peak estimates (rlflow.logging.flops),
checked against hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from rlflow.algos.stats import explained_variance, explained_variance_from_stats, explained_variance_stats
from rlflow.logging import flops
from rlflow.logging.flops import (
    FlopsCounter,
    count_matmul_params,
    estimate_flops_per_token,
    lookup_gpu_peak_flops,
    measure_peak_flops,
    peak_flops,
    transformer_shape,
)
from rlflow.logging.memory import get_memory_metrics
from rlflow.protocol import DataProto
from rlflow.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    expected_best_of_k,
    reduce_metrics,
    rollout_entropy,
    validation_metrics,
)

EOS = 2


def _batch() -> DataProto:
    """3 samples, prompt_len 3 (left-padded), response_len 4.

    prompt lengths 2, 3 (fills the window), 1; response lengths 2, 4 (= max, last token not EOS), 1;
    scores 1, 0, 0.5 at the last valid token; rewards = score - 0.1 per valid response token.
    """
    prompts = torch.tensor([[0, 11, 12], [13, 14, 15], [0, 0, 16]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    responses = torch.tensor([[21, EOS, 0, 0], [22, 23, 24, 25], [EOS, 0, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    scores = torch.zeros(3, 4)
    scores[0, 1], scores[1, 3], scores[2, 0] = 1.0, 0.0, 0.5
    rewards = scores - 0.1 * response_mask
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": rewards,
        }
    )


# ---- data metrics ---------------------------------------------------------------------------------------


def test_data_metrics_hand_computed():
    m = compute_data_metrics(_batch())
    expected = {
        "critic/score/mean": 0.5,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/rewards/mean": (0.8 - 0.4 + 0.4) / 3,
        "critic/rewards/max": 0.8,
        "critic/rewards/min": -0.4,
        "response_length/mean": 7 / 3,
        "response_length/max": 4.0,
        "response_length/min": 1.0,
        "response_length/clip_ratio": 1 / 3,
        "prompt_length/mean": 2.0,
        "prompt_length/max": 3.0,
        "prompt_length/min": 1.0,
        "prompt_length/clip_ratio": 1 / 3,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-6), key


def test_data_metrics_clip_ratio_with_eos_id():
    data = _batch()
    assert compute_data_metrics(data, eos_token_id=[5, 7])["response_length/clip_ratio"] == pytest.approx(
        1 / 3
    )
    data.batch["responses"][1, 3] = EOS  # the full-length response now ends with EOS: not clipped
    assert compute_data_metrics(data)["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert compute_data_metrics(data, eos_token_id=EOS)["response_length/clip_ratio"] == 0.0


def test_data_metrics_response_mask_from_attention_mask():
    data = _batch()
    data.batch.pop("response_mask")
    assert compute_data_metrics(data)["response_length/mean"] == pytest.approx(7 / 3, abs=1e-6)


def test_data_metrics_missing_key_is_named():
    data = _batch()
    data.batch.pop("token_level_rewards")
    with pytest.raises(ValueError, match="token_level_rewards"):
        compute_data_metrics(data)


# ---- timing and throughput -------------------------------------------------------------------------------


def test_timing_metrics_arithmetic():
    # 7 response tokens, 6 prompt tokens -> 13 tokens overall
    timing = {"gen": 0.7, "reward": 0.5, "update_actor": 2.6, "values": 1.3, "step": 6.0}
    m = compute_timing_metrics(_batch(), timing)
    for name, seconds in timing.items():
        assert m[f"timing_s/{name}"] == seconds
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0, rel=1e-12)  # 700 ms / 7
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(200.0, rel=1e-12)  # 2600 ms / 13
    assert m["timing_per_token_ms/values"] == pytest.approx(100.0, rel=1e-12)
    assert "timing_per_token_ms/reward" not in m and "timing_per_token_ms/step" not in m


def test_throughput_and_mfu_arithmetic():
    timing = {"step": 2.0, "update_actor": 0.5}
    m = compute_throughput_metrics(_batch(), timing, n_workers=2)
    assert m == {"perf/total_num_tokens": 13.0, "perf/time_per_step": 2.0, "perf/throughput": 13 / 4}
    m = compute_throughput_metrics(_batch(), timing, n_workers=2, actor_flops=4e12, peak_flops=8e12)
    # 4e12 FLOPs over 0.5 s on 2 workers = 4e12 FLOP/s per worker = half of the 8e12 peak
    assert m["perf/achieved_tflops/actor"] == pytest.approx(4.0, rel=1e-12)
    assert m["perf/mfu/actor"] == pytest.approx(0.5, rel=1e-12)
    # the critic: 3e12 FLOPs over its 1.5 s update on its 1 worker = 2e12 FLOP/s = a quarter of the peak
    timing["update_critic"] = 1.5
    m = compute_throughput_metrics(
        _batch(),
        timing,
        n_workers=2,
        actor_flops=4e12,
        peak_flops=8e12,
        critic_flops=3e12,
        n_critic_workers=1,
    )
    assert m["perf/mfu/critic"] == pytest.approx(0.25, rel=1e-12)
    assert m["perf/achieved_tflops/critic"] == pytest.approx(2.0, rel=1e-12)
    assert m["perf/mfu/actor"] == pytest.approx(0.5, rel=1e-12)


def test_throughput_errors():
    with pytest.raises(ValueError, match="'step'"):
        compute_throughput_metrics(_batch(), {"gen": 1.0}, n_workers=1)
    with pytest.raises(ValueError, match="n_workers"):
        compute_throughput_metrics(_batch(), {"step": 1.0}, n_workers=0)


def test_reduce_metrics_means():
    out = reduce_metrics({"a": [1.0, 2.0, 6.0], "b": [0.5], "c": 3})
    assert out == {"a": 3.0, "b": 0.5, "c": 3.0}
    with pytest.raises(ValueError, match="'empty'"):
        reduce_metrics({"empty": []})


# ---- explained variance -----------------------------------------------------------------------------------


def test_explained_variance_hand_computed():
    # valid returns [1, 2, 3, 4], values [1, 2, 3, 2]: residuals [0, 0, 0, 2]
    # Var[r] = 1.25, Var[d] = mean(d^2) - mean(d)^2 = 1 - 0.25 = 0.75 -> EV = 1 - 0.75 / 1.25 = 0.4
    returns = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    values = torch.tensor([[1.0, 2.0, 7.0], [3.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert explained_variance(returns, values, mask) == pytest.approx(0.4, abs=1e-12)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0, abs=1e-12)
    # predicting the mean explains nothing; predicting its negation is worse than nothing
    assert explained_variance(returns, torch.full_like(returns, 2.5), mask) == pytest.approx(0.0, abs=1e-12)
    assert explained_variance(returns, 5.0 - returns, mask) == pytest.approx(-3.0, abs=1e-12)


def test_explained_variance_sharded_stats_equal_whole_batch():
    torch.manual_seed(0)
    returns, values = torch.randn(6, 5), torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).long()
    whole = explained_variance(returns, values, mask)
    stats = explained_variance_stats(returns[:2], values[:2], mask[:2]) + explained_variance_stats(
        returns[2:], values[2:], mask[2:]
    )  # what an all_reduce over two data-parallel ranks gives
    assert explained_variance_from_stats(stats) == pytest.approx(whole, abs=1e-12)


def test_explained_variance_degenerate_cases():
    mask = torch.ones(2, 3)
    constant = torch.full((2, 3), 0.7)
    assert explained_variance(constant, torch.zeros(2, 3), mask) == 0.0  # Var[returns] = 0
    with pytest.raises(ValueError, match="no token"):
        explained_variance(constant, constant, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="same shape"):
        explained_variance(constant, constant[:1], mask)


def test_memory_metrics_report_rss():
    m = get_memory_metrics("cpu")
    assert set(m) == {"perf/max_rss_gb"}
    assert 0.01 < m["perf/max_rss_gb"] < 1024  # this process holds torch: tens of MiB at least


# ---- FLOPs --------------------------------------------------------------------------------------------------


def _tiny_config() -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=300,
    )


# head_dim 8; per layer q 32*32 + k 32*16 + v 32*16 + o 32*32 = 3072, MLP 3*32*64 = 6144;
# N = 2 * (3072 + 6144) + LM head 32*300 = 18432 + 9600 = 28032; L * H = 2 * 4 * 8 = 64
N_TINY = 28032


def test_flops_per_token_hand_computed():
    config = _tiny_config()
    assert count_matmul_params(transformer_shape(config)) == N_TINY
    assert estimate_flops_per_token(config, seq_len=0) == 6 * N_TINY
    assert estimate_flops_per_token(config, seq_len=10) == 6 * N_TINY + 12 * 64 * 10  # 175872
    assert estimate_flops_per_token(config, seq_len=10, backward=False) == 2 * N_TINY + 4 * 64 * 10


def test_matmul_param_count_matches_the_model():
    """N equals the Linear weights of the real model (embedding excluded, biases excluded)."""
    config = _tiny_config()
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linear == N_TINY


def test_flops_counter_achieved_tflops():
    counter = FlopsCounter(_tiny_config())
    # sum over sequences of 6 N s + 12 L H s^2 with s = 10, 20
    total = 6 * N_TINY * 30 + 12 * 64 * (10**2 + 20**2)
    assert total == 5_429_760
    assert counter.estimate_flops([10, 20]) == total
    assert counter.estimate([10, 20], delta_time_s=2.0) == pytest.approx(total / 2.0 / 1e12, rel=1e-12)
    with pytest.raises(ValueError, match="delta_time_s"):
        counter.estimate([10], delta_time_s=0.0)


def test_flops_config_errors_and_head_dim():
    with pytest.raises(ValueError, match="intermediate_size"):
        transformer_shape(
            {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 5}
        )
    moe = {"num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 8}
    with pytest.raises(ValueError, match="mixture of experts"):
        transformer_shape({**moe, "vocab_size": 5, "num_experts": 4})
    # an explicit head_dim (Qwen3 style) sets the attention width: q, o 8*(2*16); k, v 8*(1*16)
    shape = transformer_shape({**moe, "vocab_size": 5, "head_dim": 16, "num_key_value_heads": 1})
    assert count_matmul_params(shape) == 2 * 8 * 32 + 2 * 8 * 16 + 3 * 8 * 8 + 8 * 5
    # the critic's value head has one output instead of the vocabulary's 5
    assert count_matmul_params(shape, head_outputs=1) == 2 * 8 * 32 + 2 * 8 * 16 + 3 * 8 * 8 + 8 * 1


# ---- peak FLOP/s --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA RTX A1000", None),
        ("Some Future GPU", None),
    ],
)
def test_gpu_peak_table(name, tflops):
    expected = None if tflops is None else tflops * 1e12
    assert lookup_gpu_peak_flops(name) == expected


def test_peak_flops_configured_wins_and_cpu_is_measured_once(monkeypatch):
    assert peak_flops("cpu", configured=1.5e12) == 1.5e12
    with pytest.raises(ValueError, match="> 0"):
        peak_flops("cpu", configured=0.0)
    first = measure_peak_flops("cpu", num_threads=1, size=128, min_time_s=0.01)
    assert 1e6 < first < 1e13  # a 2-core machine: between a MFLOP/s and 10 TFLOP/s
    assert measure_peak_flops("cpu", num_threads=1, size=128, min_time_s=0.01) == first  # cached
    products = []
    monkeypatch.setattr(flops, "_product", lambda kernel: lambda a, b: products.append(1) or a @ b)
    assert measure_peak_flops("cpu", num_threads=1, size=128, min_time_s=0.01) == first and not products
    again = measure_peak_flops("cpu", num_threads=1, size=128, min_time_s=0.01, fresh=True)
    assert len(products) >= 6 and 1e6 < again < 1e13  # 3 warm-up and at least 3 timed products, measured now
    assert measure_peak_flops("cpu", num_threads=1, size=128, min_time_s=0.01) == first  # the cache kept
    monkeypatch.undo()
    onednn = measure_peak_flops("cpu", num_threads=1, size=128, min_time_s=0.01, kernel="onednn")
    assert onednn != onednn or 1e6 < onednn < 1e13  # NaN where torch has no oneDNN
    with pytest.raises(ValueError, match="kernel='blas'"):
        measure_peak_flops("cpu", kernel="blas")
    with pytest.raises(ValueError, match="CPU only"):
        measure_peak_flops("cuda", kernel="onednn")


@pytest.mark.gpu
def test_peak_flops_cuda_table_and_memory():
    name = torch.cuda.get_device_name(0)
    known = lookup_gpu_peak_flops(name)
    if known is not None:
        assert peak_flops("cuda") == known
        measured = measure_peak_flops("cuda", size=4096, min_time_s=0.05)
        assert 0.05 * known < measured < 1.05 * known  # a bf16 matmul stays below the datasheet peak
    x = torch.empty(2**28, dtype=torch.uint8, device="cuda")  # 256 MiB
    m = get_memory_metrics()
    assert m["perf/max_memory_allocated_gb"] >= 0.25 - 1e-9
    assert not math.isnan(m["perf/max_rss_gb"])
    del x


def test_expected_best_of_k_hand_computed():
    # scores {0, 0.5, 1}: 2-subsets {0,.5} {0,1} {.5,1} -> maxima .5, 1, 1 -> mean 2.5/3
    assert expected_best_of_k([1.0, 0.0, 0.5], 2) == pytest.approx(2.5 / 3, abs=1e-12)
    assert expected_best_of_k([1.0, 0.0, 0.5], 1) == pytest.approx(0.5, abs=1e-12)
    assert expected_best_of_k([1.0, 0.0, 0.5], 3) == pytest.approx(1.0, abs=1e-12)
    # 0/1 scores: the unbiased pass@k estimator 1 - C(n-c, k)/C(n, k); n=4, c=1, k=2 -> 1 - 3/6
    assert expected_best_of_k([0, 1, 0, 0], 2) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="need 1 <= k <= n"):
        expected_best_of_k([1.0], 2)


def test_expected_best_of_k_matches_enumeration():
    import itertools

    rng = np.random.default_rng(0)
    scores = rng.uniform(size=6).tolist()
    for k in range(1, 7):
        subsets = list(itertools.combinations(scores, k))
        assert expected_best_of_k(scores, k) == pytest.approx(np.mean([max(s) for s in subsets]), abs=1e-12)


def test_validation_metrics_n1_is_the_mean():
    out = validation_metrics(["a", "b", "a"], [0.25, 1.0, 0.75], 1)
    assert out == {
        "val-core/a/reward/mean@1": pytest.approx(0.5),
        "val-core/b/reward/mean@1": pytest.approx(1.0),
    }


def test_validation_metrics_groups_hand_computed():
    # two prompts of source "s", n=4: [1, 0, 0, 0.5] and [1, 1, 0, 0]
    scores = [1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.0, 0.0]
    out = validation_metrics(["s"] * 8, scores, 4)
    assert out["val-core/s/reward/mean@4"] == pytest.approx(3.5 / 8)
    assert out["val-aux/s/reward/std@4"] == pytest.approx((np.std([1, 0, 0, 0.5]) + 0.5) / 2)
    # pass@1 = fraction correct; pass@2: prompt 1 (c=1): 1 - C(3,2)/C(4,2) = 0.5; prompt 2 (c=2): 1 - 1/6
    assert out["val-core/s/pass@1"] == pytest.approx(3 / 8)
    assert out["val-core/s/pass@2"] == pytest.approx((0.5 + 5 / 6) / 2)
    assert out["val-core/s/pass@4"] == pytest.approx(1.0)
    # best@2 of [0, 0, .5, 1]: pairs' maxima 0, .5, 1, .5, 1, 1 -> 4/6; of [0, 0, 1, 1]: 5/6
    assert out["val-core/s/reward/best@2/mean"] == pytest.approx((4 / 6 + 5 / 6) / 2)
    assert out["val-core/s/reward/best@4/mean"] == pytest.approx(1.0)
    assert sorted(k for k in out if "@3" in k) == []  # k runs over 2, 4, ... and n


def test_validation_metrics_refuses_broken_groups():
    with pytest.raises(ValueError, match="not whole groups of n=4"):
        validation_metrics(["s"] * 6, [0.0] * 6, 4)
    with pytest.raises(ValueError, match="mix data sources"):
        validation_metrics(["a", "b"], [0.0, 1.0], 2)


def test_rollout_entropy_is_the_whole_batch_token_mean_and_leaves_the_batch():
    """Bypass mode: ``actor/entropy`` from the rollout's per-token entropies, over valid tokens only."""
    batch = DataProto.from_dict(
        {
            "rollout_entropy": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
            "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        }
    )
    assert rollout_entropy(batch) == {"actor/entropy": pytest.approx((1 + 2 + 4) / 3, rel=1e-12)}
    assert "rollout_entropy" not in batch.batch.keys()  # not shipped on to the updates
    assert rollout_entropy(batch) == {}


def _active_weights(model: torch.nn.Module, top_k: int) -> int:
    """Matmul weights one token goes through, counted on the built model: attention projections, each
    layer's dense MLP or (MoE) its router, ``top_k`` of its experts and its shared expert, the LM head."""
    from rlflow.models.router_replay import moe_routers

    routers = {id(r) for r in moe_routers(model)}
    total = model.lm_head.weight.numel()
    for layer in model.model.layers:
        total += sum(m.weight.numel() for m in layer.self_attn.modules() if isinstance(m, torch.nn.Linear))
        router = next((m for m in layer.mlp.modules() if id(m) in routers), None)
        linears = sum(m.weight.numel() for m in layer.mlp.modules() if isinstance(m, torch.nn.Linear))
        if router is None:
            total += linears
            continue
        experts = layer.mlp.experts
        per_expert = sum(p.numel() for p in experts.parameters()) // router.weight.shape[0]
        total += router.weight.numel() + top_k * per_expert + linears  # linears: the shared expert, its gate
    return total


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        (
            "Qwen2MoeConfig",
            {"moe_intermediate_size": 24, "shared_expert_intermediate_size": 40, "mlp_only_layers": [1]},
        ),
        ("Qwen3MoeConfig", {"moe_intermediate_size": 24, "decoder_sparse_step": 2}),
        ("MixtralConfig", {"num_local_experts": 4}),
        ("OlmoeConfig", {}),
    ],
)
def test_mixture_of_experts_flops_count_what_a_token_goes_through(name, extra):
    """A MoE layer's N is its router, top-k experts and shared expert (not all experts): checked against the
    weights of the built model; Qwen2-MoE's dense layer (mlp_only_layers) and Qwen3-MoE's sparse step count
    the dense MLP."""
    sizes = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
             "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": 2}  # fmt: skip
    if name != "MixtralConfig":
        sizes["num_experts"] = 4
    config = getattr(transformers, name)(**sizes, **extra)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shape = transformer_shape(config)
    assert shape.moe_layers == {"Qwen2MoeConfig": 2, "Qwen3MoeConfig": 1}.get(name, 3)
    assert count_matmul_params(shape) == _active_weights(model, top_k=2)
    dense = transformer_shape(_tiny_config())
    assert dense.moe_layers == 0 and count_matmul_params(dense) == N_TINY
