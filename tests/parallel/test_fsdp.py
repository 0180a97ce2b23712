"""rlflow.parallel.fsdp: size validation, FSDP1/FSDP2 on 2 gloo ranks against one unsharded process.

The sharded runs feed each rank half of the batch (same token count per half) with a per-rank mean
loss; FSDP averages the two gradients, which is exactly the gradient of the full-batch mean loss
computed by the unsharded reference in this process.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from rlflow.config.schema import MixedPrecisionSection, OptimConfig
from rlflow.engine.optim import build_optimizer
from rlflow.models.tiny import TinyModelConfig, build_tiny_model
from rlflow.parallel.dims import ParallelDims, validate_parallel_sizes
from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.fsdp import apply_fsdp, build_sharded_model, find_decoder_layers, mixed_precision_dtypes
from rlflow.parallel.sharded import (
    clip_grad_norm_,
    gather_full_grads,
    gather_full_params,
    get_full_state_dict,
    iter_full_params,
    offload_optimizer_to_cpu,
)

CFG = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
# eps 1e-6: Adam's first update g / (|g| + eps) is ill-conditioned for |g| ~ eps, and gradients of ~1e-9
# differ in their last bits between sharded and unsharded reductions.
OPTIM = OptimConfig(lr=1e-2, betas=[0.9, 0.95], weight_decay=0.1, eps=1e-6)
MAX_NORM = 0.05  # below the gradient norm (~1-3), so clipping really scales the gradients
VARIANTS = {
    # name: (strategy, fsdp_size, rank0_only_load, gradient checkpointing, mixed precision, forward prefetch)
    "fsdp2": ("fsdp2", -1, True, False, None, False),
    "fsdp1": ("fsdp", -1, True, False, None, False),
    "fsdp2_hsdp_ckpt": ("fsdp2", 1, False, True, None, False),
    "fsdp1_hsdp": ("fsdp", 1, True, False, None, False),
    "fsdp2_bf16": (
        "fsdp2",
        -1,
        True,
        False,
        MixedPrecisionSection(param_dtype="bf16", reduce_dtype="fp32"),
        False,
    ),
    "fsdp2_prefetch": ("fsdp2", -1, True, False, None, True),
    "fsdp1_prefetch": ("fsdp", -1, True, False, None, True),
}


def _batch() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(3, CFG.vocab_size, (4, 16), generator=gen)


def _mean_nll(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=input_ids, use_cache=False).logits.float()
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1)
    )


def _reference() -> dict:
    model = build_tiny_model(CFG).train()
    loss = _mean_nll(model, _batch())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    clipped = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model.parameters(), OPTIM)
    optimizer.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {
        "loss": loss.item(),
        "grads": grads,
        "norm": norm.item(),
        "clipped": clipped,
        "params": params,
        "state": {k: v.clone() for k, v in model.state_dict().items()},
    }


def _load_fn(device: torch.device) -> torch.nn.Module:
    if device.type == "meta":
        with device:
            return build_tiny_model(CFG).train()
    return build_tiny_model(CFG).train()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard (no collective: DTensor ops such as ``equal`` would communicate)."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _same_finite(grad: torch.Tensor, saved: torch.Tensor) -> bool:
    """True when the finite entries of ``grad`` equal ``saved`` bitwise (the injected one is skipped)."""
    grad, saved = _local(grad), _local(saved)
    finite = torch.isfinite(grad)
    return bool(torch.equal(grad[finite], saved[finite]))


def _inject(model: torch.nn.Module, value: float) -> None:
    """Put ``value`` into the first element of rank 0's first non-empty local gradient shard."""
    if dist.get_rank() != 0:
        return
    for p in model.parameters():
        if p.grad is None:
            continue
        local = _local(p.grad)
        if local.numel() > 0:
            local.view(-1)[0] = value
            return


def _prefetches(model: torch.nn.Module) -> list[bool]:
    """Per decoder layer: whether it prefetches the next layer's all-gather in forward."""
    if isinstance(model, torch.distributed.fsdp.FullyShardedDataParallel):
        return [model.forward_prefetch] * len(find_decoder_layers(model))
    return [bool(layer._get_fsdp_state()._states_to_forward_prefetch) for layer in find_decoder_layers(model)]


def _run_variant(rank: int, name: str) -> dict:
    strategy, fsdp_size, rank0_only, ckpt, mp, prefetch = VARIANTS[name]
    dims = ParallelDims(world_size=2, fsdp_size=fsdp_size, key_prefix="critic").build_meshes("cpu")
    model = build_sharded_model(
        _load_fn,
        dims,
        strategy,
        rank0_only_load=rank0_only,
        mixed_precision=mp,
        enable_gradient_checkpointing=ckpt,
        forward_prefetch=prefetch,
    )
    out: dict = {"initial": gather_full_params(model), "prefetches": _prefetches(model)}
    loss = _mean_nll(model, _batch()[2 * rank : 2 * rank + 2])
    loss.backward()
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss)
    out["loss"] = global_loss.item() / 2
    out["grads"] = gather_full_grads(model)
    # FSDP1 (use_orig_params) leaves grad None where this rank's piece of a parameter is empty.
    with_grad = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    out["grad_dtypes"] = {str(p.grad.dtype) for _, p in with_grad}
    if mp is not None:
        return out
    saved = {n: p.grad.clone() for n, p in with_grad}
    out["norm"] = clip_grad_norm_(model, MAX_NORM)
    out["clipped"] = gather_full_grads(model)
    optimizer = build_optimizer(model.parameters(), OPTIM)
    optimizer.step()
    out["params"] = gather_full_params(model)
    out["iter_names"] = [n for n, _ in iter_full_params(model)]
    out["full_sd_rank0"] = get_full_state_dict(model, rank0_only=True)
    out["full_sd_all"] = get_full_state_dict(model, rank0_only=False)
    # Non-finite gradients: the norm says so on every rank and the gradients are not scaled.
    for label, value in (("inf", math.inf), ("nan", math.nan)):
        for n, p in with_grad:
            p.grad.copy_(saved[n])
        _inject(model, value)
        out[f"norm_{label}"] = clip_grad_norm_(model, MAX_NORM)
        out[f"unscaled_{label}"] = all(_same_finite(p.grad, saved[n]) for n, p in with_grad)
    return out


def _worker(rank: int) -> dict:
    out = {name: _run_variant(rank, name) for name in VARIANTS}
    dims = ParallelDims(
        world_size=2, ulysses_sequence_parallel_size=2, num_attention_heads=4, num_key_value_heads=2
    )
    dims.build_meshes("cpu")
    sp_group = dims.ulysses_mesh["sp"].get_group()
    out["ulysses"] = (dims.dp_size, dims.sp_rank, dist.get_world_size(sp_group), dims.fsdp_mesh.size())
    return out


@pytest.fixture(scope="module")
def results() -> tuple[dict, list[dict]]:
    return _reference(), spawn_workers(_worker, 2)


# --------------------------------------------------------------------------- pure checks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"world_size": 4, "ulysses_sequence_parallel_size": 3},
            "critic.ulysses_sequence_parallel_size=3 must divide the world size 4",
        ),
        (
            {"world_size": 4, "fsdp_size": 3},
            "critic.model.fsdp_config.fsdp_size=3 must divide the world size 4",
        ),
        ({"world_size": 4, "fsdp_size": 0}, "critic.model.fsdp_config.fsdp_size=0 must be -1"),
        (
            {"world_size": 4, "ulysses_sequence_parallel_size": 0},
            "critic.ulysses_sequence_parallel_size=0 must be a positive",
        ),
        (
            {"world_size": 8, "ulysses_sequence_parallel_size": 4, "num_attention_heads": 6},
            "critic.ulysses_sequence_parallel_size=4 must divide the model's num_attention_heads=6",
        ),
        (
            {
                "world_size": 8,
                "ulysses_sequence_parallel_size": 4,
                "num_attention_heads": 12,
                "num_key_value_heads": 6,
            },
            "critic.ulysses_sequence_parallel_size=4 must divide the model's num_key_value_heads=6",
        ),
        ({"world_size": 0}, "critic.world size must be a positive integer"),
    ],
)
def test_parallel_dims_errors_name_the_key(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParallelDims(key_prefix="critic", fsdp_size_key="model.fsdp_config.fsdp_size", rank=0, **kwargs)


def test_parallel_dims_sizes_and_ranks() -> None:
    dims = ParallelDims(world_size=8, fsdp_size=4, ulysses_sequence_parallel_size=2, rank=5)
    assert (dims.fsdp_size, dims.replicate_size, dims.hybrid) == (4, 2, True)
    assert (dims.dp_size, dims.dp_rank, dims.sp_rank, dims.is_collect_rank) == (4, 2, 1, False)
    # kv heads fewer than sp are repeated, so 2 kv heads with sp 4 is valid.
    assert validate_parallel_sizes(8, -1, 4, num_attention_heads=8, num_key_value_heads=2) == 8
    with pytest.raises(RuntimeError, match="build_meshes"):
        _ = dims.fsdp_mesh


def test_mixed_precision_dtypes() -> None:
    assert mixed_precision_dtypes(None) == (torch.float32,) * 3
    section = MixedPrecisionSection(param_dtype="bf16", reduce_dtype="fp32", buffer_dtype="float16")
    assert mixed_precision_dtypes(section) == (torch.bfloat16, torch.float32, torch.float16)
    with pytest.raises(ValueError, match=r"critic.mp.param_dtype='int8' must be one of"):
        mixed_precision_dtypes(MixedPrecisionSection(param_dtype="int8"), "critic.mp")


def test_apply_fsdp_rejects_unknown_strategy() -> None:
    model = build_tiny_model(CFG)
    assert [type(m).__name__ for m in find_decoder_layers(model)] == ["Qwen2DecoderLayer"] * 2
    with pytest.raises(ValueError, match=r"actor.strategy='ddp' must be one of"):
        apply_fsdp(model, ParallelDims(world_size=1, key_prefix="actor", rank=0), strategy="ddp")


def test_clip_grad_norm_plain_module_matches_torch() -> None:
    model = build_tiny_model(CFG)
    _mean_nll(model, _batch()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    ref_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))  # float64 by hand
    norm = clip_grad_norm_(model, MAX_NORM)
    assert norm == pytest.approx(ref_norm, rel=1e-6)
    coef = MAX_NORM / (norm + 1e-6)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g * coef, rtol=1e-6, atol=0)
    next(model.parameters()).grad.view(-1)[0] = math.inf
    before = [p.grad.clone() for p in model.parameters()]
    assert clip_grad_norm_(model, MAX_NORM) == math.inf
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
    assert dict(iter_full_params(model)).keys() == dict(model.named_parameters()).keys()


def test_offload_is_a_logged_noop_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    model = build_tiny_model(CFG)
    optimizer = build_optimizer(model.parameters(), OPTIM)
    with caplog.at_level("WARNING"):
        offload_optimizer_to_cpu(optimizer)
    assert "no GPU" in caplog.text


# --------------------------------------------------------------------------- sharded vs unsharded


@pytest.mark.parametrize("name", list(VARIANTS))
def test_rank0_load_gives_every_rank_the_reference_weights(results: tuple, name: str) -> None:
    ref, ranks = results
    init = build_tiny_model(CFG).state_dict()
    for out in ranks:
        assert out[name]["initial"].keys() == ref["params"].keys()
        for key, value in out[name]["initial"].items():
            assert torch.equal(value, init[key]), (name, key)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_prefetch_is_set_as_asked(results: tuple, name: str) -> None:
    prefetch = VARIANTS[name][5]
    layers = CFG.num_hidden_layers
    expected = (
        [True] * layers if prefetch and name.startswith("fsdp1") else [prefetch] * (layers - 1) + [False]
    )
    for out in results[1]:
        assert out[name]["prefetches"] == expected


@pytest.mark.parametrize("name", list(VARIANTS))
def test_loss_and_full_grads_match_unsharded(results: tuple, name: str) -> None:
    ref, ranks = results
    bf16 = VARIANTS[name][4] is not None
    for out in ranks:
        got = out[name]
        assert got["grad_dtypes"] == {"torch.float32"}
        if bf16:
            # bf16 compute: close to fp32, but not equal (the policy really casts).
            assert got["loss"] == pytest.approx(ref["loss"], rel=2e-2)
            assert got["loss"] != ref["loss"]
            continue
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
        assert got["grads"].keys() == ref["grads"].keys()
        for key, grad in ref["grads"].items():
            torch.testing.assert_close(got["grads"][key], grad, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")


@pytest.mark.parametrize("name", [n for n, v in VARIANTS.items() if v[4] is None])
def test_clip_and_adamw_step_match_unsharded(results: tuple, name: str) -> None:
    ref, ranks = results
    for out in ranks:
        got = out[name]
        assert got["norm"] == pytest.approx(ref["norm"], rel=1e-5)
        for key, grad in ref["clipped"].items():
            torch.testing.assert_close(got["clipped"][key], grad, rtol=1e-5, atol=1e-8, msg=f"{name} {key}")
        for key, param in ref["params"].items():
            torch.testing.assert_close(got["params"][key], param, rtol=1e-5, atol=1e-6, msg=f"{name} {key}")
        assert sorted(got["iter_names"]) == sorted(ref["params"])  # FSDP1 yields unit by unit, root first


@pytest.mark.parametrize("name", [n for n, v in VARIANTS.items() if v[4] is None])
def test_non_finite_grad_norm_is_reported_on_every_rank(results: tuple, name: str) -> None:
    _, ranks = results
    # Injected on rank 0 only: sharded norms see it everywhere; a replica (fsdp_size=1) learns of it
    # through clip_grad_norm_'s agreement step and returns nan.
    assert ranks[0][name]["norm_inf"] == math.inf
    assert math.isnan(ranks[0][name]["norm_nan"])
    replicated = VARIANTS[name][1] == 1
    assert math.isnan(ranks[1][name]["norm_inf"]) if replicated else ranks[1][name]["norm_inf"] == math.inf
    assert math.isnan(ranks[1][name]["norm_nan"])
    for out in ranks:
        assert out[name]["unscaled_inf"] and out[name]["unscaled_nan"]


@pytest.mark.parametrize("name", [n for n, v in VARIANTS.items() if v[4] is None])
def test_full_state_dict_rank0_and_all_ranks(results: tuple, name: str) -> None:
    ref, ranks = results
    assert ranks[1][name]["full_sd_rank0"] == {}
    for sd in (ranks[0][name]["full_sd_rank0"], ranks[0][name]["full_sd_all"], ranks[1][name]["full_sd_all"]):
        assert sd.keys() == ref["state"].keys()  # includes the tied lm_head.weight
        for key, value in ref["state"].items():
            assert value.device.type == "cpu"
            torch.testing.assert_close(sd[key], value, rtol=1e-5, atol=1e-6, msg=f"{name} {key}")


def test_ulysses_mesh_groups_both_ranks(results: tuple) -> None:
    _, ranks = results
    assert [out["ulysses"] for out in ranks] == [(1, 0, 2, 2), (1, 1, 2, 2)]


# --------------------------------------------------------------------------- GPU only


def _gpu_worker(rank: int) -> dict:
    dims = ParallelDims(world_size=1).build_meshes("cuda")
    model = build_sharded_model(
        _load_fn,
        dims,
        "fsdp2",
        mixed_precision=MixedPrecisionSection(param_dtype="bf16", reduce_dtype="fp32"),
        cpu_offload=True,
    )
    loss = _mean_nll(model, _batch().cuda())
    loss.backward()
    optimizer = build_optimizer(model.parameters(), OPTIM)
    optimizer.step()
    return {"loss": loss.item(), "device": str(next(model.parameters()).device)}


@pytest.mark.gpu
def test_fsdp2_cpu_offload_bf16_on_gpu() -> None:
    (out,) = spawn_workers(_gpu_worker, 1)
    assert out["device"] == "cpu"  # CPUOffloadPolicy keeps the sharded params on CPU
    assert out["loss"] == pytest.approx(_reference()["loss"], rel=2e-2)
