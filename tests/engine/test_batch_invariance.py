"""DESIGN invariant 1: for one mini-batch, the critic's and the actor's loss and reduced gradients do not
depend on micro-batch size, dynamic batching, remove-padding, Ulysses size, FSDP world size or FSDP1 vs
FSDP2 (fp32, real gloo process groups, tiny Qwen2 models).

Each variant runs one update with SGD(lr=1) and no effective clipping, so the parameter change is the
negative of the reduced gradient; all variants are compared against the plain single-process run.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from rlflow.protocol import DataProto

BS, PROMPT, RESPONSE, VOCAB = 8, 6, 5, 97

# (name, world size, settings)
VARIANTS_W1 = [
    ("ref", dict(micro=8)),
    ("micro1", dict(micro=1)),
    ("micro2", dict(micro=2)),
    ("dyn16", dict(dynamic=16)),
    ("dyn40", dict(dynamic=40)),
    ("rmpad", dict(micro=2, rmpad=True)),
    ("rmpad_dyn", dict(dynamic=24, rmpad=True)),
]
VARIANTS_W2 = [
    ("fsdp2_w2", dict(micro=2)),
    ("fsdp1_w2", dict(micro=4, strategy="fsdp")),
    ("fsdp2_w2_dyn", dict(dynamic=20, rmpad=True)),
    ("sp2", dict(micro=4, rmpad=True, sp=2)),
    ("sp2_dyn", dict(dynamic=32, rmpad=True, sp=2)),
]


def _qwen_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        num_labels=1,
        classifier_dropout=0.0,
        pad_token_id=0,
    )


def _batch() -> DataProto:
    """8 samples: left-padded prompts (1..6 tokens) and right-padded responses (1..5 tokens)."""
    g = torch.Generator().manual_seed(0)
    prompt_lens = [6, 3, 1, 4, 5, 2, 6, 1]
    response_lens = [5, 2, 4, 1, 3, 5, 1, 2]
    input_ids = torch.zeros(BS, PROMPT + RESPONSE, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        input_ids[i, PROMPT - p : PROMPT + r] = torch.randint(1, VOCAB, (p + r,), generator=g)
        mask[i, PROMPT - p : PROMPT + r] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = mask[:, PROMPT:].clone()
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": position_ids,
            "responses": input_ids[:, PROMPT:].clone(),
            "response_mask": response_mask,
            "values": torch.randn(BS, RESPONSE, generator=g) * response_mask,
            "returns": torch.randn(BS, RESPONSE, generator=g) * response_mask,
            "old_log_probs": (-4.5 + 0.3 * torch.randn(BS, RESPONSE, generator=g)) * response_mask,
            "ref_log_prob": (-4.5 + 0.3 * torch.randn(BS, RESPONSE, generator=g)) * response_mask,
            "advantages": torch.randn(BS, RESPONSE, generator=g) * response_mask,
        },
        meta_info={"global_steps": 1},
    )


def _build(kind: str, settings: dict, world: int):
    from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification

    from rlflow.models.attention import set_packed_attention
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import apply_fsdp

    torch.manual_seed(1)
    cfg = _qwen_config()
    cfg._attn_implementation = "sdpa"
    model = (Qwen2ForTokenClassification if kind == "critic" else Qwen2ForCausalLM)(cfg).float()
    if settings.get("rmpad"):
        set_packed_attention(model)
    sp = settings.get("sp", 1)
    dims = ParallelDims(
        world_size=world, ulysses_sequence_parallel_size=sp, num_attention_heads=4, num_key_value_heads=2
    )
    dims.build_meshes("cpu")
    model = apply_fsdp(model, dims, strategy=settings.get("strategy", "fsdp2"))
    groups = {
        "dp_group": dims.ulysses_mesh["dp"].get_group(),
        "sp_group": dims.ulysses_mesh["sp"].get_group() if sp > 1 else None,
        "sync_group": torch.distributed.group.WORLD,
    }
    return model, dims, groups


def _role(kind: str, settings: dict, model, optim, groups: dict, per_rank: int, loss_agg_mode: str):
    """The engine role with the variant's per-rank batching and the loss settings of every variant."""
    from rlflow.config import config_section
    from rlflow.engine.actor import DataParallelPPOActor
    from rlflow.engine.batching import MicroBatchSpec, UpdateSpec
    from rlflow.engine.critic import DataParallelPPOCritic

    dynamic, sp = settings.get("dynamic"), settings.get("sp", 1)
    micro = MicroBatchSpec(
        use_dynamic_bsz=dynamic is not None,
        samples_per_micro_batch=settings.get("micro"),
        max_tokens_per_rank=None if dynamic is None else dynamic * sp,
    )
    update = UpdateSpec(samples_per_mini_batch=per_rank, grad_clip=1.0e9, micro=micro)
    rmpad = bool(settings.get("rmpad"))
    if kind == "critic":
        cfg = config_section("critic", cliprange_value=0.2, loss_agg_mode=loss_agg_mode)
        return DataParallelPPOCritic(
            cfg, model, optim, update=update, forward=micro, use_remove_padding=rmpad, **groups
        )
    cfg = config_section(
        "actor_rollout_ref.actor",
        clip_ratio=0.2,
        clip_ratio_c=3.0,
        loss_agg_mode=loss_agg_mode,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
    )
    return DataParallelPPOActor(
        cfg, model, optim, update=update, log_prob=micro, temperature=0.9, use_remove_padding=rmpad, **groups
    )


def _shard(data: DataProto, dp_rank: int, dp_size: int) -> DataProto:
    per = len(data) // dp_size
    return data.slice(dp_rank * per, (dp_rank + 1) * per)


def _run_one(kind: str, settings: dict, world: int, loss_agg_mode: str) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    model, dims, groups = _build(kind, settings, world)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _shard(_batch(), dims.dp_rank, dims.dp_size)
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role(kind, settings, model, optim, groups, len(data), loss_agg_mode)
    if kind == "critic":
        forward_out = role.compute_values(data)
        metrics = role.update_critic(data)
        loss = metrics["critic/vf_loss"]
    else:
        forward_out, _ = role.compute_log_prob(data)
        metrics = role.update_policy(data)
        loss = metrics["actor/pg_loss"]
    after = gather_full_params(model)
    return {
        "loss": loss,
        "metrics": metrics,
        "forward": forward_out,
        "grad": {k: before[k] - after[k] for k in before},
        "dp_rank": dims.dp_rank,
        "dp_size": dims.dp_size,
    }


def _worker(rank: int, world: int, variants: list, modes: list) -> dict:
    torch.set_num_threads(1)
    out = {}
    for kind in ("critic", "actor"):
        for mode in modes:
            for name, settings in variants:
                out[(kind, mode, name)] = _run_one(kind, copy.deepcopy(settings), world, mode)
    return out


MODES = ["token-mean", "seq-mean-token-sum"]


@pytest.fixture(scope="module")
def results():
    w1 = spawn_workers(_worker, 1, args=(1, VARIANTS_W1, MODES))[0]
    w2 = spawn_workers(_worker, 2, args=(2, VARIANTS_W2, MODES))
    return w1, w2


def _full_forward(per_rank: list[dict]) -> torch.Tensor:
    """Concatenate the DP shards' forward outputs in sample order (one per DP rank)."""
    by_dp = {}
    for r in per_rank:
        by_dp.setdefault(r["dp_rank"], r["forward"])
    return torch.cat([by_dp[i] for i in sorted(by_dp)], dim=0)


def _assert_grads_close(got: dict, ref: dict, what: str) -> None:
    """rtol 1e-5 per element, with an absolute floor of 1e-5 × the largest gradient entry of the model
    (fp32 summation order differs between variants; near-zero entries have no relative precision)."""
    scale = max(v.abs().max().item() for v in ref.values())
    for k in ref:
        torch.testing.assert_close(
            got[k], ref[k], rtol=1e-5, atol=1e-5 * scale, msg=lambda m, k=k: f"{what} {k}: {m}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["critic", "actor"])
@pytest.mark.parametrize("mode", MODES)
def test_loss_grad_and_forward_invariant(results, kind, mode):
    w1, w2 = results
    ref = w1[(kind, mode, "ref")]
    assert ref["loss"] != 0.0
    assert any(v.abs().max() > 0 for v in ref["grad"].values())
    for name, _ in VARIANTS_W1[1:]:
        got = w1[(kind, mode, name)]
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5), name
        _assert_grads_close(got["grad"], ref["grad"], name)
        torch.testing.assert_close(got["forward"], ref["forward"], rtol=1e-5, atol=1e-6)
    for name, _ in VARIANTS_W2:
        per_rank = [w[(kind, mode, name)] for w in w2]
        for r in per_rank:
            assert r["loss"] == pytest.approx(ref["loss"], rel=1e-5), name
            _assert_grads_close(r["grad"], ref["grad"], name)  # full params identical on every rank
        torch.testing.assert_close(_full_forward(per_rank), ref["forward"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_metrics_are_averaged_not_summed(results):
    w1, _ = results
    for name, _ in VARIANTS_W1:
        m = w1[("critic", "token-mean", name)]["metrics"]
        assert 0.0 <= m["critic/vf_clipfrac"] <= 1.0
        assert m["critic/skipped_steps"] == 0.0
        assert m["critic/vpred_mean"] == pytest.approx(
            w1[("critic", "token-mean", "ref")]["metrics"]["critic/vpred_mean"], rel=1e-5
        )


def _nan_worker(rank: int) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    torch.set_num_threads(1)
    model, _dims, groups = _build("critic", {"micro": 4}, 1)
    data = _batch()
    data.batch["returns"][2, 0] = float("nan")  # one valid token of one sample
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    critic = _role("critic", {"micro": 4}, model, optim, groups, 8, "token-mean")
    metrics = critic.update_critic(data)
    after = gather_full_params(model)
    return {
        "metrics": metrics,
        "same": all(torch.equal(before[k], after[k]) for k in before),
        "state": len(optim.state),
    }


def test_nan_gradient_skips_step_and_is_reported():
    out = spawn_workers(_nan_worker, 1)[0]
    assert out["metrics"]["critic/skipped_steps"] == 1.0
    assert out["same"], "parameters changed although the step was skipped"
    assert out["state"] == 0, "optimizer state was created by a skipped step"
