"""rlflow.parallel.checkpoint: bitwise save/load of model, optimizer, scheduler and RNG; HF export.

The sharded cases run on 2 gloo ranks for FSDP2 and FSDP1; the plain-module cases run in this process
without a process group.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlflow.config.schema import OptimConfig
from rlflow.engine.optim import build_lr_scheduler, build_optimizer
from rlflow.models.tiny import TinyModelConfig, build_tiny_model, build_tiny_tokenizer
from rlflow.parallel.checkpoint import (
    COMPLETE_MARKER,
    export_hf,
    find_latest_checkpoint,
    is_checkpoint_complete,
    load_checkpoint,
    save_checkpoint,
)
from rlflow.parallel.dims import ParallelDims
from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.fsdp import build_sharded_model

CFG = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
OPTIM = OptimConfig(
    lr=1e-2, weight_decay=0.1, lr_scheduler_type="cosine", lr_warmup_steps=1, min_lr_ratio=0.1
)
TOTAL_STEPS = 10
TEXT = "hello world, 12 + 30 = 42"


def _batch(step: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(3, CFG.vocab_size, (2, 12), generator=gen)


def _train_step(model, optimizer, scheduler, step: int, rank: int) -> None:
    input_ids = _batch(step, rank)
    logits = model(input_ids=input_ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1)
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def _draws() -> list[float]:
    return [random.random(), float(np.random.rand()), torch.rand(()).item()]


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t._local_tensor if hasattr(t, "_local_tensor") else t).detach().clone()


def _snapshot(model, optimizer) -> tuple[dict, dict]:
    """This rank's parameter shards and optimizer states, keyed by parameter name (bitwise copies)."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = {n: _local(p) for n, p in model.named_parameters()}
    states = {names[id(p)]: {k: _local(v) for k, v in s.items()} for p, s in optimizer.state.items()}
    return params, states


def _bitwise_equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(_bitwise_equal(a[k], b[k]) if isinstance(a[k], dict) else torch.equal(a[k], b[k]) for k in a)


def _build(strategy: str, seed: int):
    def load_fn(device: torch.device) -> torch.nn.Module:
        with device:
            return build_tiny_model(CFG, seed=seed).train()

    dims = ParallelDims(world_size=2).build_meshes("cpu")
    model = build_sharded_model(load_fn, dims, strategy)
    optimizer = build_optimizer(model.parameters(), OPTIM)
    return model, optimizer, build_lr_scheduler(optimizer, OPTIM, TOTAL_STEPS)


def _run_strategy(rank: int, root: str, strategy: str) -> dict:
    model, optimizer, scheduler = _build(strategy, seed=0)
    for step in range(2):
        _train_step(model, optimizer, scheduler, step, rank)
    _seed_all(10 + rank)
    ckpt = f"{root}/{strategy}/global_step_2/actor"
    save_checkpoint(ckpt, model, optimizer, scheduler, extra_state={"step": 2, "rank": rank})
    expected_draws = _draws()
    saved_params, saved_states = _snapshot(model, optimizer)
    saved_sched, saved_lr = scheduler.state_dict(), optimizer.param_groups[0]["lr"]
    _train_step(model, optimizer, scheduler, 2, rank)
    continued, _ = _snapshot(model, optimizer)

    model2, optimizer2, scheduler2 = _build(strategy, seed=1)  # different weights, empty optimizer state
    _seed_all(999)
    extra = load_checkpoint(ckpt, model2, optimizer2, scheduler2)
    out = {"draws": (_draws(), expected_draws), "extra": extra}
    params, states = _snapshot(model2, optimizer2)
    out["params_equal"] = _bitwise_equal(params, saved_params)
    out["optim_equal"] = _bitwise_equal(states, saved_states)
    out["sched_equal"] = (
        scheduler2.state_dict() == saved_sched and optimizer2.param_groups[0]["lr"] == saved_lr
    )
    _train_step(model2, optimizer2, scheduler2, 2, rank)
    out["resume_equal"] = _bitwise_equal(_snapshot(model2, optimizer2)[0], continued)

    hf_dir = f"{root}/{strategy}/hf"
    export_hf(model2, build_tiny_tokenizer(), hf_dir)
    with torch.no_grad():
        out["logits"] = model2(input_ids=_batch(5, 0), use_cache=False).logits
    out["complete"] = is_checkpoint_complete(ckpt)
    return out


def _worker(rank: int, root: str) -> dict:
    out = {s: _run_strategy(rank, root, s) for s in ("fsdp2", "fsdp")}
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    root = str(tmp_path_factory.mktemp("ckpt"))
    return root, spawn_workers(_worker, 2, (root,))


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_sharded_save_load_is_bitwise(sharded: tuple, strategy: str) -> None:
    _, ranks = sharded
    for rank, out in enumerate(ranks):
        got = out[strategy]
        assert got["complete"]
        assert got["params_equal"] and got["optim_equal"] and got["sched_equal"]
        assert got["draws"][0] == got["draws"][1]  # python, numpy and torch RNG restored per rank
        assert got["extra"] == {"step": 2, "rank": rank}
        assert got["resume_equal"]  # one more step after loading == one more step without stopping
    assert ranks[0][strategy]["draws"][0] != ranks[1][strategy]["draws"][0]  # per-rank states


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_export_hf_reloads_with_same_logits(sharded: tuple, strategy: str) -> None:
    root, ranks = sharded
    hf_dir = f"{root}/{strategy}/hf"
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=_batch(5, 0), use_cache=False).logits
    torch.testing.assert_close(logits, ranks[0][strategy]["logits"], rtol=0, atol=1e-6)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    assert tokenizer.decode(tokenizer(TEXT)["input_ids"]) == TEXT
    assert tokenizer(TEXT)["input_ids"] == build_tiny_tokenizer()(TEXT)["input_ids"]
    assert find_latest_checkpoint(f"{root}/{strategy}") == f"{root}/{strategy}/global_step_2"


# --------------------------------------------------------------------------- single process


def _plain(seed: int):
    model = build_tiny_model(CFG, seed=seed).train()
    optimizer = build_optimizer(model.parameters(), OPTIM)
    return model, optimizer, build_lr_scheduler(optimizer, OPTIM, TOTAL_STEPS)


def test_plain_module_round_trip_and_export(tmp_path) -> None:
    model, optimizer, scheduler = _plain(0)
    _train_step(model, optimizer, scheduler, 0, 0)
    _seed_all(5)
    save_checkpoint(tmp_path / "ckpt", model, optimizer, scheduler, extra_state={"step": 1})
    expected = _draws()
    model2, optimizer2, scheduler2 = _plain(1)
    assert load_checkpoint(tmp_path / "ckpt", model2, optimizer2, scheduler2) == {"step": 1}
    assert _draws() == expected
    assert _bitwise_equal(_snapshot(model2, optimizer2)[0], _snapshot(model, optimizer)[0])
    assert _bitwise_equal(_snapshot(model2, optimizer2)[1], _snapshot(model, optimizer)[1])
    assert scheduler2.state_dict() == scheduler.state_dict()

    export_hf(model, None, tmp_path / "hf", dtype=torch.bfloat16)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert reloaded.dtype == torch.bfloat16
    torch.testing.assert_close(
        reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight.to(torch.bfloat16), rtol=0, atol=0
    )


def test_incomplete_or_mismatched_checkpoints_are_refused(tmp_path) -> None:
    model, optimizer, _ = _plain(0)
    (tmp_path / "partial").mkdir()
    with pytest.raises(FileNotFoundError, match="no COMPLETE marker"):
        load_checkpoint(tmp_path / "partial", model)
    ckpt = tmp_path / "global_step_3"
    save_checkpoint(ckpt, model)
    with pytest.raises(ValueError, match="saved without an optimizer state"):
        load_checkpoint(ckpt, model, optimizer)
    assert not (tmp_path / "global_step_3.tmp").exists()


def test_a_model_that_does_not_match_the_checkpoint_is_refused_naming_the_tensors(tmp_path) -> None:
    """Loading only the model (``checkpoint.load_contents=[model]``) of a checkpoint with LoRA adapters
    into a model without them would keep the base weights and drop the trained adapters without a word;
    the reverse, or another rank, fails deep in DCP. Every mismatch is a ValueError naming the tensors."""
    from rlflow.models.lora import LoRASpec, inject_lora

    def adapted(rank: int) -> torch.nn.Module:
        model, _, _ = _plain(0)
        inject_lora(model, LoRASpec(rank=rank, alpha=8.0, target_modules=("q_proj",)))
        return model

    ckpt = tmp_path / "lora"
    save_checkpoint(ckpt, adapted(4))
    with pytest.raises(
        ValueError, match=r"holds 6 tensors this model lacks \(model.layers.0.self_attn.q_proj.lora_A, "
    ):
        load_checkpoint(ckpt, _plain(0)[0])
    with pytest.raises(ValueError, match=r"LoRA adapters"):
        load_checkpoint(ckpt, _plain(0)[0])
    with pytest.raises(
        ValueError, match=r"model.layers.0.self_attn.q_proj.lora_A: \(4, 32\) saved, \(2, 32\) here"
    ):
        load_checkpoint(ckpt, adapted(2))
    plain = tmp_path / "plain"
    save_checkpoint(plain, _plain(0)[0])
    with pytest.raises(
        ValueError, match=r"lacks 6 tensors of this model \(model.layers.0.self_attn.q_proj.lora_A, "
    ):
        load_checkpoint(plain, adapted(4))
    load_checkpoint(ckpt, adapted(4))  # the same model loads


def test_another_world_size_loads_the_weights_and_skips_the_rng(tmp_path, caplog) -> None:
    """A checkpoint of 2 ranks loads on 1: the weights come back; the per-rank RNG state is skipped."""
    model, _, _ = _plain(0)
    ckpt = tmp_path / "global_step_3"
    torch.manual_seed(123)
    save_checkpoint(ckpt, model)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "world_size": 2}))
    other, _, _ = _plain(1)
    torch.manual_seed(7)
    state_before = torch.get_rng_state()
    assert load_checkpoint(ckpt, other) is None
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert torch.equal(torch.get_rng_state(), state_before)  # not restored: it belongs to other ranks
    assert "saved by 2 ranks, this run has 1" in caplog.text


def test_find_latest_checkpoint_skips_incomplete(tmp_path) -> None:
    for step, complete in ((1, True), (5, True), (7, False)):
        role = tmp_path / f"global_step_{step}" / "critic"
        (role / "model_optim").mkdir(parents=True)
        if complete:
            (role / COMPLETE_MARKER).write_text("ok\n")
    (tmp_path / "global_step_9.tmp").mkdir()
    assert find_latest_checkpoint(tmp_path) == str(tmp_path / "global_step_5")
    assert find_latest_checkpoint(tmp_path / "missing") is None


def test_loading_only_the_model_leaves_optimizer_scheduler_and_rng_fresh(tmp_path) -> None:
    """``checkpoint.load_contents=[model]`` (the worker passes optimizer/scheduler None, load_rng=False):
    the weights come back bitwise; the optimizer state, the schedule and the RNG stay as they were."""
    model, optimizer, scheduler = _plain(0)
    _train_step(model, optimizer, scheduler, 0, 0)
    save_checkpoint(tmp_path / "ckpt", model, optimizer, scheduler, extra_state={"step": 1})
    model2, optimizer2, scheduler2 = _plain(1)
    fresh_scheduler = scheduler2.state_dict()
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    assert load_checkpoint(tmp_path / "ckpt", model2, None, None, load_rng=False) == {"step": 1}
    assert _bitwise_equal(_snapshot(model2, optimizer2)[0], _snapshot(model, optimizer)[0])
    assert not optimizer2.state and scheduler2.state_dict() == fresh_scheduler
    assert torch.equal(torch.get_rng_state(), rng)
