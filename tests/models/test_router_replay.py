"""Routing replay of a mixture-of-experts model (`rlflow.models.router_replay`, verl's R2 / R3).

Against an independent router (hand-written: softmax, the forced experts' scores, renormalised) the replayed
forward and its router gradient agree; recording is layout-free (padded, packed, Ulysses SP 2 with
gradient checkpointing); the rollout records the experts the trainer's forward picks, and replaying them
reproduces the rollout's log-probs.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import torch.distributed as dist
from torch import nn

from rlflow.models.forward import forward_micro_batch
from rlflow.models.router_replay import ROUTED_EXPERTS, RouterReplay, moe_routers, place_prompt_routing
from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import PROMPT, VOCAB, _batch
from tests.tiny_moe_model import tiny_moe_config

LAYERS, TOP_K, EXPERTS = 2, 2, 4


def _moe(attn: str = "sdpa", seed: int = 3):
    from transformers import Qwen3MoeForCausalLM

    from rlflow.models.attention import set_packed_attention

    torch.manual_seed(seed)
    cfg = tiny_moe_config(VOCAB, 32, 64)
    cfg._attn_implementation = "sdpa"
    model = Qwen3MoeForCausalLM(cfg).float()
    if attn == "rlflow_packed":
        set_packed_attention(model)
    return model


def _forced_routing(bs: int, seqlen: int, seed: int = 0) -> torch.Tensor:
    """Random distinct expert pairs for every token and layer: (bs, seqlen, LAYERS, TOP_K) int16."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(bs, seqlen, LAYERS, EXPERTS, generator=g)
    return scores.topk(TOP_K, dim=-1).indices.to(torch.int16)


def _hand_written_routers(model: nn.Module, routing: torch.Tensor) -> None:
    """Replace every router's forward: softmax of its logits, the scores of ``routing``'s experts,
    renormalised (``norm_topk_prob``), as Qwen3-MoE gates them; ``routing`` (tokens, layers, k)."""
    for layer, router in enumerate(moe_routers(model)):

        def forward(hidden, router=router, layer=layer):
            hidden = hidden.reshape(-1, router.hidden_dim)
            logits = nn.functional.linear(hidden, router.weight)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            chosen = routing[:, layer].long()
            weights = probs.gather(-1, chosen)
            if router.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), chosen

        router.forward = forward


def _loss_and_router_grads(
    model: nn.Module, ids: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(input_ids=ids, use_cache=False).logits
    (logits.float() ** 2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if n.endswith("gate.weight")}
    return logits.detach(), grads


def test_replaying_a_forced_choice_is_the_hand_written_router_with_its_gradient():
    ids = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    forced = _forced_routing(3, 7).reshape(21, LAYERS, TOP_K)
    model = _moe()
    replay = RouterReplay.of(model)
    assert (replay.num_layers, replay.top_k, replay.num_experts) == (LAYERS, TOP_K, EXPERTS)
    replay.replay(forced)
    got_logits, got_grads = _loss_and_router_grads(model, ids)
    mismatched, replayed = replay.take_mismatch()
    replay.stop()
    reference = _moe()
    _hand_written_routers(reference, forced)
    ref_logits, ref_grads = _loss_and_router_grads(reference, ids)
    torch.testing.assert_close(got_logits, ref_logits, rtol=1e-5, atol=1e-6)
    assert set(got_grads) == {f"model.layers.{i}.mlp.gate.weight" for i in range(LAYERS)}
    for name, grad in ref_grads.items():
        scale = float(grad.abs().max())
        assert scale > 0, name  # the router learns through the replayed experts' scores
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5 * scale)
    assert (
        replayed == 21 * LAYERS and 0 < mismatched < replayed
    )  # random pairs: most differ from the live ones


def test_recording_then_replaying_changes_nothing_and_minus_one_keeps_the_live_choice():
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    model = _moe()
    replay = RouterReplay.of(model)
    assert RouterReplay.of(model) is replay  # installed once
    with torch.no_grad():
        live = model(input_ids=ids).logits
        with replay.record():
            recorded_logits = model(input_ids=ids).logits
            recorded = replay.pop_forward()
        assert recorded.shape == (18, LAYERS, TOP_K) and recorded.dtype == torch.int16
        assert torch.equal(recorded_logits, live)  # recording leaves the forward as it is
        replay.replay(recorded)
        assert torch.equal(model(input_ids=ids).logits, live)
        # no replayed set differs from the live router's: the record is the live choice
        assert replay.take_mismatch() == (0, 18 * LAYERS)
        replay.replay(torch.full_like(recorded, -1))
        assert torch.equal(model(input_ids=ids).logits, live)
        assert replay.take_mismatch() == (0, 0)
        forced = _forced_routing(2, 9).reshape(18, LAYERS, TOP_K)
        forced[:9] = -1  # the first row keeps its live routing, so its outputs are the live ones
        replay.replay(forced)
        mixed = model(input_ids=ids).logits
        replay.stop()
    # (to rounding: the experts now batch other tokens with row 0's; logits are O(0.1))
    torch.testing.assert_close(mixed[0], live[0], rtol=0, atol=1e-6)
    assert (mixed[1] - live[1]).abs().max() > 1e-4


def test_a_dense_model_and_a_router_that_chooses_twice_are_refused():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dense = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=32,
        )
    )
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        RouterReplay(dense)

    class TwoStageRouter(nn.Module):
        top_k, num_experts = 2, 4

        def forward(self, x):
            groups = torch.topk(x, 2, dim=-1).indices  # e.g. a group choice, then the experts
            return torch.topk(x.scatter(-1, groups, 1.0), 2, dim=-1)

    class Model(nn.Module):
        _can_record_outputs: ClassVar[dict] = {"router_logits": TwoStageRouter}

        def __init__(self):
            super().__init__()
            self.router = TwoStageRouter()

    model = Model()
    replay = RouterReplay(model)
    replay.replay(torch.zeros(3, 1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="more than one top-2 over its 4 experts"):
        model.router(torch.rand(3, 4))


def _routing_batch():
    data = _batch()
    bs, seqlen = data.batch["input_ids"].shape
    data.batch[ROUTED_EXPERTS] = _forced_routing(bs, seqlen, seed=5)
    return data.batch


def test_padded_and_packed_forwards_record_and_replay_alike():
    batch = _routing_batch()
    mask = batch["attention_mask"].bool()
    padded, packed = _moe(), _moe("rlflow_packed")
    with torch.no_grad():
        rec_padded = forward_micro_batch(padded, batch, output="log_probs", routing="record")[ROUTED_EXPERTS]
        rec_packed = forward_micro_batch(
            packed, batch, output="log_probs", use_remove_padding=True, routing="record"
        )[ROUTED_EXPERTS]
    assert torch.equal(rec_padded, rec_packed)
    assert bool((rec_padded[mask] >= 0).all()) and bool((rec_padded[~mask] == -1).all())
    outs = []
    for model, rmpad in ((padded, False), (packed, True)):
        out = forward_micro_batch(
            model, batch, output="log_probs", use_remove_padding=rmpad, routing="replay"
        )
        out["log_probs"][batch["response_mask"].bool()].sum().backward()
        RouterReplay.of(model).stop()
        outs.append((out["log_probs"], model.model.layers[1].mlp.gate.weight.grad.clone()))
    response = batch["response_mask"].bool()
    torch.testing.assert_close(outs[0][0][response], outs[1][0][response], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-6)
    live = forward_micro_batch(padded, batch, output="log_probs")["log_probs"]
    assert (live - outs[0][0])[response].abs().max() > 1e-3  # the forced routing was replayed


def _sp_worker(rank: int) -> dict:
    """FSDP2 over 2 ranks, Ulysses SP 2, gradient checkpointing (recomputation replays the same experts)."""
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import apply_fsdp
    from rlflow.parallel.sharded import gather_full_grads

    dims = ParallelDims(world_size=2, ulysses_sequence_parallel_size=2).build_meshes("cpu")
    group = dims.ulysses_mesh["sp"].get_group()
    model = apply_fsdp(_moe("rlflow_packed").train(), dims, enable_gradient_checkpointing=True)
    batch = _routing_batch()
    kw = {"output": "log_probs", "use_remove_padding": True, "sp_group": group}
    with torch.no_grad():
        recorded = forward_micro_batch(model, batch, routing="record", **kw)[ROUTED_EXPERTS]
    out = forward_micro_batch(model, batch, routing="replay", **kw)["log_probs"]
    out[batch["response_mask"].bool()].sum().backward()
    RouterReplay.of(model).stop()
    dist.barrier()
    return {"recorded": recorded, "log_probs": out.detach(), "grads": gather_full_grads(model)}


def test_ulysses_sp2_with_checkpointing_records_and_replays_as_one_process():
    results = spawn_workers(_sp_worker, 2)
    batch = _routing_batch()
    model = _moe("rlflow_packed").train()
    with torch.no_grad():
        recorded = forward_micro_batch(
            model, batch, output="log_probs", use_remove_padding=True, routing="record"
        )
    out = forward_micro_batch(model, batch, output="log_probs", use_remove_padding=True, routing="replay")
    out["log_probs"][batch["response_mask"].bool()].sum().backward()
    RouterReplay.of(model).stop()
    grads = {n: p.grad for n, p in model.named_parameters()}
    response = batch["response_mask"].bool()
    for res in results:
        assert torch.equal(res["recorded"], recorded[ROUTED_EXPERTS])
        torch.testing.assert_close(
            res["log_probs"][response], out["log_probs"][response], rtol=1e-5, atol=1e-5
        )
    for name in ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.down_proj"):
        summed = sum(res["grads"][name] for res in results) / 2  # FSDP's mean over the SP ranks
        torch.testing.assert_close(summed, grads[name], rtol=1e-4, atol=1e-6)


def test_the_rollout_records_the_routing_the_trainer_recomputes_and_its_replay_gives_its_log_probs():
    from rlflow.config import config_section
    from rlflow.protocol import DataProto
    from rlflow.rollout.hf import HFRollout

    model = _moe()
    config = config_section(
        "actor_rollout_ref.rollout",
        n=2,
        response_length=6,
        prompt_length=PROMPT,
        calculate_log_probs=True,
        enable_rollout_routing_replay=True,
    )
    data = _batch()[1:6]  # prompts of 3, 1, 4, 5, 2 tokens: every row shares a left-padding column
    prompts = DataProto.from_dict(
        tensors={k: data.batch[k][:, :PROMPT] for k in ("input_ids", "attention_mask", "position_ids")},
        meta_info={"eos_token_id": [5, 7, 11, 13], "pad_token_id": 0, "global_steps": 1},
    )
    rollout = HFRollout(model, config, dp_rank=0)
    prompts.meta_info["validate"] = True  # validation batches never reach the update: nothing recorded
    assert ROUTED_EXPERTS not in rollout.generate_sequences(prompts).batch.keys()
    prompts.meta_info["validate"] = False
    out = rollout.generate_sequences(prompts).batch
    routed, mask = out[ROUTED_EXPERTS], out["attention_mask"].bool()
    assert routed.shape == (10, PROMPT + 6, LAYERS, TOP_K)
    # recorded: every valid token but each row's last one (sampled, never fed back); -1 elsewhere
    last = mask.shape[1] - 1 - mask.flip(-1).long().argmax(-1)
    fed = mask.clone()
    fed[torch.arange(10), last] = False
    assert bool(out["response_mask"].sum(-1).lt(6).any())  # some rows ended at an EOS
    assert torch.equal(routed[..., 0, 0] >= 0, fed)
    with torch.no_grad():
        trainer = forward_micro_batch(model, out, output="log_probs", routing="record")[ROUTED_EXPERTS]
        assert torch.equal(trainer[fed], routed[fed])
        replayed = forward_micro_batch(model, out, output="log_probs", routing="replay")["log_probs"]
        RouterReplay.of(model).stop()
    response = out["response_mask"].bool()
    torch.testing.assert_close(replayed[response], out["rollout_log_probs"][response], rtol=1e-5, atol=1e-5)


def test_an_engines_per_sequence_routing_is_laid_out_as_the_batch():
    rows = [torch.arange(12, dtype=torch.int16).reshape(3, 2, 2), None, torch.ones(9, 2, 2)]
    out = place_prompt_routing(
        rows, prompt_lengths=[2, 1, 3], prompt_width=4, response_length=3, num_layers=2, top_k=2
    )
    assert out.shape == (3, 7, 2, 2) and out.dtype == torch.int16
    assert (
        torch.equal(out[0, 2:5], rows[0])
        and bool((out[0, :2] == -1).all())
        and bool((out[0, 5:] == -1).all())
    )
    assert bool((out[1] == -1).all())
    assert bool((out[2, 1:] == 1).all()) and bool((out[2, 0] == -1).all())  # 9 tokens: the 6 that fit
    with pytest.raises(ValueError, match="row 0 have shape"):
        place_prompt_routing([torch.zeros(3, 2)], [1], 2, 2, 2, 2)
