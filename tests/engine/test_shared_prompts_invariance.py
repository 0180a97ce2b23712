"""Shared-prompt packing (``model.use_shared_prompts``) in the actor's and the critic's forwards and
updates: with the samples of a prompt packed around one copy of it, the forward outputs, the loss and the
reduced gradient equal the plain padded run's (DESIGN invariant 1), alone and combined with micro-batching,
dynamic batching, gradient checkpointing, FSDP on two ranks and Ulysses SP 2 (the harness of
`test_batch_invariance`: fp32, gloo, SGD(lr=1) so the parameter change is the gradient)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from rlflow.protocol import DataProto
from tests.engine.test_batch_invariance import (
    PROMPT,
    RESPONSE,
    VOCAB,
    _assert_grads_close,
    _build,
    _role,
    _shard,
)

# prompts A (3 samples), B (3), C (2), interleaved so that the samples of a prompt are not neighbours;
# on two data-parallel ranks each half still holds two samples of one prompt
ORDER = ["A", "B", "A", "C", "B", "A", "C", "B"]
PROMPT_LENS = {"A": 6, "B": 3, "C": 4}
RESPONSE_LENS = [5, 2, 4, 1, 3, 5, 1, 2]

VARIANTS_W1 = [
    ("ref", dict(micro=8)),
    ("rmpad", dict(micro=8, rmpad=True)),
    ("shared", dict(micro=8, rmpad=True, share=True)),
    ("shared_micro4", dict(micro=4, rmpad=True, share=True)),
    ("shared_dyn", dict(dynamic=24, rmpad=True, share=True)),
    ("shared_ckpt", dict(micro=8, rmpad=True, share=True, checkpointing=True)),
]
VARIANTS_W2 = [
    ("shared_fsdp2_w2", dict(micro=4, rmpad=True, share=True)),
    ("shared_sp2", dict(micro=8, rmpad=True, share=True, sp=2)),
    ("shared_sp2_dyn", dict(dynamic=48, rmpad=True, share=True, sp=2)),
]


def _batch() -> DataProto:
    g = torch.Generator().manual_seed(0)
    prompts = {k: torch.randint(1, VOCAB, (n,), generator=g) for k, n in PROMPT_LENS.items()}
    bs = len(ORDER)
    input_ids = torch.zeros(bs, PROMPT + RESPONSE, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (name, r) in enumerate(zip(ORDER, RESPONSE_LENS)):
        p = prompts[name]
        input_ids[i, PROMPT - len(p) : PROMPT] = p
        input_ids[i, PROMPT : PROMPT + r] = torch.randint(1, VOCAB, (r,), generator=g)
        mask[i, PROMPT - len(p) : PROMPT + r] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = mask[:, PROMPT:].clone()
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": position_ids,
            "responses": input_ids[:, PROMPT:].clone(),
            "response_mask": response_mask,
            "values": torch.randn(bs, RESPONSE, generator=g) * response_mask,
            "returns": torch.randn(bs, RESPONSE, generator=g) * response_mask,
            "old_log_probs": (-4.5 + 0.3 * torch.randn(bs, RESPONSE, generator=g)) * response_mask,
            "ref_log_prob": (-4.5 + 0.3 * torch.randn(bs, RESPONSE, generator=g)) * response_mask,
            "advantages": torch.randn(bs, RESPONSE, generator=g) * response_mask,
        },
        meta_info={"global_steps": 1},
    )


def _run_one(kind: str, settings: dict, world: int) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    model, dims, groups = _build(kind, settings, world)
    if settings.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens: list[int] = []
    layer_calls: list[int] = []
    handles = [
        model.get_input_embeddings().register_forward_pre_hook(
            lambda _m, args: tokens.append(args[0].numel())
        ),
        model.model.layers[0].register_forward_pre_hook(lambda *_: layer_calls.append(1)),
    ]
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _shard(_batch(), dims.dp_rank, dims.dp_size)
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role(kind, settings, model, optim, groups, len(data), "token-mean")
    role.share_prompts = bool(settings.get("share"))  # the harness builds its roles without the option
    if kind == "critic":
        forward_out = role.compute_values(data)
        loss = role.update_critic(data)["critic/vf_loss"]
    else:
        forward_out, _ = role.compute_log_prob(data)
        loss = role.update_policy(data)["actor/pg_loss"]
    for handle in handles:
        handle.remove()
    after = gather_full_params(model)
    return {
        "loss": loss,
        "forward": forward_out,
        "grad": {k: before[k] - after[k] for k in before},
        "dp_rank": dims.dp_rank,
        "tokens": sum(tokens),
        "layer_calls": len(layer_calls),
    }


def _worker(rank: int, world: int, variants: list) -> dict:
    torch.set_num_threads(1)
    return {
        (kind, name): _run_one(kind, copy.deepcopy(settings), world)
        for kind in ("critic", "actor")
        for name, settings in variants
    }


@pytest.fixture(scope="module")
def results():
    w1 = spawn_workers(_worker, 1, args=(1, VARIANTS_W1))[0]
    w2 = spawn_workers(_worker, 2, args=(2, VARIANTS_W2))
    return w1, w2


@pytest.mark.parametrize("kind", ["critic", "actor"])
def test_shared_prompts_give_the_plain_runs_outputs_loss_and_gradient(results, kind):
    w1, w2 = results
    ref = w1[(kind, "ref")]
    assert ref["loss"] != 0.0
    for name, _ in VARIANTS_W1[1:]:
        got = w1[(kind, name)]
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5), name
        _assert_grads_close(got["grad"], ref["grad"], name)
        torch.testing.assert_close(got["forward"], ref["forward"], rtol=1e-5, atol=1e-6, msg=name)
    for name, _ in VARIANTS_W2:
        per_rank = [w[(kind, name)] for w in w2]
        by_dp = {r["dp_rank"]: r["forward"] for r in per_rank}
        forward = torch.cat([by_dp[i] for i in sorted(by_dp)])
        for r in per_rank:
            assert r["loss"] == pytest.approx(ref["loss"], rel=1e-5), name
            _assert_grads_close(r["grad"], ref["grad"], name)
        torch.testing.assert_close(forward, ref["forward"], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["critic", "actor"])
def test_the_prompt_runs_once_per_micro_batch(results, kind):
    """One forward pass (compute) plus one update pass over the whole batch: the plain packing feeds
    every valid token twice; the shared one drops the repeated prompts' tokens but keeps one last prompt
    token per repeated sample."""
    w1, _ = results
    batch = _batch().batch
    valid = int(batch["attention_mask"].sum())
    repeated = sum(PROMPT_LENS[k] - 1 for k in ORDER) - sum(n - 1 for n in PROMPT_LENS.values())
    assert w1[(kind, "rmpad")]["tokens"] == 2 * valid
    assert w1[(kind, "shared")]["tokens"] == 2 * (valid - repeated)
    # fixed micro-batches of 4 consecutive samples split the prompts' groups
    assert w1[(kind, "shared_micro4")]["tokens"] > w1[(kind, "shared")]["tokens"]
    # token-budget micro-batches keep each prompt's samples together (packed sizes 21, 12 and 7 under 24)
    assert w1[(kind, "shared_dyn")]["tokens"] == w1[(kind, "shared")]["tokens"]
    # the checkpointed variant recomputed its layers in the backward (through the same shared layout)
    assert w1[(kind, "shared_ckpt")]["layer_calls"] == w1[(kind, "shared")]["layer_calls"] + 1
